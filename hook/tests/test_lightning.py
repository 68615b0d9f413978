"""The Lightning callback's steps through the real watcher (manual=True)
on the torch stand-in of faketorch, with Lightning's objects faked as far
as the callback reads them: a step carries Lightning's own number, so a
resumed fit goes on from where it stopped."""

import json
import os
import sys
import types
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402
from .cases import quiet_tempdir  # noqa: E402
from .test_total_steps import fake_modules  # noqa: E402


class Trainer:
    precision = "32-true"
    world_size = 1
    accumulate_grad_batches = 1
    strategy = object()
    max_steps = 1000
    current_epoch = 0

    def __init__(self, global_step, optimizer):
        self.global_step = global_step
        self.optimizers = [optimizer]


class LightningStepsTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        self.path = os.path.join(quiet_tempdir(self), "run.ndjson")
        modules = mock.patch.dict(sys.modules, fake_modules())
        modules.start()
        self.addCleanup(modules.stop)
        sys.modules.pop("deepseed.integrations.lightning", None)
        self.addCleanup(sys.modules.pop, "deepseed.integrations.lightning", None)

    def fit(self, resume_at, batches):
        """Runs batches optimizer steps of a fit that resumes at Lightning's
        global step resume_at; returns the step records."""
        from deepseed.integrations.lightning import DeepSeedCallback
        torch = sys.modules["torch"]
        run = deepseed.init(project="lightning", run_id="lt%d" % resume_at, file=self.path, handle_signals=False,
                            layer_every=0)
        module = torch.nn.Module(forward=lambda x: x)
        module.hparams = types.SimpleNamespace()
        opt = torch.optim.Optimizer(module.parameters(), lr=0.1)
        trainer = Trainer(resume_at, opt)
        cb = DeepSeedCallback(run=run, grad_norm_every=0)
        cb.on_fit_start(trainer, module)
        cb.on_train_start(trainer, module)
        for i in range(batches):
            batch = torch.Tensor(0.0, (4, 8))
            cb.on_train_batch_start(trainer, module, batch, i)
            loss = torch.Tensor(1.0 + i, requires_grad=True)
            cb.on_before_backward(trainer, module, loss)
            cb.on_after_backward(trainer, module)
            cb.on_before_optimizer_step(trainer, module, opt)
            cb.on_train_batch_end(trainer, module, {"loss": loss}, batch, i)
            trainer.global_step += 1
        run.finish()
        with open(self.path) as f:
            return [r for r in expand_steps(map(json.loads, f)) if r["kind"] == "step" and r["run_id"] == run.run_id]

    def test_steps_carry_lightnings_numbers(self):
        steps = self.fit(0, 3)
        self.assertEqual([s["step"] for s in steps], [1, 2, 3])
        self.assertEqual([s["loss"] for s in steps], [1.0, 2.0, 3.0])
        self.assertEqual([s["samples"] for s in steps], [4, 4, 4])

    def test_a_resumed_fit_goes_on_from_its_global_step(self):
        steps = self.fit(41, 3)
        self.assertEqual([s["step"] for s in steps], [42, 43, 44])


if __name__ == "__main__":
    unittest.main()
