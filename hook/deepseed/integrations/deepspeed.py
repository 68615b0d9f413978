"""DeepSpeed engine support: the engine's config gives ZeRO stage,
precision, offload, micro batch, gradient accumulation and world size; its
optimizer gives the loss scale and overflow-skipped steps; its global grad
norm is reused rather than recomputed.

Usage::

    engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)
    run = deepseed.init(project="imdb", config=ds_config)
    run.watch(engine)
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
        self._skipped = self._skipped_steps()
        self._comm_prev = None

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
        if isinstance(stages, int) and stages > 1:
            m["pipeline_stages"] = stages
            m["parallelism"] = "pipeline"
        return m

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
        engine = self.engine
        orig = engine.step
        self._orig_step = orig

        def step(*args, **kwargs):
            boundary = True
            try:
                boundary = bool(engine.is_gradient_accumulation_boundary())
            except Exception:
                pass
            if boundary:
                watcher._opt_pre(None, args, kwargs)
            out = orig(*args, **kwargs)
            if boundary:
                watcher._opt_post(None, args, kwargs)
            return out

        engine.step = step

    def detach(self):
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
        self._read_timers(slot)

    def _read_timers(self, slot):
        # With wall_clock_breakdown the engine already synchronizes around
        # its timers; reading their totals adds no stall. Totals are
        # differenced so the engine's own printing keeps working.
        if not self._call("wall_clock_breakdown"):
            return
        timers = getattr(self.engine, "timers", None)
        if timers is None:
            return
        try:
            t = timers("bwd_allreduce")
            total = t.elapsed(reset=False)
            if self._comm_prev is not None and total >= self._comm_prev:
                slot.extra["comm_ms"] = total - self._comm_prev
            self._comm_prev = total
        except Exception:
            pass


def watch(run, engine, **kwargs):
    """Same as run.watch(engine)."""
    return run.watch(engine, **kwargs)
