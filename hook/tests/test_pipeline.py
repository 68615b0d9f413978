"""DeepSpeed's pipeline engine through the real watcher, with a fake engine
shaped like deepspeed.runtime.pipe.engine.PipelineEngine (v0.14) and the
torch stand-in of faketorch: one train_batch() is one step of this rank's
stage. No real pipeline has run through this: the engine's calls, timers
and attributes are modelled on DeepSpeed's source."""

import json
import os
import sys
import time
import types
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402
from .cases import quiet_tempdir  # noqa: E402

FWD_S, BWD_S, OPT_S = 0.002, 0.003, 0.004


class Timer:
    """DeepSpeed's SynchronizedWallClockTimer.Timer: elapsed() in ms."""

    def __init__(self):
        self.total = 0.0

    def elapsed(self, reset=True):
        v = self.total
        if reset:
            self.total = 0.0
        return v


class Optimizer:
    """The engine's fp16 optimizer wrapper: step(), cur_scale, param_groups."""

    def __init__(self):
        self.cur_scale = 65536.0
        self.param_groups = [{"lr": 1e-4}]
        self.steps = 0

    def step(self):
        time.sleep(OPT_S)
        self.steps += 1


class PipelineEngine:
    """What the hook reads of a PipelineEngine: train_batch() runs each
    micro-batch's forward (the stage's module, with its hooks) and backward,
    sends and receives between stages, then the optimizer step; step() and
    backward() refuse, as in pipeline mode."""

    def __init__(self, stage_id, num_stages=2, micro_batches=4, overflow_at=(), print_at=()):
        torch = sys.modules["torch"]
        self.stage_id, self.num_stages, self.micro_batches = stage_id, num_stages, micro_batches
        self.module = torch.nn.Module(forward=self._forward)
        self.optimizer = Optimizer()
        self.lr_scheduler = types.SimpleNamespace(total_num_steps=100)
        self.global_steps, self.skipped_steps = 0, 0
        self.world_size, self.dp_world_size = num_stages, 1
        self.overflow_at, self.print_at = set(overflow_at), set(print_at)
        self.lr = 1e-4
        self._timers = {n: Timer() for n in ("pipe_send_output", "pipe_send_grad", "pipe_recv_input",
                                             "pipe_recv_grad", "bwd_allreduce")}
        self.losses = []

    # The configuration accessors of DeepSpeedEngine.
    def zero_optimization_stage(self):
        return 1

    def fp16_enabled(self):
        return True

    def bfloat16_enabled(self):
        return False

    def train_micro_batch_size_per_gpu(self):
        return 2

    def gradient_accumulation_steps(self):
        return self.micro_batches

    def train_batch_size(self):
        return 2 * self.micro_batches

    def wall_clock_breakdown(self):
        return True

    def timers(self, name):
        return self._timers[name]

    def get_lr(self):
        return [self.lr]

    def get_global_grad_norm(self):
        return 1.25

    def is_gradient_accumulation_boundary(self):
        return True

    def step(self, *a, **kw):
        raise RuntimeError("Only train_batch() is accessible in pipeline mode.")

    def backward(self, *a, **kw):
        raise RuntimeError("Only train_batch() is accessible in pipeline mode.")

    def _forward(self, x):
        time.sleep(FWD_S)
        return sys.modules["torch"].Tensor(0.0, (2, 16, 8), requires_grad=True)

    def train_batch(self, data_iter=None):
        torch = sys.modules["torch"]
        self.module.train()
        first = self.stage_id == 0
        for _ in range(self.micro_batches):
            x = torch.Tensor(0.0, (2, 16), dtype="int64") if first else torch.Tensor(0.0, (2, 16, 8))
            if not first:
                self._timers["pipe_recv_input"].total += 0.5
            out = self.module(x)
            if first:
                self._timers["pipe_send_output"].total += 0.5
            # The gradient reaches the stage's output: its backward runs.
            out.backward_reached()
            time.sleep(BWD_S)
            self._timers["pipe_recv_grad" if first else "pipe_send_grad"].total += 0.25
        # _exec_optimizer_step -> _take_model_step -> optimizer.step()
        self.optimizer.step()
        self.global_steps += 1
        if self.global_steps in self.overflow_at:
            self.skipped_steps += 1
            self.optimizer.cur_scale /= 2
        self.lr *= 0.9
        loss = 5.0 - 0.1 * self.global_steps
        self.losses.append(loss)
        if self.global_steps in self.print_at:
            for t in self._timers.values():  # timers.log() resets them
                t.elapsed(reset=True)
        return torch.Tensor(loss)


def read(path):
    with open(path) as f:
        return expand_steps(json.loads(line) for line in f if line.strip())


class PipelineTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        self.dir = quiet_tempdir(self)

    def train(self, rank, steps=6, **kw):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        path = os.path.join(self.dir, "rank%d.ndjson" % rank)
        with mock.patch.dict(os.environ, env):
            run = deepseed.init(project="pipe", run_id="pipe1", file=path, handle_signals=False, layer_every=0)
            engine = PipelineEngine(stage_id=rank, **kw)
            self.assertIsNotNone(run.watch(engine), "watch refused the engine")
            for _ in range(steps):
                engine.train_batch()
            with self.assertRaises(RuntimeError):
                engine.step()  # still the engine's own: pipeline mode refuses it
            run.finish()
        self.assertNotIn("train_batch", vars(engine), "train_batch still wrapped after finish")
        self.assertNotIn("step", vars(engine.optimizer), "optimizer.step still wrapped after finish")
        return engine, read(path)

    def test_each_train_batch_is_one_step(self):
        engine, recs = self.train(0, overflow_at={3}, print_at={5})
        steps = [r for r in recs if r["kind"] == "step"]
        self.assertEqual([s["step"] for s in steps], [1, 2, 3, 4, 5, 6])
        mb = engine.micro_batches
        for i, s in enumerate(steps):
            self.assertAlmostEqual(s["loss"], engine.losses[i], places=6)
            self.assertGreaterEqual(s["forward_ms"], mb * FWD_S * 1000)
            self.assertGreaterEqual(s["backward_ms"], mb * BWD_S * 1000)
            self.assertGreaterEqual(s["optimizer_ms"], OPT_S * 1000)
            parts = s["forward_ms"] + s["backward_ms"] + s["optimizer_ms"]
            self.assertGreaterEqual(s["step_ms"] + 1e-3, parts)
            self.assertEqual(s["metrics"]["pipeline_stage"], 0.0)
            self.assertEqual(s["loss_scale"], 65536.0 if i < 2 else 32768.0)
            self.assertIs(s["skipped"], i == 2)
            self.assertEqual(s["grad_norm"], 1.25)
            self.assertAlmostEqual(s["lr"], 1e-4 * 0.9 ** (i + 1))
            self.assertEqual(s["samples"], mb * 2)
            self.assertEqual(s["tokens"], mb * 2 * 16)
        # Stage 0 sends activations and receives gradients: 0.5 + 0.25 ms a
        # micro-batch. The first step has no earlier total to difference,
        # the fifth's timers were reset when the engine printed.
        comm = [s.get("comm_ms") for s in steps]
        self.assertEqual(comm[0], None)
        self.assertEqual(comm[4], None)
        for i in (1, 2, 3):
            self.assertAlmostEqual(comm[i], mb * 0.75)
        overflow = [r for r in recs if r["kind"] == "event" and r["type"] == "overflow"]
        self.assertEqual([e["step"] for e in overflow], [3])

        meta = {}
        for r in recs:
            if r["kind"] == "run":
                meta.update(r["meta"])
        self.assertEqual(meta["parallelism"], "pipeline")
        self.assertEqual(meta["pipeline_stages"], 2)
        self.assertEqual(meta["total_steps"], 100)
        self.assertEqual(meta["zero_stage"], 1)
        self.assertEqual(meta["precision"], "fp16")
        self.assertEqual(meta["grad_accum"], mb)

    def test_later_stage_carries_its_stage(self):
        engine, recs = self.train(1, steps=3)
        steps = [r for r in recs if r["kind"] == "step"]
        self.assertEqual(len(steps), 3)
        for i, s in enumerate(steps):
            self.assertEqual(s["rank"], 1)
            self.assertEqual(s["metrics"]["pipeline_stage"], 1.0)
            # The broadcast loss, the same as the last stage's.
            self.assertAlmostEqual(s["loss"], engine.losses[i], places=6)
            self.assertGreaterEqual(s["backward_ms"], engine.micro_batches * BWD_S * 1000)
        # Only rank 0 sends the run record.
        self.assertFalse([r for r in recs if r["kind"] == "run"])
        self.assertAlmostEqual(steps[1]["comm_ms"], engine.micro_batches * 0.75)

    def test_user_total_steps_wins_over_the_scheduler(self):
        path = os.path.join(self.dir, "user.ndjson")
        with mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1"}):
            run = deepseed.init(project="pipe", file=path, handle_signals=False, total_steps=250)
            run.watch(PipelineEngine(stage_id=0))
            run.finish()
        meta = {}
        for r in read(path):
            if r["kind"] == "run":
                meta.update(r["meta"])
        self.assertEqual(meta["total_steps"], 250)


if __name__ == "__main__":
    unittest.main()
