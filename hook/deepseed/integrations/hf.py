"""Hugging Face Trainer callback.

Usage::

    from deepseed.integrations.hf import DeepSeedCallback
    trainer = Trainer(..., callbacks=[DeepSeedCallback(project="imdb")])

It starts a run at the beginning of training (unless one is given or
already started), watches the model and optimizer, and turns the Trainer's
logs into step records, its evaluations into eval records and its saves
into checkpoint events.
"""

from __future__ import annotations

from transformers import TrainerCallback

from .. import run as _run
from . import resumed_from

_STEP_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch"}


class DeepSeedCallback(TrainerCallback):
    def __init__(self, run=None, watch=True, layer_every=None, **init_kwargs):
        self.run = run
        self.watch = watch
        self.layer_every = layer_every
        self.init_kwargs = init_kwargs
        self._owns_run = False

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not state.is_world_process_zero and not self.init_kwargs.get("all_ranks", True):
            return
        run = self.run or _run.current()
        if run is None:
            kw = dict(self.init_kwargs)
            kw.pop("all_ranks", None)
            kw.setdefault("name", getattr(args, "run_name", None))
            kw.setdefault("params", _params(args))
            ds = getattr(args, "hf_deepspeed_config", None)
            if ds is not None and "config" not in kw:
                kw["config"] = getattr(ds, "config", None)
            run = _run.init(**kw)
            self._owns_run = True
        self.run = run
        run.update_meta(framework=run.meta.get("framework") or "hf",
                        precision="bf16" if args.bf16 else ("fp16" if args.fp16 else run.meta.get("precision")),
                        micro_batch=args.per_device_train_batch_size, grad_accum=args.gradient_accumulation_steps,
                        world_size=args.world_size,
                        effective_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps
                        * args.world_size)
        # The Trainer has worked out max_steps (from epochs when not given)
        # before training begins.
        total = getattr(state, "max_steps", None)
        if not isinstance(total, int) or total <= 0:
            total = getattr(args, "max_steps", None)
        run.set_total_steps(total)
        resumed_from(run, getattr(state, "global_step", 0))
        if self.watch and model is not None:
            kw = {}
            if self.layer_every is not None:
                kw["layer_every"] = self.layer_every
            run.watch(model, optimizer=_unwrap(optimizer), **kw)

    def on_step_end(self, args, state, control, **kwargs):
        if self.run is not None:
            # The step just closed by the optimizer carries the Trainer's number.
            self.run.log_step(state.global_step, epoch=state.epoch)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        fields, evals = {}, {}
        for k, v in logs.items():
            if not isinstance(v, (int, float)):
                continue
            if k.startswith("eval_"):
                evals[k[5:]] = v
            elif k in _STEP_KEYS:
                fields[_STEP_KEYS[k]] = v
            elif k not in ("total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                           "train_loss", "step"):
                fields[k] = v
        if fields:
            self.run.log_step(state.global_step, **fields)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.run is None or not metrics:
            return
        m = {}
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not k.endswith(("_runtime", "_per_second")):
                m[k[5:] if k.startswith("eval_") else k] = v
        self.run.log_eval(state.global_step, **m)

    def on_save(self, args, state, control, **kwargs):
        if self.run is not None:
            self.run.event("checkpoint", "saved checkpoint-%d in %s" % (state.global_step, args.output_dir),
                           step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None and self._owns_run:
            self.run.finish()


def _unwrap(opt):
    # accelerate wraps the optimizer; the torch optimizer inside has the hooks.
    inner = getattr(opt, "optimizer", None)
    return inner if inner is not None and hasattr(inner, "register_step_post_hook") else opt


def _params(args):
    keep = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
            "num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "seed",
            "per_device_train_batch_size", "gradient_accumulation_steps")
    out = {}
    for k in keep:
        v = getattr(args, k, None)
        if isinstance(v, (int, float, str, bool)):
            out[k] = v if not hasattr(v, "value") else str(v)
    return out

