"""Step timing and the layer profiler for a torch model.

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
"""

from __future__ import annotations

import collections
import logging
import math
import time

import torch

from .run import round_ms
from .torch_utils import EventPool, LazyValues, first_grad_tensor, fused_grad_norm, iter_tensors, output_loss

log = logging.getLogger("deepseed")

BLOCK_LIST_NAMES = {"layer", "layers", "h", "block", "blocks", "encoder_layers", "decoder_layers"}
ENC_DEC_NAMES = {"encoder", "decoder"}
EMBED_NAMES = {"embeddings", "embedding", "embed", "wte", "wpe", "embed_tokens", "tok_embeddings", "word_embeddings",
               "embed_positions", "patch_embed"}
HEAD_NAMES = {"classifier", "lm_head", "head", "score", "qa_outputs", "cls", "output_layer", "heads"}
WRAPPER_PARTS = {"module", "_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"}
MAX_PENDING = 64
ANCHOR_KEEP = 256

try:
    _graph_task_id = torch._C._current_graph_task_id
except AttributeError:  # pragma: no cover - old torch
    _graph_task_id = None

try:
    _queue_callback = torch.autograd.Variable._execution_engine.queue_callback
except AttributeError:  # pragma: no cover
    _queue_callback = None


def in_backward():
    """True inside an autograd backward pass (activation recomputation
    runs forwards there, which must not count as forward time)."""
    return _graph_task_id is not None and _graph_task_id() != -1


def _clean_name(name):
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def find_layers(model):
    """(row name, module) pairs in model order: embeddings, each
    transformer block, head. BERT-large gives the seed's 26 rows:
    embeddings, encoder.0 … encoder.23, classifier."""
    named = list(model.named_modules())
    lists = []
    for name, m in named:
        if not isinstance(m, torch.nn.ModuleList) or len(m) < 2 or len({type(c) for c in m}) != 1:
            continue
        parts = _clean_name(name).split(".")
        last = parts[-1]
        parent = parts[-2] if len(parts) > 1 else ""
        if last in BLOCK_LIST_NAMES or parent in ENC_DEC_NAMES:
            if not any(name.startswith(n + ".") for n, _ in lists):
                lists.append((name, m))
    if not lists:
        best = None
        for name, m in named:
            if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
                n = sum(p.numel() for p in m.parameters())
                if best is None or n > best[0]:
                    best = (n, name, m)
        if best is not None:
            lists.append((best[1], best[2]))
    list_names = {n for n, _ in lists}
    chosen = []
    rows = []

    def inside(name):
        return any(name.startswith(c + ".") for c in chosen)

    for name, m in named:
        if not name or inside(name):
            continue
        parts = _clean_name(name).split(".")
        last = parts[-1] if parts else ""
        if name in list_names:
            parent = parts[-2] if len(parts) > 1 else ""
            prefix = parent if (last in BLOCK_LIST_NAMES and parent in ENC_DEC_NAMES) else last
            for i, c in enumerate(m):
                rows.append(["%s.%d" % (prefix, i), c, _clean_name(name) + ".%d" % i])
            chosen.append(name)
        elif last in EMBED_NAMES or (isinstance(m, torch.nn.Embedding) and not rows):
            rows.append([last, m, _clean_name(name)])
            chosen.append(name)
        elif last in HEAD_NAMES and rows:
            rows.append([last, m, _clean_name(name)])
            chosen.append(name)
    seen = collections.Counter(r[0] for r in rows)
    return [(r[2] if seen[r[0]] > 1 else r[0], r[1]) for r in rows]


def _param_count(model):
    from .integrations.torch_dist import param_count
    return param_count(model)


class _Slot:
    __slots__ = ("step", "ev_start", "fwd", "bwd", "opt", "ev_end", "samples", "tokens", "user", "user_step",
                 "lazies", "closed", "data_ms", "host_open", "host_close", "layer", "mem_peak", "mem_resv",
                 "losses", "extra", "bwd_open", "ulazies", "ukeys", "open_ns", "close_ns", "sync_end",
                 "host_arrive_ns", "host_release_ns")

    def __init__(self, step):
        self.step = step
        self.ev_start = None
        self.fwd = []  # [start, end] pairs
        self.bwd = []
        self.opt = None
        self.ev_end = None
        self.samples = 0
        self.tokens = 0
        self.user = {}
        self.user_step = False
        self.lazies = []
        self.closed = False
        self.data_ms = None
        self.host_open = time.perf_counter()
        self.host_close = None
        self.layer = None
        self.mem_peak = None
        self.mem_resv = None
        self.losses = []
        self.extra = {}
        self.bwd_open = False
        self.ulazies = []  # tensors the user logged, read after the watcher's
        self.ukeys = set()
        self.open_ns = time.time_ns()
        self.close_ns = None
        self.sync_end = None  # event after the end-of-backward collective
        self.host_arrive_ns = None  # host clock at the end of backward (no CUDA)
        self.host_release_ns = None


class LayerProfiler:
    """Forward and backward time of chosen modules during armed steps."""

    def __init__(self, watcher, rows):
        self.w = watcher
        self.names = [n for n, _ in rows]
        self.modules = [m for _, m in rows]
        self.handles = []
        self.cur = None  # per-row {"fwd": [[a,b]], "bwd": [[a,b]]}

    def arm(self):
        self.cur = [{"fwd": [], "bwd": [], "bstart": [], "bend": []} for _ in self.modules]
        for i, m in enumerate(self.modules):
            self.handles.append(m.register_forward_pre_hook(self._pre(i), with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post(i)))
            # A module whose inputs need no gradient (embeddings) ends its
            # backward when its last parameter gradient is accumulated.
            self._param_handles(i, m)
        return self.cur

    def _param_handles(self, i, m):
        ps = [p for p in m.parameters() if p.requires_grad]
        self.cur[i]["params"] = ps

    def disarm(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
        cur, self.cur = self.cur, None
        return cur

    def _pre(self, i):
        def hook(module, args, kwargs):
            if in_backward() or not torch.is_grad_enabled():
                return
            row = self.cur[i]
            row["fwd"].append([self.w.pool.record(), None])
            inp = first_grad_tensor(args)
            if inp is None and kwargs:
                inp = first_grad_tensor(kwargs.get("hidden_states"))
            if inp is not None:
                inp.register_hook(self._bwd_end(i))
            elif row.get("params") and not row.get("phooked"):
                row["phooked"] = True
                for p in row["params"]:
                    if hasattr(p, "register_post_accumulate_grad_hook"):
                        self.handles.append(p.register_post_accumulate_grad_hook(self._param_end(i)))
            elif not row.get("params"):
                # No input gradient and no parameters of its own: FSDP
                # replaces them by views of its flat parameter. The backward
                # then ends when the node that made the output has run.
                row["fnend"] = True
        return hook

    def _post(self, i):
        def hook(module, args, out):
            if in_backward() or not torch.is_grad_enabled():
                return
            row = self.cur[i]
            if row["fwd"] and row["fwd"][-1][1] is None:
                row["fwd"][-1][1] = self.w.pool.record()
            t = first_grad_tensor(out)
            if t is not None:
                t.register_hook(self._bwd_start(i))
                if row.get("fnend") and t.grad_fn is not None:
                    t.grad_fn.register_hook(self._fn_end(i))
        return hook

    def _fn_end(self, i):
        def hook(grad_inputs, grad_outputs):
            if self.cur is not None:
                self.cur[i]["bend"].append(self.w.pool.record())
        return hook

    def _bwd_start(self, i):
        def hook(grad):
            if self.cur is not None:
                self.cur[i]["bstart"].append(self.w.pool.record())
        return hook

    def _bwd_end(self, i):
        def hook(grad):
            if self.cur is not None:
                self.cur[i]["bend"].append(self.w.pool.record())
        return hook

    def _param_end(self, i):
        def hook(p):
            if self.cur is None:
                return
            row = self.cur[i]
            # One end per backward: later parameters of the same pass move it.
            n = len(row["bstart"])
            if len(row["bend"]) < n:
                row["bend"].append(self.w.pool.record())
            elif row["bend"]:
                row["bend"][-1].record()
        return hook


def _events_of(layer):
    for row in layer or ():
        for a, b in row["fwd"]:
            yield a
            if b is not None:
                yield b
        yield from row["bstart"]
        yield from row["bend"]


class Watcher:
    """Hooks on a model and its optimizer that time every step; created by
    :meth:`deepseed.Run.watch`."""

    def __init__(self, run, model, optimizer=None, layers=None, layer_every=10, grad_norm="auto", batch_size=None,
                 tokens_per_sample=None, adapter=None):
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
        self.batch_size = batch_size
        self.tokens_per_sample = tokens_per_sample
        self.layer_every = int(layer_every or 0)
        self.grad_norm = grad_norm
        self.user_grad_norm = False
        self.sharded_grads = False
        self.closed_flag = False

        dev = None
        for p in root.parameters():
            dev = p.device
            break
        self.cuda = bool(dev is not None and dev.type == "cuda" and torch.cuda.is_available())
        self.device = dev
        self.pool = EventPool(self.cuda)
        self.params = [p for p in root.parameters() if p.requires_grad]

        self.cur = None
        self.pending = collections.deque()
        self.last_close_host = None
        self.meta_checked = False
        # Device-to-wall-clock anchor: an event and the candidate wall
        # times (ns) of it, each a lower bound; the newest ANCHOR_KEEP count.
        self.anchor = None
        self.anchor_walls = collections.deque(maxlen=ANCHOR_KEEP)
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

        self.handles = [root.register_forward_pre_hook(self._fwd_pre, with_kwargs=True),
                        root.register_forward_hook(self._fwd_post)]
        if optimizer is not None:
            try:
                self.handles.append(optimizer.register_step_pre_hook(self._opt_pre))
                self.handles.append(optimizer.register_step_post_hook(self._opt_post))
            except AttributeError:
                log.warning("deepseed: watch: optimizer %s has no step hooks; steps end at the next forward",
                            type(optimizer).__name__)
                self.optimizer = None
        if self.adapter is not None:
            self.adapter.attach(self)
        self._describe(inner)

    # ---- meta ---------------------------------------------------------------

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

    def _fwd_pre(self, module, args, kwargs):
        try:
            if not module.training or not torch.is_grad_enabled() or in_backward():
                return
            if not self.meta_checked:
                self._check_precision()
            cur = self.cur
            if cur is not None:
                self._end_open_backward(cur)
                if self.optimizer is None and self.adapter is None and cur.bwd:
                    self._close(self.pool.record())
                    cur = None
            if cur is None:
                cur = self._open()
            cur.fwd.append([self.pool.record(), None])
            self._count_batch(cur, args, kwargs)
        except Exception as e:
            self.run._warn_once("fwdpre", "deepseed: forward hook: %s", e)

    def _fwd_post(self, module, args, out):
        try:
            cur = self.cur
            if cur is None or not cur.fwd or cur.fwd[-1][1] is not None or in_backward():
                return
            cur.fwd[-1][1] = self.pool.record()
            loss = output_loss(out)
            if loss is not None:
                cur.losses.append(loss.detach())
            # The backward begins at the loss when the model computes it, else
            # at its first output; hooking both keeps the earlier of the two.
            if loss is not None and loss.requires_grad:
                loss.register_hook(self._bwd_start)
            for t in iter_tensors(out):
                if t is not loss and t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._bwd_start)
                    break
        except Exception as e:
            self.run._warn_once("fwdpost", "deepseed: forward hook: %s", e)

    def _bwd_start(self, grad):
        cur = self.cur
        if cur is None or cur.bwd_open:
            return
        cur.bwd_open = True
        pair = [self.pool.record(), None]
        cur.bwd.append(pair)
        if _queue_callback is not None:
            try:
                _queue_callback(self._bwd_end)
            except Exception:
                pass

    def _bwd_end(self):
        cur = self.cur
        if cur is None or not cur.bwd or cur.bwd[-1][1] is not None:
            return
        cur.bwd[-1][1] = self.pool.record()
        cur.bwd_open = False
        cur.host_arrive_ns = time.time_ns()
        if cur.sync_end is not None:  # an earlier micro-batch's
            self.pool.put(cur.sync_end)
        cur.sync_end = None
        cur.host_release_ns = None
        # Queued from inside a callback, this runs after the callbacks
        # queued during the backward: DistributedDataParallel's, which
        # waits for (gloo) or makes the stream wait for (NCCL) the
        # gradient all-reduce. Its event marks the end of the collective.
        if _queue_callback is not None:
            try:
                _queue_callback(self._sync_done)
            except Exception:
                pass

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
            self._end_open_backward(cur)
            if cur.bwd and cur.sync_end is None:
                self._sync_done()
            # The norm's kernels go before the optimizer's start event so
            # that optimizer time is the optimizer's alone.
            if self.adapter is None and self.grad_norm != "off" and not self.user_grad_norm:
                gn = fused_grad_norm(self.params)
                if gn is not None:
                    # Sharded gradients (FSDP) give this rank's part of the
                    # norm only. Summing it over the ranks would take a
                    # collective inside the hook, which hangs a job whose
                    # ranks do not all watch; the model's norm is what
                    # model.clip_grad_norm_() returns, passed as grad_norm=.
                    cur.extra["grad_norm_shard" if self.sharded_grads else "grad_norm"] = gn
            cur.opt = [self.pool.record(), None]
        except Exception as e:
            self.run._warn_once("optpre", "deepseed: optimizer hook: %s", e)

    def _opt_post(self, opt, args, kwargs):
        try:
            cur = self.cur
            if cur is None:
                return
            ev = self.pool.record()
            if cur.opt is not None:
                cur.opt[1] = ev
            opt = opt or self.optimizer
            if opt is not None and "lr" not in cur.ukeys:
                try:
                    lr = opt.param_groups[0]["lr"]
                    cur.extra["lr"] = lr
                except Exception:
                    pass
            if self.adapter is not None:
                self.adapter.after_step(cur)
            self._close(ev)
        except Exception as e:
            self.run._warn_once("optpost", "deepseed: optimizer hook: %s", e)

    # ---- pipeline engine: one train_batch() is one step ---------------------

    def _batch_pre(self):
        """train_batch() begins: a step opens (the forwards of its
        micro-batches join it)."""
        try:
            if self.cur is not None:
                self._close(self.pool.record())
            self._open()
        except Exception as e:
            self.run._warn_once("batchpre", "deepseed: train_batch hook: %s", e)

    def _batch_post(self, loss):
        """train_batch() returned loss (None when it raised): the step
        closes with the engine's loss, lr, loss scale and overflow."""
        try:
            cur = self.cur
            if cur is None:
                return
            self._end_open_backward(cur)
            if cur.opt is not None and cur.opt[1] is None:
                cur.opt[1] = self.pool.record()
            if isinstance(loss, torch.Tensor) and "loss" not in cur.ukeys:
                # The batch's mean loss, the same on every stage: the
                # stage's own forward outputs are activations, not losses.
                cur.losses = [loss.detach()]
            if self.adapter is not None:
                self.adapter.after_step(cur)
            self._close(self.pool.record())
        except Exception as e:
            self.run._warn_once("batchpost", "deepseed: train_batch hook: %s", e)

    def _opt_mark(self, start):
        """The optimizer step inside train_batch() begins or ends."""
        cur = self.cur
        if cur is None:
            return
        try:
            if start:
                self._end_open_backward(cur)
                cur.opt = [self.pool.record(), None]
            elif cur.opt is not None:
                cur.opt[1] = self.pool.record()
        except Exception as e:
            self.run._warn_once("optmark", "deepseed: optimizer hook: %s", e)

    # ---- steps ----------------------------------------------------------------

    def _open(self):
        run = self.run
        now = time.perf_counter()
        cur = _Slot(run._next_step)
        run._next_step += 1
        if self.last_close_host is not None:
            cur.data_ms = (now - self.last_close_host) * 1000.0
        if self.cuda and self.anchor is None:
            self._take_anchor()
        cur.open_ns = time.time_ns()
        cur.ev_start = self.pool.record()
        if self.profiler is not None and self.layer_every > 0 and cur.step % self.layer_every == 0:
            cur.layer = self.profiler.arm()
        self.cur = cur
        self.poll()
        return cur

    def _close(self, ev_end):
        cur = self.cur
        if cur is None:
            return
        self._end_open_backward(cur)
        cur.ev_end = ev_end
        cur.closed = True
        cur.host_close = time.perf_counter()
        cur.close_ns = time.time_ns()
        self.last_close_host = cur.host_close
        if cur.layer is not None:
            self.profiler.disarm()
        if self.cuda:
            try:
                cur.mem_peak = torch.cuda.max_memory_allocated(self.device) / 1e9
                cur.mem_resv = torch.cuda.max_memory_reserved(self.device) / 1e9
            except Exception:
                pass
        tensors = {}
        for k, v in cur.extra.items():
            if isinstance(v, torch.Tensor):
                tensors[k] = v
        if cur.losses and "loss" not in cur.ukeys:
            tensors["loss"] = cur.losses[0] if len(cur.losses) == 1 else torch.stack(
                [x.float() for x in cur.losses]).mean()
        cur.losses = []
        if tensors:
            cur.lazies.append(LazyValues(tensors))
        self.pending.append(cur)
        self.cur = None

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
        tensors = {}
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                tensors[k] = v
            else:
                slot.user[k] = v
            slot.ukeys.add(k)
        if tensors:
            slot.ulazies.append(LazyValues(tensors))
        return True

    def _ready(self, slot, nxt):
        if not slot.closed:
            return False
        for ev in self._slot_events(slot):
            if not ev.query():
                return False
        for lz in slot.lazies + slot.ulazies:
            if not lz.ready():
                return False
        if nxt is not None and nxt.ev_start is not None and not nxt.ev_start.query():
            return False
        return True

    def _slot_events(self, slot):
        evs = [slot.ev_start, slot.ev_end, slot.sync_end]
        if slot.opt is not None:
            evs.extend(e for e in slot.opt if e is not None)
        for pair in slot.fwd + slot.bwd:
            evs.extend(e for e in pair if e is not None)
        evs.extend(_events_of(slot.layer))
        # One event can end two intervals (optimizer and step); list it once
        # so that the pool never hands it out twice.
        seen, out = set(), []
        for e in evs:
            if e is not None and id(e) not in seen:
                seen.add(id(e))
                out.append(e)
        return out

    def poll(self, wait=False):
        """Emits every finished step whose events have completed, oldest
        first."""
        while self.pending:
            slot = self.pending[0]
            nxt = self.pending[1] if len(self.pending) > 1 else self.cur
            # A step waits for the next one to begin (its step time runs to
            # that start) unless the run is closing.
            if nxt is None and not wait:
                return
            if not wait and not self._ready(slot, nxt):
                if len(self.pending) <= MAX_PENDING:
                    return
                self.run._warn_once("stale", "deepseed: CUDA events of step %d never completed", slot.step)
                self.pending.popleft()
                continue
            if wait:
                for ev in self._slot_events(slot):
                    ev.synchronize()
                if nxt is not None and nxt.ev_start is not None:
                    nxt.ev_start.synchronize()
            self.pending.popleft()
            self._emit(slot, nxt)

    def _emit(self, slot, nxt):
        f = {}
        try:
            def ms(pairs):
                tot, n = 0.0, 0
                for a, b in pairs:
                    if a is not None and b is not None:
                        tot += a.elapsed_time(b)
                        n += 1
                return tot if n else None

            fw = ms(slot.fwd)
            bw = ms(slot.bwd)
            op = ms([slot.opt]) if slot.opt is not None else None
            end = nxt.ev_start if (nxt is not None and nxt.ev_start is not None) else slot.ev_end
            step_ms = slot.ev_start.elapsed_time(end) if (slot.ev_start is not None and end is not None) else None
            data_ms = slot.data_ms
            sync = self._sync_fields(slot)
            if data_ms is not None and "input_wait_ms" in sync:
                data_ms = max(0.0, data_ms - sync["input_wait_ms"])
            for k, v in (("forward_ms", fw), ("backward_ms", bw), ("optimizer_ms", op), ("step_ms", step_ms),
                         ("data_ms", data_ms), ("gpu_mem_peak_gb", slot.mem_peak),
                         ("gpu_mem_reserved_gb", slot.mem_resv)):
                if v is not None:
                    f[k] = max(0.0, v)
            f.update(sync)
            if slot.samples:
                f["samples"] = slot.samples
            if slot.tokens:
                f["tokens"] = slot.tokens
            for k, v in slot.extra.items():
                if not isinstance(v, torch.Tensor):
                    f[k] = v
            for lz in slot.lazies:
                f.update(lz.values())
            f.update(slot.user)
            for lz in slot.ulazies:
                f.update(lz.values())
            self.run._emit_watched_step(slot.step, f, None)
            if slot.layer is not None:
                self._emit_layers(slot)
        except Exception as e:
            self.run._warn_once("emit", "deepseed: reading step timings: %s", e)
        finally:
            for ev in self._slot_events(slot):
                if nxt is None or ev is not nxt.ev_start:
                    self.pool.put(ev)

    # ---- synchronisation ------------------------------------------------------

    def _take_anchor(self):
        """Maps device events to the wall clock: one synchronize, once."""
        try:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self.anchor = ev
            self.anchor_walls.append(time.time_ns())
        except Exception as e:
            self.anchor = False
            self.run._warn_once("anchor", "deepseed: device clock anchor: %s", e)

    def _wall_ns(self, ev):
        """Wall-clock ns of a completed event, or None."""
        if not self.anchor or ev is None:
            return None
        return max(self.anchor_walls) + int(self.anchor.elapsed_time(ev) * 1e6)

    def _sync_fields(self, slot):
        """sync_ns, sync_wait_ms and input_wait_ms of an emitted step."""
        out = {}
        bwd_end = slot.bwd[-1][1] if slot.bwd else None
        if self.cuda and self.anchor:
            # The host recorded the step's start event at open_ns: the
            # device ran it no sooner, so open_ns − its device time since
            # the anchor bounds the anchor's wall time from below.
            if slot.ev_start is not None:
                self.anchor_walls.append(slot.open_ns - int(self.anchor.elapsed_time(slot.ev_start) * 1e6))
            if bwd_end is not None:
                out["sync_ns"] = self._wall_ns(bwd_end)
                if slot.sync_end is not None:
                    out["sync_wait_ms"] = max(0.0, bwd_end.elapsed_time(slot.sync_end))
            if slot.data_ms is not None and self.last_end_wall_ns is not None and self.last_close_ns is not None:
                busy = (self.last_end_wall_ns - self.last_close_ns) / 1e6
                out["input_wait_ms"] = min(max(0.0, busy), slot.data_ms)
            end = slot.ev_end
            self.last_end_wall_ns = self._wall_ns(end) if end is not None else None
            self.last_close_ns = slot.close_ns
        elif slot.host_arrive_ns is not None:
            out["sync_ns"] = slot.host_arrive_ns
            if slot.host_release_ns is not None:
                out["sync_wait_ms"] = max(0.0, (slot.host_release_ns - slot.host_arrive_ns) / 1e6)
        return {k: v for k, v in out.items() if v is not None}

    def _emit_layers(self, slot):
        fwd, bwd = [], []
        for row in slot.layer:
            t = 0.0
            n = 0
            for a, b in row["fwd"]:
                if b is not None:
                    t += a.elapsed_time(b)
                    n += 1
            fwd.append(round_ms(t) if n else float("nan"))
            bs, be = row["bstart"], row["bend"]
            if bs and len(be) >= len(bs):
                bwd.append(round_ms(sum(max(0.0, a.elapsed_time(b)) for a, b in zip(bs, be))))
            else:
                bwd.append(float("nan"))
        rec = {"kind": "layers", "run_id": self.run.run_id, "rank": self.run.rank, "step": int(slot.step),
               "time": time.time(), "names": list(self.layer_names), "forward_ms": fwd, "backward_ms": bwd}
        self.run._send(rec)

    def _count_batch(self, cur, args, kwargs):
        if self.batch_size is not None:
            cur.samples += int(self.batch_size)
            if self.tokens_per_sample:
                cur.tokens += int(self.batch_size) * int(self.tokens_per_sample)
            return
        t = kwargs.get("input_ids") if kwargs else None
        if t is None:
            for x in iter_tensors(args):
                t = x
                break
        if t is None and kwargs:
            for x in iter_tensors(kwargs):
                t = x
                break
        if t is None or t.dim() == 0:
            return
        cur.samples += int(t.shape[0])
        if t.dim() == 2 and not t.is_floating_point():
            cur.tokens += int(t.shape[0]) * int(t.shape[1])
            if not self.run.meta.get("seq_len"):
                self.run.update_meta(seq_len=int(t.shape[1]))
        elif self.tokens_per_sample:
            cur.tokens += int(t.shape[0]) * int(self.tokens_per_sample)

    # ---- end ----------------------------------------------------------------

    def close(self, wait=True):
        """Removes the hooks and emits what is still pending (waiting for
        the device only when wait is True: at the end of a run)."""
        if self.closed_flag:
            return
        self.closed_flag = True
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        if self.adapter is not None:
            self.adapter.detach()
        if self.cur is not None:
            if self.cur.fwd:
                self._close(self.pool.record())
            else:
                self.cur = None
        if self.profiler is not None:
            self.profiler.disarm()
        if wait:
            self.poll(wait=True)
        else:
            self.pending.clear()


def _is_deepspeed_engine(obj):
    return any(c.__name__ in ("DeepSpeedEngine", "PipelineEngine", "DeepSpeedHybridEngine")
               for c in type(obj).__mro__) or (hasattr(obj, "is_gradient_accumulation_boundary")
                                               and hasattr(obj, "module") and hasattr(obj, "backward"))


def _torch_versions():
    v = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        v["cuda"] = str(torch.version.cuda)
    return v


def _is_finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)
