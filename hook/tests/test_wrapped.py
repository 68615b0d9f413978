"""What the watcher records when the training loop reaches the model and
the optimizer through wrappers: an optimizer wrapper that runs no step
hooks of its own and steps the real one only at the end of gradient
accumulation (Accelerate's AcceleratedOptimizer), a GradScaler that skips
an optimizer step, and hooks that dynamo traces under torch.compile (which
must then be empty). Through the real watcher with the torch stand-in of
faketorch."""

import json
import os
import sys
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402
from .cases import quiet_tempdir  # noqa: E402


class AcceleratedOptimizer:
    """The shape of Accelerate's wrapper: a torch Optimizer subclass that
    never ran Optimizer.__init__ (so its own step hooks cannot be
    registered), holding the real optimizer and its GradScaler, stepping it
    only on the micro-batch that syncs the gradients."""

    def __init__(self, optimizer, scaler=None):
        self.optimizer = optimizer
        self.scaler = scaler
        self.sync = True

    def register_step_pre_hook(self, fn):
        raise AttributeError("'AcceleratedOptimizer' object has no attribute '_optimizer_step_pre_hooks'")

    register_step_post_hook = register_step_pre_hook

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self, skip=False):
        if not self.sync:
            return
        if self.scaler is None:
            self.optimizer.step()
            return
        if not skip:  # the scaler found no inf gradients
            self.optimizer.step()
        self.scaler.update()


class GradScaler:
    def __init__(self, torch):
        self._scale = torch.Tensor(1024.0)
        self.updates = 0

    def update(self, new_scale=None):
        self.updates += 1


class WrappedTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        self.dir = quiet_tempdir(self)
        self.torch = sys.modules["torch"]

    def run_file(self, name):
        path = os.path.join(self.dir, name + ".ndjson")
        with mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1"}):
            run = deepseed.init(project="wrapped", run_id=name, file=path, handle_signals=False, layer_every=0)
        return run, path

    def read(self, path):
        with open(path) as f:
            recs = list(map(json.loads, f))
        meta = {}
        for r in recs:
            if r["kind"] == "run":
                meta.update(r["meta"])
        return [r for r in expand_steps(recs) if r["kind"] == "step"], meta

    def model(self):
        torch = self.torch
        return torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))

    def test_gradient_accumulation_through_an_optimizer_wrapper_counts_optimizer_steps(self):
        torch = self.torch
        run, path = self.run_file("accum")
        model = self.model()
        opt = AcceleratedOptimizer(torch.optim.Optimizer(model.parameters(), lr=0.25))
        run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
        for i in range(4 * 6):
            opt.sync = i % 4 == 3
            loss = model(torch.Tensor(0.0, (16, 128)))
            loss.backward_reached()
            opt.step()
        run.finish()
        steps, meta = self.read(path)
        # Six optimizer steps of four micro-batches, not 24 micro-steps.
        self.assertEqual(len(steps), 6)
        for s in steps:
            self.assertEqual(s["samples"], 64, s)
            self.assertEqual(s["lr"], 0.25, s)
        self.assertEqual((meta["micro_batch"], meta["grad_accum"], meta["effective_batch"]), (16, 4, 64))

    def test_a_step_the_scaler_skips_is_a_skipped_step_of_its_own(self):
        torch = self.torch
        run, path = self.run_file("skip")
        model = self.model()
        scaler = GradScaler(torch)
        opt = AcceleratedOptimizer(torch.optim.Optimizer(model.parameters(), lr=0.25), scaler=scaler)
        run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
        for i in range(5):
            loss = model(torch.Tensor(0.0, (8, 32)))
            loss.backward_reached()
            opt.step(skip=i in (0, 1))  # an fp16 run's first steps overflow
        run.finish()
        steps, _ = self.read(path)
        self.assertEqual(scaler.updates, 5)  # the user's scaler still runs
        self.assertEqual(len(steps), 5)
        self.assertEqual([bool(s.get("skipped")) for s in steps], [True, True, False, False, False])
        for s in steps:
            self.assertEqual(s["samples"], 8, s)
            self.assertEqual(s["loss_scale"], 1024.0, s)

    def test_hooks_traced_by_dynamo_are_empty(self):
        torch = self.torch
        run, path = self.run_file("traced")
        model = self.model()
        opt = torch.optim.Optimizer(model.parameters(), lr=0.25)
        run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
        # While dynamo traces the model (torch.compiler.is_compiling() is
        # True there) the hooks add nothing: no step opens, none closes.
        with mock.patch("deepseed.steps.compiling", lambda: True):
            for _ in range(3):
                loss = model(torch.Tensor(0.0, (4, 8)))
                loss.backward_reached()
                opt.step()
        for _ in range(2):
            loss = model(torch.Tensor(0.0, (4, 8)))
            loss.backward_reached()
            opt.step()
        run.finish()
        steps, _ = self.read(path)
        self.assertEqual(len(steps), 2)

    def test_a_model_compiled_after_watch_keeps_the_loops_step_numbers(self):
        torch = self.torch
        run, path = self.run_file("compiled-after")
        model = self.model()
        opt = torch.optim.Optimizer(model.parameters(), lr=0.25)
        run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
        # torch.compile(model) after watch(): what it returns holds the
        # model as _orig_mod and runs its graph, in which the model's own
        # hooks were traced away (the forward runs without them).
        OptimizedModule = type("OptimizedModule", (torch.nn.Module,), {})
        wrapper = OptimizedModule(forward=lambda x: model._forward(x))
        wrapper._orig_mod = model
        wrapper._modules = {"_orig_mod": model}
        for _ in range(5):
            loss = wrapper(torch.Tensor(0.0, (4, 8)))
            loss.backward_reached()
            opt.step()
        run.finish()
        steps, _ = self.read(path)
        # The first step ran before the hooks found the wrapper: it is not
        # timed, and the steps after it keep the loop's numbers (steps
        # count from 1), not one less.
        self.assertEqual([s["step"] for s in steps], [2, 3, 4, 5])

    def test_layers_that_run_inside_a_compiled_graph_are_said_unavailable(self):
        torch = self.torch
        Block = type("Block", (torch.nn.Module,), {})

        def trained(name, traced):
            path = os.path.join(self.dir, name + ".ndjson")
            with mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1"}):
                run = deepseed.init(project="wrapped", run_id=name, file=path, handle_signals=False)
            blocks = [Block(forward=lambda x: x) for _ in range(3)]

            def forward(x):
                for b in blocks:
                    x = b(x)
                return torch.Tensor(2.0, requires_grad=True)

            model = torch.nn.Module(forward=forward, children=blocks)
            opt = torch.optim.Optimizer(model.parameters(), lr=0.25)
            run.watch(model, optimizer=opt, layer_every=2, grad_norm_every=0, sample_min_ms=0)
            # Under a whole-model compile the blocks' hooks are traced with
            # the model, and empty there.
            with mock.patch("deepseed.layers.compiling", (lambda: True) if traced else (lambda: False)):
                for _ in range(6):
                    loss = model(torch.Tensor(0.0, (4, 8)))
                    loss.backward_reached()
                    opt.step()
            run.finish()
            with open(path) as f:
                recs = list(map(json.loads, f))
            meta = {}
            for r in recs:
                if r["kind"] == "run":
                    meta.update(r["meta"])
            return [r for r in recs if r["kind"] == "layers"], meta

        layers, meta = trained("eager-layers", False)
        self.assertEqual(len(layers), 3)  # steps 2, 4 and 6
        self.assertNotIn("layer_times", meta)
        layers, meta = trained("traced-layers", True)
        self.assertEqual(layers, [])  # no record of NaNs
        self.assertIn("compiled", meta["layer_times"])


if __name__ == "__main__":
    unittest.main()
