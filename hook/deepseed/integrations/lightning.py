"""PyTorch Lightning callback.

Usage::

    from deepseed.integrations.lightning import DeepSeedCallback
    trainer = L.Trainer(..., callbacks=[DeepSeedCallback(project="imdb")])

Lightning calls ``optimizer.step(closure)``: the training step and the
backward run inside the optimizer's step, and ``training_step`` is not
the module's ``forward``. So the watcher hooks neither; this callback marks
the phases from Lightning's own hooks instead:

- forward: ``on_train_batch_start`` (the batch is on the device) to
  ``on_before_backward``,
- backward: ``on_before_backward`` to ``on_after_backward``,
- optimizer: ``on_before_optimizer_step`` (gradients unscaled under
  16-mixed) to ``on_train_batch_end`` of the batch that stepped,
- data: host time between one batch's end and the next one's start.

With gradient accumulation one step spans ``accumulate_grad_batches``
batches; their forward and backward times add up and the step's loss is
the sum of Lightning's per-batch shares (each already divided by the
accumulation), the mean loss of the step's batches. Layers, gradient norm,
samples, tokens and throughput come as with plain PyTorch.
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback

from .. import run as _run
from ..env import lightning_precision as precision_name, strategy_parallelism
from . import resumed_from


class DeepSeedCallback(Callback):
    def __init__(self, run=None, watch=True, layer_every=None, grad_norm_every=None, **init_kwargs):
        super().__init__()
        self.run = run
        self.watch = watch
        self.layer_every = layer_every
        self.grad_norm_every = grad_norm_every
        self.init_kwargs = init_kwargs
        self._owns_run = False
        self._w = None
        self._stepped = False
        self._scaler = None

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
        prec = getattr(trainer, "precision", None)
        strategy = type(getattr(trainer, "strategy", None)).__name__
        accum = getattr(trainer, "accumulate_grad_batches", None)
        meta = {"framework": "lightning", "world_size": getattr(trainer, "world_size", None),
                "grad_accum": accum, "precision": precision_name(prec),
                "lightning_precision": str(prec) if prec is not None else None, "strategy": strategy}
        par = strategy_parallelism(strategy)
        if par and par != "deepspeed":
            meta["parallelism"] = par
        if par == "deepspeed":
            cfg = getattr(trainer.strategy, "config", None)
            if isinstance(cfg, dict):
                from ..env import meta_from_ds_config
                meta.update(meta_from_ds_config(cfg, getattr(trainer, "world_size", 1)))
            meta["framework"] = "lightning"
        run.update_meta(**meta)
        _set_total_steps(run, trainer)
        self._scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        if self._scaler is None:
            self._scaler = getattr(getattr(getattr(trainer, "strategy", None), "precision_plugin", None), "scaler",
                                   None)
        if self.watch:
            opts = getattr(trainer, "optimizers", None) or [None]
            kw = {"manual": True}
            if self.layer_every is not None:
                kw["layer_every"] = self.layer_every
            if self.grad_norm_every is not None:
                kw["grad_norm_every"] = self.grad_norm_every
            self._w = run.watch(pl_module, optimizer=opts[0], **kw)

    def on_train_start(self, trainer, pl_module):
        # estimated_stepping_batches needs the train dataloader, which the
        # fit loop has set up by now.
        if self.run is not None:
            _set_total_steps(self.run, trainer)
            resumed_from(self.run, getattr(trainer, "global_step", 0))

    # ---- one batch ------------------------------------------------------------

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        w = self._w
        if w is not None:
            self._stepped = False
            if w.cur is None:
                # Steps carry Lightning's numbers (a resumed fit goes on).
                w.link.next_step = int(trainer.global_step) + 1
            w.step_begin(batch)

    def on_before_backward(self, trainer, pl_module, loss):
        if self._w is not None:
            self._w.backward_begin(loss)

    def on_after_backward(self, trainer, pl_module):
        if self._w is not None:
            self._w.backward_end()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self._w is not None:
            self._stepped = True
            self._w.optimizer_begin()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.run is None:
            return
        loss = None
        if isinstance(outputs, dict):
            loss = outputs.get("loss")
        elif outputs is not None and hasattr(outputs, "detach"):
            loss = outputs
        w = self._w
        if w is None or w.closed_flag:
            fields = {"epoch": trainer.current_epoch}
            if loss is not None:
                fields["loss"] = loss
            self.run.log_step(trainer.global_step, **fields)
            return
        # Lightning's loss share of this batch (divided by the accumulation).
        cur = w.cur
        if cur is not None and loss is not None and hasattr(loss, "detach"):
            cur.extra.setdefault("_loss_parts", []).append(w.fetch.add(loss))
        if not self._stepped:
            return  # accumulating: the step goes on with the next batch
        extra = {"epoch": trainer.current_epoch}
        sc = self._scaler
        if sc is not None and getattr(sc, "_scale", None) is not None:
            # The scale after update(): a drop means this step was skipped.
            extra["loss_scale"] = sc._scale.detach().clone()
        opts = getattr(trainer, "optimizers", None) or [None]
        w.step_end(optimizer=opts[0], extra=extra)
        self._stepped = False

    # ---- the rest -----------------------------------------------------------------

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
