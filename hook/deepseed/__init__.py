"""DeepSeed training telemetry: three lines in a training script.

1. ``run = deepseed.init(project="imdb", name="bert-large-z2", config=ds_config)``
2. ``run.watch(model_engine)`` (or ``run.watch(model, optimizer=opt)``) for step
   timing, layer times, gradient norm and memory, measured without stalling
   the GPU.
3. ``run.log_step(step, loss=loss, lr=lr)``, ``run.log_eval(...)``,
   ``run.event(...)``; ``run.finish()`` also happens at exit, with status
   failed when the script dies with an exception.

The core uses the standard library only; torch and the framework
integrations (``deepseed.integrations.*``) are imported when used.
"""

from .env import predict_memory
from .options import RunOptions
from .run import Run, current, init

__version__ = "0.1.0"


def _run():
    r = current()
    if r is None:
        raise RuntimeError("deepseed.init() has not been called")
    return r


def log_step(step=None, **fields):
    """Logs a step on the current run (see :meth:`Run.log_step`)."""
    r = current()
    if r is not None:
        r.log_step(step, **fields)


def log_eval(step=None, **fields):
    """Logs an evaluation on the current run (see :meth:`Run.log_eval`)."""
    r = current()
    if r is not None:
        r.log_eval(step, **fields)


def event(type, text="", step=None):
    """Records an event on the current run (see :meth:`Run.event`)."""
    r = current()
    if r is not None:
        r.event(type, text, step=step)


def watch(model, optimizer=None, **kwargs):
    """Watches a model on the current run (see :meth:`Run.watch`)."""
    return _run().watch(model, optimizer=optimizer, **kwargs)


def finish(status="finished", **kwargs):
    """Finishes the current run (see :meth:`Run.finish`)."""
    r = current()
    if r is not None:
        r.finish(status, **kwargs)


__all__ = ["init", "Run", "RunOptions", "current", "log_step", "log_eval", "event", "watch", "finish",
           "predict_memory", "__version__"]
