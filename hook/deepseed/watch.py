"""Step timing for a torch model: the Watcher.

Every measurement is a CUDA event recorded on the current stream; events
are kept in a queue and read once ``query()`` says they completed, a step
or two later. Nothing here calls torch.cuda.synchronize() or ``.item()``
while training runs.

Per-rank truth under synchronous training (docs/ranks.md): each step also
carries ``sync_ns``, when the rank reached the synchronisation point at
the end of its backward (the device's end-of-backward event on the host's
wall clock), ``sync_wait_ms``, how long the device then waited in the
gradient collective before the optimizer could start, and
``input_wait_ms``, the host time between steps that the device was still
busy with the previous step (a blocking input copy queued behind the
all-reduce waits exactly that long); ``data_ms`` is what remains: time
getting the batch that the device waited for. Device events map to the
wall clock through an anchor taken once, at the first step, with one
synchronize; every later event the host records refines it (the device
cannot run an event before the host records it), so the clocks' drift
does not accumulate.

A *step* opens at the first training forward of the model after the last
step closed, and closes after the optimizer's step (or, without an
optimizer, when the next training forward begins after a backward). Several
forward/backward passes inside one step (gradient accumulation) add up.

The Watcher's hooks and step state are here; the layer profiler is in
layers.py, the phases a framework marks (manual=True, the pipeline engine)
in phases.py, and the read-back of finished steps in readback.py.
"""

from __future__ import annotations

import collections
import logging
import time

import torch

from .layers import BLOCK_LIST_NAMES, EMBED_NAMES, ENC_DEC_NAMES, HEAD_NAMES, WRAPPER_PARTS  # noqa: F401
from . import comm
from .env import env_period, is_set
from .layers import LayerProfiler, _clean_name, find_layers
from .phases import PhaseMarks, phase_offset
from .readback import ANCHOR_KEEP, MAX_PENDING, StepReader, WindowMax, _Slot  # noqa: F401
from .torch_utils import (EventPool, Fetcher, _graph_task_id, _peak_memory_gb, _queue_callback, _torch_versions,
                          fused_grad_norm, in_backward, iter_tensors, output_loss)

log = logging.getLogger("deepseed")

# The gradient norm reads every gradient; by default it is taken every
# GRAD_NORM_EVERY steps (DEEPSEED_GRAD_NORM_EVERY, grad_norm_every=).
GRAD_NORM_EVERY = 10
# Forward, backward and optimizer times (and the synchronisation fields)
# take six more events and two autograd callbacks a step; a single process
# measures them every PHASE_EVERY steps (DEEPSEED_PHASE_EVERY,
# phase_every=), a distributed run every step (the per-rank truth compares
# the ranks' steps one by one). Step time, data time, loss, lr and
# throughput come every step. The timed steps fall half way between the
# layer steps (phase_offset), so that the layer profiler's own cost never
# lands in the phase times a breakdown averages.
PHASE_EVERY = 10
# In a single process, a sampled step (layers, phases, gradient norm) at its
# default period also comes no sooner than SAMPLE_MIN_MS after the previous
# one of its kind (DEEPSEED_SAMPLE_MIN_MS, sample_min_ms=; 0 turns the floor
# off; a period the caller set is kept exactly): each
# costs the training thread from about a hundred µs (phases, norm) to a
# millisecond or more (layers), which on steps of a few milliseconds would
# be most of what the hook costs. Steps of 25 ms or more keep their periods.
SAMPLE_MIN_MS = 250
# The forward's end hook reads the loss a model returns and, on phase steps,
# marks the forward's end and the backward's start. When the first
# LOSS_PROBE_STEPS steps' outputs hold no loss, it is attached on phase
# steps only: a module with a hook of each kind costs every call more.
LOSS_PROBE_STEPS = 8
MEM_EVERY_S = 1.0
FLUSH_PENDING = 16
_grad_enabled = torch.is_grad_enabled
_now = time.perf_counter  # the host clock of data time and the sampling floor


def _param_count(model):
    from .integrations.torch_dist import param_count
    return param_count(model)


class Watcher(PhaseMarks, StepReader):
    """Hooks on a model and its optimizer that time every step; created by
    :meth:`deepseed.Run.watch`.

    With ``manual=True`` nothing is hooked on the model's root or the
    optimizer: a framework callback marks the step's phases itself
    (:meth:`step_begin`, :meth:`forward_end`, :meth:`backward_begin`,
    :meth:`backward_end`, :meth:`optimizer_begin`, :meth:`step_end`), as the
    Lightning callback does.

    Those phase marks and the pipeline engine's hooks are in
    :class:`~deepseed.phases.PhaseMarks`, the read-back of finished steps in
    :class:`~deepseed.readback.StepReader`; both are base classes.
    """

    def __init__(self, run, model, optimizer=None, layers=None, layer_every=10, grad_norm="auto", batch_size=None,
                 tokens_per_sample=None, adapter=None, grad_norm_every=None, manual=False, phase_every=None,
                 background_read=None, sample_min_ms=None, layer_every_set=True):
        self.run = run
        self.engine = None
        self.adapter = adapter
        root = model
        if adapter is None and _is_deepspeed_engine(model):
            from .integrations.deepspeed import EngineAdapter
            self.adapter = EngineAdapter(model)
        if self.adapter is not None:
            self.engine = model
            root = self.adapter.module
            optimizer = None  # the adapter reports the engine's steps
        self.root = root
        self.optimizer = optimizer
        self.manual = bool(manual)
        self.batch_size = batch_size
        self.tokens_per_sample = tokens_per_sample
        self.layer_every = int(layer_every or 0)
        self.grad_norm = grad_norm
        norm_set = grad_norm_every is not None or is_set("DEEPSEED_GRAD_NORM_EVERY")
        if grad_norm_every is None:
            grad_norm_every = env_period("DEEPSEED_GRAD_NORM_EVERY", GRAD_NORM_EVERY)
        self.grad_norm_every = max(0, int(grad_norm_every or 0))
        phase_set = phase_every is not None or is_set("DEEPSEED_PHASE_EVERY")
        if phase_every is None:
            phase_every = env_period("DEEPSEED_PHASE_EVERY", 1 if run.world_size > 1 else PHASE_EVERY)
        self.phase_every = max(1, int(phase_every))
        if sample_min_ms is None:
            sample_min_ms = env_period("DEEPSEED_SAMPLE_MIN_MS", SAMPLE_MIN_MS)
        # A distributed run's ranks sample the same steps: by period alone.
        self.sample_min_s = max(0.0, float(sample_min_ms or 0)) / 1000.0 if run.world_size <= 1 else 0.0
        # A period the caller chose is kept exactly: the floor spaces the
        # default ones only.
        self.layer_floor = 0.0 if layer_every_set else self.sample_min_s
        self.phase_floor = 0.0 if phase_set else self.sample_min_s
        self.norm_floor = 0.0 if norm_set else self.sample_min_s
        self.layer_at = self.phase_at = self.norm_at = -1e9
        self.user_grad_norm = False
        self.sharded_grads = False
        self.closed_flag = False

        dev = None
        for p in root.parameters():
            dev = p.device
            break
        self.cuda = bool(dev is not None and dev.type == "cuda" and torch.cuda.is_available())
        self.device = dev
        self.dev_index = None
        if self.cuda:
            self.dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
        self.pool = EventPool(self.cuda)
        self.fetch = Fetcher()
        self.params = [p for p in root.parameters() if p.requires_grad]

        self.cur = None
        self.pending = collections.deque()
        self.last_close_host = None
        self.meta_checked = False
        # Peak memory is a running maximum; reading it costs ~100 µs, so it
        # is read at most every MEM_EVERY_S seconds and carried in between.
        self.mem = None
        self.mem_read_at = -1e9
        # Device-to-wall-clock anchor: an event and the candidate wall
        # times (ns) of it, each a lower bound; the newest ANCHOR_KEEP count.
        self.anchor = None
        self.anchor_walls = WindowMax(ANCHOR_KEEP)
        self.last_end_wall_ns = None  # the previous emitted step's end, wall clock
        self.last_close_ns = None

        inner = root
        if type(root).__name__ in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            inner = root.module
        if layers is None:
            rows = find_layers(inner)
        else:
            lookup = dict(inner.named_modules())
            lookup.update({_clean_name(k): v for k, v in inner.named_modules()})
            rows = [(n, lookup[n]) for n in layers if n in lookup]
            missing = [n for n in layers if n not in lookup]
            if missing:
                log.warning("deepseed: watch: no module named %s", ", ".join(missing[:5]))
        self.profiler = LayerProfiler(self, rows) if rows and self.layer_every > 0 else None
        self.layer_names = [n for n, _ in rows]

        self.handles = []
        self.post_handle = None
        self.loss_seen = False
        self.loss_probe = LOSS_PROBE_STEPS
        if not self.manual:
            first = {"prepend": True} if comm.opens_before(root) else {}
            self.handles = [root.register_forward_pre_hook(self._fwd_pre, with_kwargs=True, **first)]
            self._attach_post()
        if optimizer is not None and not self.manual:
            try:
                self.handles.append(optimizer.register_step_pre_hook(self._opt_pre))
                self.handles.append(optimizer.register_step_post_hook(self._opt_post))
            except AttributeError:
                log.warning("deepseed: watch: optimizer %s has no step hooks; steps end at the next forward",
                            type(optimizer).__name__)
                self.optimizer = None
        if self.adapter is not None:
            self.adapter.attach(self)
        # Sampling needs the optimizer's hooks to close a step: without them
        # a step ends at the forward after its backward, which only the
        # backward's hooks see. Frameworks that mark phases time them all.
        if self.manual or self.adapter is not None or self.optimizer is None:
            self.phase_every = 1
        self.phase_off = phase_offset(self.phase_every, self.layer_every if self.profiler is not None else 0)
        self._describe(inner)
        # Collectives and the compute stream's waits on them (comm.py).
        self.comm = comm.attach(self)
        # Read-back leaves the training thread where events complete on
        # their own (a GPU's); host timers complete at once.
        if self.cuda if background_read is None else background_read:
            self._start_reader()

    def _describe(self, inner):
        run = self.run
        meta = {}
        m = run.meta
        # The root, not the inner module: an FSDP root keeps its own
        # FlatParameter outside the module it wraps.
        n = _param_count(self.root)
        meta["params"] = n
        cfg = getattr(inner, "config", None)
        name = getattr(cfg, "_name_or_path", None) or getattr(inner, "name_or_path", None)
        if not m.get("model"):
            meta["model"] = str(name or type(inner).__name__)
        if self.cuda:
            try:
                idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
                props = torch.cuda.get_device_properties(idx)
                meta["gpu"] = props.name
                meta["gpu_memory_total_gb"] = round(props.total_memory / 1e9, 3)
            except Exception:
                pass
        if not m.get("precision"):
            dt = getattr(next(iter(self.params), None), "dtype", None)
            if dt in (torch.float16, torch.bfloat16):
                meta["precision"] = "fp16" if dt == torch.float16 else "bf16"
        if self.adapter is not None:
            meta.update(self.adapter.meta())
        else:
            try:
                from .integrations.torch_dist import describe
                meta.update(describe(self.root, self.optimizer))
            except Exception:
                pass
        meta.setdefault("framework", m.get("framework") or "torch")
        try:
            from .integrations.torch_dist import grads_sharded
            self.sharded_grads = self.adapter is None and grads_sharded(meta)
        except Exception:
            self.sharded_grads = False
        meta["versions"] = dict(m.get("versions") or {}, **_torch_versions())
        # The config's layers and width give the attention FLOPs; the
        # sequence length comes with the first batch (or tokens_per_sample).
        run._flops_cfg = cfg
        if self.tokens_per_sample and not m.get("seq_len"):
            meta["seq_len"] = int(self.tokens_per_sample)
        run.update_meta(**meta)
        if run.meta.get("precision"):
            self._log_memory()

    def _check_precision(self):
        # Autocast is only visible once the first forward runs.
        self.meta_checked = True
        if self.run.meta.get("precision"):
            return
        try:
            try:
                on = torch.is_autocast_enabled("cuda")
                dt = torch.get_autocast_dtype("cuda")
            except TypeError:  # torch < 2.4
                on = torch.is_autocast_enabled()
                dt = torch.get_autocast_gpu_dtype()
            if self.cuda:
                self.run.update_meta(precision=("bf16" if dt == torch.bfloat16 else "fp16") if on else "fp32")
                self._log_memory()
        except Exception:
            pass

    def _log_memory(self):
        # DeepSpeed keeps 16-bit weights beside an fp32 master copy (the
        # ZeRO paper's arithmetic). Under torch autocast the weights and
        # gradients stay fp32 and Adam holds only its two moments, so the
        # prediction follows the weights' own dtype.
        if self.adapter is not None:
            self.run.log_memory()
            return
        dt = getattr(next(iter(self.params), None), "dtype", None)
        if dt in (torch.float16, torch.bfloat16):
            self.run.log_memory()
        else:
            self.run.log_memory(precision="fp32")

    # ---- hooks ----------------------------------------------------------------
    #
    # These run on the training thread every step: each one records an event
    # on the stream looked up at the step's start and keeps references;
    # nothing is read from the device here.

    def _fwd_pre(self, module, args, kwargs):
        try:
            if not module.training or not _grad_enabled() or (_graph_task_id is not None and _graph_task_id() != -1):
                return
            cur = self.cur
            if cur is not None:
                if cur.bwd:
                    self._end_open_backward(cur)
                    if self.optimizer is None and self.adapter is None:
                        self._close(self.pool.record())
                        cur = None
            if cur is None:
                cur = self._open()
                if cur.phases:
                    cur.fwd.append([cur.ev_start, None])
            elif cur.phases:
                cur.fwd.append([self.pool.record(), None])
            cur.fwd_open = True
            self._count_batch(cur, args, kwargs)
        except Exception as e:
            self.run._warn_once("fwdpre", "deepseed: forward hook: %s", e)

    def _fwd_post(self, module, args, out):
        try:
            cur = self.cur
            if cur is None or not cur.fwd_open or in_backward():
                return
            cur.fwd_open = False
            loss = output_loss(out)
            if loss is not None:
                cur.losses.append(self.fetch.add(loss))
                self.loss_seen = True
            if not cur.phases:
                return
            cur.fwd[-1][1] = self.pool.record()
            # The backward begins at the loss when the model computes it, else
            # at its first output (a loss computed outside the model begins
            # its backward there too).
            if loss is not None and loss.requires_grad:
                loss.register_hook(self._bwd_start)
                return
            for t in iter_tensors(out):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._bwd_start)
                    break
        except Exception as e:
            self.run._warn_once("fwdpost", "deepseed: forward hook: %s", e)

    def _attach_post(self):
        if self.post_handle is None:
            self.post_handle = self.root.register_forward_hook(self._fwd_post)

    def _detach_post(self):
        h, self.post_handle = self.post_handle, None
        if h is not None:
            try:
                h.remove()
            except Exception:
                pass

    def _bwd_start(self, grad=None):
        cur = self.cur
        if cur is None or cur.bwd_open:
            return
        cur.bwd_open = True
        cur.bwd.append([self.pool.record(), None])
        if _queue_callback is not None and not self.manual:
            try:
                _queue_callback(self._bwd_end)
            except Exception:
                pass

    def _bwd_end(self):
        if not self._end_backward():
            return
        # Queued from inside a callback, this runs after the callbacks
        # queued during the backward: DistributedDataParallel's, which
        # waits for (gloo) or makes the stream wait for (NCCL) the
        # gradient all-reduce. Its event marks the end of the collective.
        if _queue_callback is not None:
            try:
                _queue_callback(self._sync_done)
            except Exception:
                pass

    def _end_backward(self):
        """Marks the end of the open backward (the rank's arrival at the
        synchronisation point); False when none was open."""
        cur = self.cur
        if cur is None or not cur.bwd or cur.bwd[-1][1] is not None:
            return False
        cur.bwd[-1][1] = self.pool.record()
        cur.bwd_open = False
        cur.host_arrive_ns = time.time_ns()
        if cur.sync_end is not None:  # an earlier micro-batch's
            self.pool.put(cur.sync_end)
        cur.sync_end = None
        cur.host_release_ns = None
        return True

    def _sync_done(self):
        cur = self.cur
        if cur is None or cur.sync_end is not None or not cur.bwd:
            return
        cur.sync_end = self.pool.record()
        cur.host_release_ns = time.time_ns()

    def _end_open_backward(self, cur):
        if cur.bwd and cur.bwd[-1][1] is None:
            cur.bwd[-1][1] = self.pool.record()
        cur.bwd_open = False

    def _opt_pre(self, opt, args, kwargs):
        try:
            cur = self.cur
            if cur is None:
                return
            if not cur.phases:
                self._grad_norm(cur)
                return
            self._end_open_backward(cur)
            if cur.bwd and cur.sync_end is None:
                self._sync_done()
            self._grad_norm(cur)
            cur.opt = [self.pool.record(), None]
        except Exception as e:
            self.run._warn_once("optpre", "deepseed: optimizer hook: %s", e)

    def _grad_norm(self, cur):
        # The norm's kernels go before the optimizer's start event so that
        # optimizer time is the optimizer's alone. One multi-tensor norm over
        # every gradient costs a read of all of them (about 0.5 ms of an H100
        # for BERT-large) and ~100 µs of launches, so it runs every
        # grad_norm_every steps.
        if (self.adapter is not None or self.grad_norm == "off" or self.user_grad_norm
                or not self.grad_norm_every or cur.step % self.grad_norm_every):
            return
        if self.grad_norm_every > 1 and self.norm_floor:
            now = _now()
            if now - self.norm_at < self.norm_floor:
                return
            self.norm_at = now
        gn = fused_grad_norm(self.params)
        if gn is not None:
            # Sharded gradients (FSDP) give this rank's part of the norm only.
            # Summing it over the ranks would take a collective inside the
            # hook, which hangs a job whose ranks do not all watch; the
            # model's norm is what model.clip_grad_norm_() returns, passed as
            # grad_norm=.
            cur.boxes.append(("grad_norm_shard" if self.sharded_grads else "grad_norm", self.fetch.add(gn)))

    def _opt_post(self, opt, args, kwargs):
        try:
            cur = self.cur
            if cur is None:
                return
            ev = self.pool.record()
            if cur.opt is not None:
                cur.opt[1] = ev
            self._read_lr(cur, opt or self.optimizer)
            if self.adapter is not None:
                self.adapter.after_step(cur)
            self._close(ev)
        except Exception as e:
            self.run._warn_once("optpost", "deepseed: optimizer hook: %s", e)

    def _read_lr(self, cur, opt):
        if opt is None or "lr" in cur.ukeys:
            return
        try:
            lr = opt.param_groups[0]["lr"]
        except Exception:
            return
        if isinstance(lr, torch.Tensor):
            cur.boxes.append(("lr", self.fetch.add(lr)))
        elif lr is not None:
            cur.extra["lr"] = lr

    # ---- steps ----------------------------------------------------------------

    def _open(self):
        run = self.run
        if not self.meta_checked:
            self._check_precision()
        now = _now()
        cur = _Slot(run._next_step)
        run._next_step += 1
        if self.last_close_host is not None:
            cur.data_ms = (now - self.last_close_host) * 1000.0
        self.pool.use_current_stream(self.dev_index)
        if self.cuda and self.anchor is None:
            self._take_anchor()
        cur.open_ns = time.time_ns()
        cur.ev_start = self.pool.record()
        if (self.profiler is not None and cur.step % self.layer_every == 0
                and (self.layer_every == 1 or now - self.layer_at >= self.layer_floor)):
            self.layer_at = now
            cur.layer = self.profiler.arm()
        if self.phase_every == 1:
            cur.phases = True
        else:
            # A layer step is no phase step unless every step is a layer step.
            cur.phases = (cur.step % self.phase_every == self.phase_off and (cur.layer is None or self.layer_every == 1)
                          and now - self.phase_at >= self.phase_floor)
            if cur.phases:
                self.phase_at = now
        if cur.phases and self.post_handle is None and not self.manual:
            self._attach_post()  # this step's forward is timed
        if self.pending:
            self.pending[-1].nxt_start = cur.ev_start
        self.cur = cur
        if self.pending and self.reader is None:
            self.poll()
        return cur

    def _close(self, ev_end):
        cur = self.cur
        if cur is None:
            return
        self._end_open_backward(cur)
        cur.ev_end = ev_end
        cur.closed = True
        now = _now()
        cur.close_ns = time.time_ns()
        self.last_close_host = now
        if cur.layer is not None:
            self.profiler.disarm()
        if self.cuda and now - self.mem_read_at >= MEM_EVERY_S:
            self.mem_read_at = now
            self.mem = _peak_memory_gb(self.dev_index)
        extra = cur.extra
        parts = extra.pop("_loss_parts", None) if extra else None
        if parts and "loss" not in cur.ukeys:
            cur.boxes.append(("loss+", parts))
        elif cur.losses and "loss" not in cur.ukeys:
            cur.boxes.append(("loss", cur.losses))
        if extra:
            for k in [k for k, v in extra.items() if isinstance(v, torch.Tensor)]:
                cur.boxes.append((k, self.fetch.add(extra.pop(k))))
        self.pending.append(cur)
        self.cur = None
        if self.post_handle is not None and not self.loss_seen and self.phase_every > 1:
            if self.loss_probe > 0:
                self.loss_probe -= 1
            else:
                self._detach_post()  # until the next phase step
        # Values leave in batches, but before the steps waiting on them
        # would pass the stale guard.
        if self.fetch.due(now) or (len(self.pending) >= FLUSH_PENDING and self.fetch.waiting):
            self.fetch.flush()

    def attach(self, step, fields):
        """Joins values the user logged to the step in flight or the one just
        closed. Returns False when there is no such step."""
        slot = self.cur
        if slot is None and self.pending:
            last = self.pending[-1]
            if step is None or not last.user_step or step == last.step:
                slot = last
        if slot is None:
            return False
        if step is not None:
            slot.step = step
            slot.user_step = True
            self.run._next_step = step + 1
        if "grad_norm" in fields:
            self.user_grad_norm = True
        if slot.user is None:
            slot.user = {}
            slot.ukeys = set()
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                slot.boxes.append((k, self.fetch.add(v)))
            else:
                slot.user[k] = v
            slot.ukeys.add(k)
        if slot.closed and self.fetch.due(time.perf_counter()):
            self.fetch.flush()
        return True

    def _count_batch(self, cur, args, kwargs):
        bs = self.batch_size
        if bs is not None:
            cur.samples += int(bs)
            if self.tokens_per_sample:
                cur.tokens += int(bs) * int(self.tokens_per_sample)
            return
        t = kwargs.get("input_ids") if kwargs else None
        if t is None and args and isinstance(args[0], torch.Tensor):
            t = args[0]
        if t is None:
            for x in iter_tensors(args):
                t = x
                break
        if t is None and kwargs:
            for x in iter_tensors(kwargs):
                t = x
                break
        if t is None:
            return
        shape = t.shape
        if not shape:
            return
        n = shape[0]
        cur.samples += n
        if len(shape) == 2 and not t.is_floating_point():
            cur.tokens += n * shape[1]
            if not self.run.meta.get("seq_len"):
                self.run.update_meta(seq_len=int(shape[1]))
        elif self.tokens_per_sample:
            cur.tokens += n * int(self.tokens_per_sample)

    # ---- end ----------------------------------------------------------------

    def close(self, wait=True):
        """Removes the hooks and emits what is still pending (waiting for
        the device only when wait is True: at the end of a run)."""
        if self.closed_flag:
            return
        self.closed_flag = True
        self._stop_reader(wait)
        if self.comm is not None:
            self.comm.close()
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self._detach_post()
        if self.adapter is not None:
            self.adapter.detach()
        if self.cur is not None:
            if self.cur.fwd or not self.cur.phases:
                self._close(self.pool.record())
            else:
                self.cur = None
        if self.profiler is not None:
            self.profiler.disarm()
        if wait:
            if self.reader is None:
                self.poll(wait=True)
            elif self._read_lock.acquire(timeout=2.0):
                # The reader holds it only while it builds one step.
                try:
                    self.poll(wait=True)
                finally:
                    self._read_lock.release()
            else:  # pragma: no cover - a reader stuck inside the device
                self.run._warn_once("readerstuck", "deepseed: %d steps not read at close", len(self.pending))
        else:
            self.pending.clear()
        with self.run._lock:
            self.send_steps()


def _is_deepspeed_engine(obj):
    return any(c.__name__ in ("DeepSpeedEngine", "PipelineEngine", "DeepSpeedHybridEngine")
               for c in type(obj).__mro__) or (hasattr(obj, "is_gradient_accumulation_boundary")
                                               and hasattr(obj, "module") and hasattr(obj, "backward"))
