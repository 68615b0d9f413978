"""PyTorch Lightning callback.

Usage::

    from deepseed.integrations.lightning import DeepSeedCallback
    trainer = L.Trainer(..., callbacks=[DeepSeedCallback(project="imdb")])
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback

from .. import run as _run


class DeepSeedCallback(Callback):
    def __init__(self, run=None, watch=True, layer_every=None, **init_kwargs):
        super().__init__()
        self.run = run
        self.watch = watch
        self.layer_every = layer_every
        self.init_kwargs = init_kwargs
        self._owns_run = False

    def on_fit_start(self, trainer, pl_module):
        run = self.run or _run.current()
        if run is None:
            kw = dict(self.init_kwargs)
            hp = getattr(pl_module, "hparams", None)
            if hp and "params" not in kw:
                kw["params"] = {k: v for k, v in dict(hp).items() if isinstance(v, (int, float, str, bool))}
            run = _run.init(**kw)
            self._owns_run = True
        self.run = run
        prec = str(getattr(trainer, "precision", "") or "")
        precision = "bf16" if "bf16" in prec else ("fp16" if "16" in prec else ("fp32" if prec else None))
        strategy = type(getattr(trainer, "strategy", None)).__name__
        meta = {"framework": "lightning", "world_size": getattr(trainer, "world_size", None),
                "grad_accum": getattr(trainer, "accumulate_grad_batches", None), "precision": precision}
        if "FSDP" in strategy:
            meta["parallelism"] = "fsdp"
        elif "DDP" in strategy:
            meta["parallelism"] = "ddp"
        elif "DeepSpeed" in strategy:
            cfg = getattr(trainer.strategy, "config", None)
            if isinstance(cfg, dict):
                from ..env import meta_from_ds_config
                meta.update(meta_from_ds_config(cfg, getattr(trainer, "world_size", 1)))
            meta["framework"] = "lightning"
        run.update_meta(**meta)
        _set_total_steps(run, trainer)
        if self.watch:
            opts = getattr(trainer, "optimizers", None) or [None]
            kw = {}
            if self.layer_every is not None:
                kw["layer_every"] = self.layer_every
            run.watch(pl_module, optimizer=opts[0], **kw)

    def on_train_start(self, trainer, pl_module):
        # estimated_stepping_batches needs the train dataloader, which the
        # fit loop has set up by now.
        if self.run is not None:
            _set_total_steps(self.run, trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.run is None:
            return
        loss = None
        if isinstance(outputs, dict):
            loss = outputs.get("loss")
        elif outputs is not None and hasattr(outputs, "detach"):
            loss = outputs
        fields = {"epoch": trainer.current_epoch}
        if loss is not None:
            fields["loss"] = loss
        self.run.log_step(trainer.global_step, **fields)

    def on_validation_end(self, trainer, pl_module):
        if self.run is None or getattr(trainer, "sanity_checking", False):
            return
        m = {}
        for k, v in dict(trainer.callback_metrics).items():
            if k.startswith("val") or k.startswith("eval"):
                name = k.split("/", 1)[-1] if "/" in k else k.split("_", 1)[-1]
                m[name] = v
        if m:
            self.run.log_eval(trainer.global_step, **m)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.run is not None:
            self.run.event("checkpoint", "saved at step %d" % trainer.global_step, step=trainer.global_step)

    def on_fit_end(self, trainer, pl_module):
        if self.run is not None and self._owns_run:
            self.run.finish()

    def on_exception(self, trainer, pl_module, exception):
        if self.run is not None and self._owns_run:
            self.run.finish("failed", summary={"error": ("%s: %s" % (type(exception).__name__, exception))[:2000]})


def _set_total_steps(run, trainer):
    """The optimizer steps of the fit: max_steps when set (-1 is unset),
    else Lightning's estimate from epochs, batches and accumulation."""
    total = getattr(trainer, "max_steps", None)
    if not isinstance(total, int) or total <= 0:
        try:
            total = trainer.estimated_stepping_batches
        except Exception:
            total = None
    run.set_total_steps(total)
