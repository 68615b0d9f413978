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

The Watcher puts together the parts it owns and passes each what it
needs, the run's :class:`~deepseed.link.RunLink` (link.py) among it:

1. a :class:`~deepseed.steps.StepState`: the open step, the queue of closed
   ones and the hooks that open, mark and close steps (steps.py);
2. a :class:`~deepseed.readback.StepReader`: the read-back of finished
   steps into steps and layers records (readback.py);
3. a :class:`~deepseed.phases.PhaseMarks`: the phases a framework marks
   itself (manual=True, the pipeline engine) (phases.py);
4. a :class:`~deepseed.layers.LayerProfiler` (layers.py) and, in a
   distributed run, a :class:`~deepseed.comm.CommProbe` (comm.py).
"""

from __future__ import annotations

import collections
import logging

import torch

from . import comm, compiled
from .layers import LayerProfiler, clean_name, find_layers
from .phases import PhaseMarks
from .readback import StepReader
from .steps import StepState
from .torch_utils import EventPool, Fetcher, torch_versions

log = logging.getLogger("deepseed")


def _param_count(model):
    from .integrations.torch_dist import param_count
    return param_count(model)


class Watcher:
    """Hooks on a model and its optimizer that time every step; created by
    :meth:`deepseed.Run.watch`.

    With ``manual=True`` nothing is hooked on the model's root or the
    optimizer: a framework callback marks the step's phases itself
    (``step_begin``, ``forward_end``, ``backward_begin``, ``backward_end``,
    ``optimizer_begin``, ``step_end``: the methods of
    :class:`~deepseed.phases.PhaseMarks`, on the watcher), as the Lightning
    callback does.

    Its parts are ``steps`` (:class:`~deepseed.steps.StepState`), ``reader``
    (:class:`~deepseed.readback.StepReader`) and ``marks``
    (:class:`~deepseed.phases.PhaseMarks`). ``run`` is the run it reports
    to and ``link`` that run's :class:`~deepseed.link.RunLink`: what an
    integration uses of the run beyond its public API (say, ``next_step``
    for a framework that numbers its steps itself).
    """

    def __init__(self, link, model, optimizer=None, layers=None, layer_every=10, grad_norm="auto", batch_size=None,
                 tokens_per_sample=None, adapter=None, grad_norm_every=None, manual=False, phase_every=None,
                 background_read=None, sample_min_ms=None, layer_every_set=True, scaler=None):
        self.link = link
        self.run = link.run
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
        if scaler is None and optimizer is not None:
            scaler = getattr(optimizer, "scaler", None)  # Accelerate's fp16 GradScaler
        optimizer = hookable_optimizer(optimizer)
        self.root = root
        self.manual = bool(manual)
        self.closed_flag = False

        dev = None
        for p in root.parameters():
            dev = p.device
            break
        self.cuda = bool(dev is not None and dev.type == "cuda" and torch.cuda.is_available())
        self.device = dev
        dev_index = None
        if self.cuda:
            dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
        self.pool = EventPool(self.cuda)
        self.fetch = Fetcher()
        self.params = [p for p in root.parameters() if p.requires_grad]

        inner = compiled.unwrap(root)
        while type(inner).__name__ in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            inner = compiled.unwrap(inner.module)
        # A model compiled whole runs its layers inside one graph: they
        # cannot be timed from the host (compiled.py).
        self.whole_compiled = compiled.is_wrapper(root) or compiled.compiled_in_place(root) or (
            inner is not root and compiled.compiled_in_place(inner))
        self.calls = []  # CompiledCall wrappers to undo at close
        if layers is None:
            rows = find_layers(inner)
        else:
            lookup = dict(inner.named_modules())
            lookup.update({clean_name(k): v for k, v in inner.named_modules()})
            rows = [(n, lookup[n]) for n in layers if n in lookup]
            missing = [n for n in layers if n not in lookup]
            if missing:
                log.warning("deepseed: watch: no module named %s", ", ".join(missing[:5]))
        profiler = LayerProfiler(self.pool, rows) if rows and int(layer_every or 0) > 0 else None
        if profiler is not None and self.whole_compiled:
            profiler = None
            self._layers_unavailable()
        self.profiler = profiler
        self.layer_names = [n for n, _ in rows]

        # Closed steps wait in this queue, which the steps fill and the
        # reader empties.
        self.pending = collections.deque()
        self.reader = StepReader(link, self.pending, self.pool, self.fetch, self.cuda, self.layer_names)
        self.steps = steps = StepState(
            link, root, optimizer, self.adapter, self.pool, self.fetch, self.params, self.reader, self.pending,
            profiler, cuda=self.cuda, dev_index=dev_index, manual=self.manual, batch_size=batch_size,
            tokens_per_sample=tokens_per_sample, layer_every=layer_every, grad_norm=grad_norm,
            grad_norm_every=grad_norm_every, phase_every=phase_every, sample_min_ms=sample_min_ms,
            layer_every_set=layer_every_set, on_first_step=self._check_precision)
        self.marks = marks = PhaseMarks(steps)
        # The calls a framework makes every step are its parts' own methods,
        # bound here once: a call through the watcher costs no extra frame.
        self.step_begin, self.forward_end = marks.step_begin, marks.forward_end
        self.backward_begin, self.backward_end = marks.backward_begin, marks.backward_end
        self.optimizer_begin, self.step_end = marks.optimizer_begin, marks.step_end
        self.attach = steps.attach  # values the user logs joined to a step (Run.log_step)

        self.handles = []
        if not self.manual:
            if not self._wrap_compiled(root):
                first = {"prepend": True} if comm.opens_before(root) else {}
                self.handles = [root.register_forward_pre_hook(steps.forward_pre, with_kwargs=True, **first)]
                steps.attach_post()
                steps.on_unseen = self._find_compiled
        if optimizer is not None and not self.manual:
            try:
                self.handles.append(optimizer.register_step_pre_hook(steps.optimizer_pre))
                self.handles.append(optimizer.register_step_post_hook(steps.optimizer_post))
            except AttributeError:
                log.warning("deepseed: watch: optimizer %s has no step hooks; steps end at the next forward",
                            type(optimizer).__name__)
                steps.optimizer = None
        if self.adapter is not None:
            self.adapter.attach(self)
        self.scaler = None
        if scaler is not None and not self.manual and self.adapter is None and callable(getattr(scaler, "update", None)):
            self._hook_scaler(scaler)
        steps.compiled = self.whole_compiled or any(compiled.compiled_in_place(m) for _, m in rows)
        steps.plan_phases()
        self._describe(inner)
        # Collectives and the compute stream's waits on them (comm.py).
        self.comm = self.reader.comm = comm.attach(steps)
        # Where events complete on their own (a GPU's), steps are read in
        # batches as they close, and a reader thread reads what a loop that
        # stopped stepping leaves; host timers complete at once.
        if self.cuda if background_read is None else background_read:
            steps.read_inline = False
            self.reader.start()

    def _wrap_compiled(self, module):
        """Times the steps around the compiled call of a module compiled in
        place (module.compile()); False when module is not."""
        call = compiled.wrap_compiled_call(module, self.steps.open_forward, self.steps.close_forward)
        if call is None:
            return False
        self.calls.append(call)
        self.steps.hook_root = module
        self.steps.wrapped = True
        self.steps.post_handle = None
        return True

    def _find_compiled(self):
        """An optimizer step came and no hook saw its forward: the model was
        compiled after watch(), and dynamo traced the hooks away. They move
        to what compiles it; the steps before this one are not timed (and
        counted as one: the first step compiles, and its forward is the
        only one the hooks cannot have seen)."""
        root = self.root
        target = root if compiled.compiled_in_place(root) else compiled.find_wrapper(root)
        if target is None:
            return
        if target is root:
            moved = self._wrap_compiled(root)
        else:
            moved = True
            steps = self.steps
            first = {"prepend": True} if comm.opens_before(root) else {}
            self.handles.append(target.register_forward_pre_hook(steps.forward_pre, with_kwargs=True, **first))
            # The root's own hooks stay (removing them would recompile its
            # graph); traced, they are empty, and eager they are not the
            # hook root's.
            steps.hook_root = target
            steps.post_handle = None
            steps.attach_post()
        if not moved:
            return
        # The step that just ran is one of the loop's: it is not timed, but
        # it counts, so that the steps after it keep the loop's numbers.
        self.steps.link.next_step += 1
        self.whole_compiled = self.steps.compiled = True
        prof, self.profiler = self.profiler, None
        if prof is not None:
            self.steps.profiler = None
            prof.disarm()
            prof.restore()
            self._layers_unavailable()
        log.info("deepseed: watch: the model was compiled after watch(); its steps are timed from the compiled "
                 "module on (the steps before were not)")

    def _hook_scaler(self, scaler):
        """Calls the steps' scaler_update before every scaler.update()."""
        orig = scaler.update
        hook = self.steps.scaler_update

        def update(*args, **kwargs):
            hook(scaler)
            return orig(*args, **kwargs)

        try:
            scaler.update = update
            self.scaler = scaler
        except (AttributeError, TypeError):
            log.warning("deepseed: watch: %s takes no hook; steps it skips join the next step", type(scaler).__name__)

    def _layers_unavailable(self):
        self.run.update_meta(layer_times=compiled.WHOLE_MODEL)

    @property
    def optimizer(self):
        """The optimizer whose steps close the watcher's steps, or None."""
        return self.steps.optimizer

    @property
    def cur(self):
        """The open step (a :class:`~deepseed.steps.Step`), or None."""
        return self.steps.cur

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
                meta.update(describe(compiled.unwrap(self.root), self.optimizer))
            except Exception:
                pass
        meta.setdefault("framework", m.get("framework") or "torch")
        try:
            from .integrations.torch_dist import grads_sharded
            self.steps.sharded_grads = self.adapter is None and grads_sharded(meta)
        except Exception:
            self.steps.sharded_grads = False
        meta["versions"] = dict(m.get("versions") or {}, **torch_versions())
        # The config's layers and width give the attention FLOPs; the
        # sequence length comes with the first batch (or tokens_per_sample).
        self.link.flops_cfg = cfg
        tps = self.steps.tokens_per_sample
        if tps and not m.get("seq_len"):
            meta["seq_len"] = int(tps)
        run.update_meta(**meta)
        if run.meta.get("precision"):
            self._log_memory()

    def _check_precision(self):
        # Autocast is only visible once the first forward runs.
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
                prec = ("bf16" if dt == torch.bfloat16 else "fp16") if on else accelerate_precision(self.root)
                self.run.update_meta(precision=prec or "fp32")
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

    # ---- end ----------------------------------------------------------------

    def close(self, wait=True):
        """Removes the hooks and emits what is still pending (waiting for
        the device only when wait is True: at the end of a run)."""
        if self.closed_flag:
            return
        self.closed_flag = True
        reader, steps = self.reader, self.steps
        reader.closing = True
        reader.stop(wait)
        if self.comm is not None:
            self.comm.close()
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        steps.detach_post()
        for call in self.calls:
            call.restore()
        if self.scaler is not None:
            self.scaler.__dict__.pop("update", None)
        if self.adapter is not None:
            self.adapter.detach()
        if steps.cur is not None:
            if steps.cur.fwd or not steps.cur.phases:
                steps.close_step(self.pool.record())
            else:
                steps.cur = None
        if self.profiler is not None:
            self.profiler.disarm()
            self.profiler.restore()
        if wait:
            reader.drain()
        else:
            self.pending.clear()
        with self.link.lock:
            reader.send_steps()


def hookable_optimizer(opt):
    """The optimizer whose step() runs step hooks. A wrapper that does not
    call Optimizer.__init__ (Accelerate's AcceleratedOptimizer, Lightning's
    LightningOptimizer) holds the real one as .optimizer and steps it only
    on the micro-batch that ends an optimizer step (gradient accumulation),
    so the real one's hooks close the watcher's steps."""
    for _ in range(4):
        if opt is None or hasattr(opt, "_optimizer_step_pre_hooks"):
            break
        inner = getattr(opt, "optimizer", None)
        if inner is None or inner is opt:
            break
        opt = inner
    return opt


_ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16"}


def accelerate_precision(root):
    """The mixed precision Accelerate runs root's forward under: its
    prepare() wraps the model's forward in autocast, which a hook that runs
    before or after the forward does not see. None when root was not
    prepared by Accelerate with mixed precision."""
    import sys
    st = sys.modules.get("accelerate.state")
    if st is None:
        return None
    m = compiled.unwrap(root)
    for _ in range(3):
        if "_original_forward" in getattr(m, "__dict__", {}):
            break
        m = compiled.unwrap(getattr(m, "module", None))
        if m is None:
            return None
    else:
        return None
    try:
        if not st.AcceleratorState._shared_state:
            return None
        mp = st.AcceleratorState().mixed_precision
    except Exception:
        return None
    return _ACCELERATE_PRECISION.get(str(getattr(mp, "value", mp)).lower())


def _is_deepspeed_engine(obj):
    return any(c.__name__ in ("DeepSpeedEngine", "PipelineEngine", "DeepSpeedHybridEngine")
               for c in type(obj).__mro__) or (hasattr(obj, "is_gradient_accumulation_boundary")
                                               and hasattr(obj, "module") and hasattr(obj, "backward"))
