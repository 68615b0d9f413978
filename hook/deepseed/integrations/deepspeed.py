"""DeepSpeed engine support: the engine's config gives ZeRO stage,
precision, offload, micro batch, gradient accumulation and world size; its
optimizer gives the loss scale and overflow-skipped steps; its global grad
norm is reused rather than recomputed; its LR scheduler's total_num_steps
gives the run's total steps.

Usage::

    engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)
    run = deepseed.init(project="imdb", config=ds_config)
    run.watch(engine)

A pipeline-parallel engine (``PipelineEngine``, built from a
``PipelineModule``) trains only through ``engine.train_batch()``, which runs
the forward and backward of every micro-batch of this rank's stage and the
optimizer step. Each call is one step: its time from one call's start to
the next's, the stage's forward and backward time summed over the
micro-batches (hooks on the stage's module), the optimizer's time, the
loss train_batch returns (the batch's mean, broadcast to every stage), lr,
loss scale, and with ``wall_clock_breakdown`` the pipeline's send and
receive time as communication. Meta says ``parallelism: pipeline`` and the
stage count; every step record of a rank carries its stage as
``metrics.pipeline_stage``.
"""

from __future__ import annotations

from ..env import meta_from_ds_config


class EngineAdapter:
    """Turns engine.step() calls at a gradient-accumulation boundary into
    the watcher's optimizer-step boundaries."""

    def __init__(self, engine):
        self.engine = engine
        self.module = engine.module
        self.watcher = None
        self._orig_step = None
        self._wrapped = []  # (object, attribute) pairs patched on attach
        self._skipped = self._skipped_steps()
        self._comm_prev = {}
        self.pipeline = is_pipeline_engine(engine)
        self.stage = None
        if self.pipeline:
            st = getattr(engine, "stage_id", None)
            self.stage = st if isinstance(st, int) and not isinstance(st, bool) else None

    def meta(self):
        e = self.engine
        m = {"framework": "deepspeed"}
        cfg = getattr(e, "config", None)
        if isinstance(cfg, dict):
            m.update(meta_from_ds_config(cfg, self._call("world_size") or self._call("dp_world_size")))
        stage = self._call("zero_optimization_stage")
        if stage is not None:
            m["zero_stage"] = int(stage)
        if self._call("bfloat16_enabled"):
            m["precision"] = "bf16"
        elif self._call("fp16_enabled"):
            m["precision"] = "fp16"
        elif stage is not None:
            m["precision"] = "fp32"
        for key, fn in (("micro_batch", "train_micro_batch_size_per_gpu"),
                        ("grad_accum", "gradient_accumulation_steps"), ("effective_batch", "train_batch_size")):
            v = self._call(fn)
            if v is not None:
                m[key] = int(v)
        ws = getattr(e, "world_size", None) or getattr(e, "dp_world_size", None)
        if isinstance(ws, int):
            m["world_size"] = ws
        if self._call("zero_cpu_offload"):
            m["offload_optimizer"] = "cpu"
        off = self._call("zero_offload_param")
        if off is not None:
            dev = getattr(off, "device", None)
            if dev is not None:
                m["offload_params"] = str(getattr(dev, "value", dev))
        stages = getattr(e, "num_stages", None)
        if isinstance(stages, int) and not isinstance(stages, bool) and (stages > 1 or self.pipeline):
            m["pipeline_stages"] = stages
            m["parallelism"] = "pipeline"
            # Every stage holds its own part of the model: data-parallel
            # ranks are the world over the stages.
            dp = getattr(e, "dp_world_size", None)
            if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0:
                m["data_parallel_size"] = dp
        return m

    def total_steps(self):
        """The scheduler's total_num_steps (WarmupDecayLR,
        WarmupCosineLR), when the engine has such a scheduler."""
        sched = getattr(self.engine, "lr_scheduler", None)
        for name in ("total_num_steps", "total_steps"):
            v = getattr(sched, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return v
        return None

    def _call(self, name):
        fn = getattr(self.engine, name, None)
        if not callable(fn):
            return None
        try:
            return fn()
        except Exception:
            return None

    def _skipped_steps(self):
        return getattr(self.engine, "skipped_steps", 0) or 0

    def attach(self, watcher):
        self.watcher = watcher
        try:
            watcher.run.set_total_steps(self.total_steps())
        except Exception:
            pass
        if self.pipeline:
            self._attach_pipeline(watcher)
            return
        engine = self.engine
        orig = engine.step
        self._orig_step = orig
        steps = watcher.steps

        def step(*args, **kwargs):
            boundary = True
            try:
                boundary = bool(engine.is_gradient_accumulation_boundary())
            except Exception:
                pass
            if boundary:
                steps.optimizer_pre(None, args, kwargs)
            out = orig(*args, **kwargs)
            if boundary:
                steps.optimizer_post(None, args, kwargs)
            return out

        engine.step = step

    def _attach_pipeline(self, watcher):
        """Wraps train_batch (one step each) and the optimizer's step (its
        time); PipelineEngine.step() itself refuses to run."""
        engine = self.engine
        orig = engine.train_batch
        marks = watcher.marks

        def train_batch(*args, **kwargs):
            marks.batch_begin()
            out = None
            try:
                out = orig(*args, **kwargs)
            finally:
                marks.batch_end(out)
            return out

        self._patch(engine, "train_batch", orig, train_batch)
        opt = getattr(engine, "optimizer", None)
        ostep = getattr(opt, "step", None)
        if callable(ostep):
            def step(*args, **kwargs):
                marks.optimizer_mark(True)
                try:
                    return ostep(*args, **kwargs)
                finally:
                    marks.optimizer_mark(False)

            self._patch(opt, "step", ostep, step)

    def _patch(self, obj, name, orig, fn):
        try:
            own = name in getattr(obj, "__dict__", {})
            setattr(obj, name, fn)
            self._wrapped.append((obj, name, orig, own))
        except Exception:
            pass

    def detach(self):
        for obj, name, orig, own in reversed(self._wrapped):
            try:
                if own:
                    setattr(obj, name, orig)
                else:
                    delattr(obj, name)  # back to the class's method
            except Exception:
                pass
        self._wrapped = []
        if self._orig_step is not None:
            try:
                del self.engine.step  # back to the class's method
            except Exception:
                self.engine.step = self._orig_step
            self._orig_step = None

    def after_step(self, slot):
        e = self.engine
        try:
            gn = e.get_global_grad_norm()
            if gn is not None:
                slot.extra["grad_norm"] = gn
        except Exception:
            pass
        try:
            lrs = e.get_lr()
            if lrs:
                slot.extra["lr"] = lrs[0]
        except Exception:
            pass
        opt = getattr(e, "optimizer", None)
        scale = getattr(opt, "loss_scale", None)
        if scale is None:
            scale = getattr(opt, "cur_scale", None)
        if isinstance(scale, (int, float)):
            slot.extra["loss_scale"] = float(scale)
        skipped = self._skipped_steps()
        if skipped > self._skipped:
            slot.extra["skipped"] = True
            self.watcher.run.event("overflow", "gradient overflow: step skipped, loss scale %s" % scale,
                                   step=slot.step)
        elif getattr(e, "global_steps", None) is not None:
            slot.extra["skipped"] = False
        self._skipped = skipped
        if self.stage is not None:
            slot.extra["pipeline_stage"] = self.stage
        self._read_timers(slot)

    def _read_timers(self, slot):
        # With wall_clock_breakdown the engine already synchronizes around
        # its timers; reading their totals adds no stall. Totals are
        # differenced so the engine's own printing keeps working; a timer
        # the engine reset in between (when it printed) gives no value for
        # that step.
        if not self._call("wall_clock_breakdown"):
            return
        timers = getattr(self.engine, "timers", None)
        if timers is None:
            return
        names = PIPE_COMM_TIMERS if self.pipeline else ("bwd_allreduce",)
        comm, seen, whole = 0.0, False, True
        for name in names:
            try:
                total = float(timers(name).elapsed(reset=False))
            except Exception:
                continue
            prev = self._comm_prev.get(name)
            self._comm_prev[name] = total
            if prev is None or total < prev:
                whole = False  # the first reading, or the engine reset its timers
                continue
            comm += total - prev
            seen = True
        if seen and whole:
            # The hook's own device measurement (comm.py), where it timed
            # the step's collectives, wins: these timers are known to be
            # wrong under overlap_comm. They stay beside it for comparison.
            slot.extra["comm_ms" if getattr(slot, "comm", None) is None else "deepspeed_comm_ms"] = comm


# The pipeline engine's point-to-point timers (DeepSpeed's
# runtime/pipe/engine.py): activations sent and received forward,
# gradients backward.
PIPE_COMM_TIMERS = ("pipe_send_output", "pipe_send_grad", "pipe_recv_input", "pipe_recv_grad")


def is_pipeline_engine(engine):
    """A DeepSpeed PipelineEngine, or an object shaped like one: it trains
    through train_batch() and knows its stage."""
    if any(c.__name__ == "PipelineEngine" for c in type(engine).__mro__):
        return True
    return callable(getattr(engine, "train_batch", None)) and hasattr(engine, "stage_id") and \
        hasattr(engine, "num_stages")


def watch(run, engine, **kwargs):
    """Same as run.watch(engine)."""
    return run.watch(engine, **kwargs)
