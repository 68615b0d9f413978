"""A step's phases as a framework marks them, not the model's hooks: the
``manual=True`` calls of a framework callback (Lightning's) and the
DeepSpeed pipeline engine's train_batch() hooks, where one train_batch()
is one step.

A PhaseMarks, owned by the Watcher, opens, marks and closes the same
StepState (steps.py) as the model's hooks do. phase_offset says which
steps a single process times the phases of."""

from __future__ import annotations

import math

import torch

from .torch_utils import queue_callback


def phase_offset(phase_every, layer_every):
    """The step number modulo phase_every of the steps whose phases are
    timed: phase_every // 2, moved by one where that would meet the layer
    steps (every layer_every) at every turn."""
    off = phase_every // 2
    if layer_every > 1:
        g = math.gcd(phase_every, layer_every)
        if g > 1 and off % g == 0:
            off = (off + 1) % phase_every
    return off


class PhaseMarks:
    """The framework-marked phases of a :class:`deepseed.watch.Watcher`,
    on its StepState steps."""

    def __init__(self, steps):
        self.steps = steps

    # ---- phases marked by a framework callback (manual=True) -----------------

    def step_begin(self, batch=None):
        """A micro-batch's forward begins (the step opens at the first)."""
        s = self.steps
        try:
            cur = s.cur
            if cur is None:
                cur = s.open_step()  # every step times its phases here
            else:
                s.end_open_backward(cur)
                cur.fwd.append([s.pool.record(), None])
            if isinstance(batch, dict):
                s.count_batch(cur, (), batch)
            elif batch is not None:
                s.count_batch(cur, (batch,), None)
        except Exception as e:
            s.link.warn_once("stepbegin", "deepseed: step begin: %s", e)

    def forward_end(self, loss=None):
        """The micro-batch's forward (and loss) is done; loss, if given, is
        one micro-batch's share of the step's loss (they are summed)."""
        s = self.steps
        cur = s.cur
        if cur is None or not cur.fwd or cur.fwd[-1][1] is not None:
            return
        cur.fwd[-1][1] = s.pool.record()
        if loss is not None:
            cur.extra.setdefault("_loss_parts", []).append(s.fetch.add(loss))

    def backward_begin(self, loss=None):
        """The backward of loss begins. With the loss given, the backward's
        end is also marked from inside the backward, before the callbacks
        that wait for the gradient all-reduce (DistributedDataParallel's):
        the step's sync_ns and sync_wait_ms then split arrival and wait as
        with the model's own hooks."""
        self.forward_end()
        self.steps.backward_start()
        if loss is not None and queue_callback is not None and getattr(loss, "requires_grad", False):
            try:
                loss.register_hook(self._bwd_queue)
            except Exception:
                pass

    def _bwd_queue(self, grad=None):
        try:
            queue_callback(self.steps.backward_done)
        except Exception:
            pass

    def backward_end(self):
        # After backward() returned: ends it here unless the callback queued
        # from the loss already did. The collective's end is then marked at
        # the optimizer's start.
        self.steps.end_backward()

    def optimizer_begin(self):
        s = self.steps
        cur = s.cur
        if cur is None:
            return
        s.end_open_backward(cur)
        if cur.bwd and cur.sync_end is None:
            s.sync_done()
        try:
            s.take_grad_norm(cur)
        except Exception as e:
            s.link.warn_once("gradnorm", "deepseed: gradient norm: %s", e)
        cur.opt = [s.pool.record(), None]

    def step_end(self, optimizer=None, loss=None, extra=None):
        """The optimizer step is done: closes the step."""
        s = self.steps
        cur = s.cur
        if cur is None:
            return
        try:
            ev = s.pool.record()
            if cur.opt is not None:
                cur.opt[1] = ev
            s.read_lr(cur, optimizer or s.optimizer)
            if loss is not None:
                cur.boxes.append(("loss", s.fetch.add(loss)))
            for k, v in (extra or {}).items():
                if isinstance(v, torch.Tensor):
                    cur.boxes.append((k, s.fetch.add(v)))
                elif v is not None:
                    cur.extra[k] = v
            s.close_step(ev)
        except Exception as e:
            s.link.warn_once("stepend", "deepseed: step end: %s", e)

    # ---- pipeline engine: one train_batch() is one step ---------------------

    def batch_begin(self):
        """train_batch() begins: a step opens (the forwards of its
        micro-batches join it)."""
        s = self.steps
        try:
            if s.cur is not None:
                s.close_step(s.pool.record())
            s.open_step(forward=False)
        except Exception as e:
            s.link.warn_once("batchpre", "deepseed: train_batch hook: %s", e)

    def batch_end(self, loss):
        """train_batch() returned loss (None when it raised): the step
        closes with the engine's loss, lr, loss scale and overflow."""
        s = self.steps
        try:
            cur = s.cur
            if cur is None:
                return
            s.end_open_backward(cur)
            if cur.opt is not None and cur.opt[1] is None:
                cur.opt[1] = s.pool.record()
            if isinstance(loss, torch.Tensor) and "loss" not in cur.ukeys:
                # The batch's mean loss, the same on every stage: the
                # stage's own forward outputs are activations, not losses.
                cur.losses = [s.fetch.add(loss)]
            if s.adapter is not None:
                s.adapter.after_step(cur)
            s.close_step(s.pool.record())
        except Exception as e:
            s.link.warn_once("batchpost", "deepseed: train_batch hook: %s", e)

    def optimizer_mark(self, start):
        """The optimizer step inside train_batch() begins or ends."""
        s = self.steps
        cur = s.cur
        if cur is None:
            return
        try:
            if start:
                s.end_open_backward(cur)
                cur.opt = [s.pool.record(), None]
            elif cur.opt is not None:
                cur.opt[1] = s.pool.record()
        except Exception as e:
            s.link.warn_once("optmark", "deepseed: optimizer hook: %s", e)
