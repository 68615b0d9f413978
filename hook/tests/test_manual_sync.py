"""The synchronisation fields of steps whose phases a framework callback
marks (manual=True, as the Lightning callback does), through the real
watcher with the torch stand-in of faketorch: records are built a step or
more after the step closed, each from its own step's marks."""

import importlib
import json
import logging
import os
import sys
import tempfile
import time
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402

# Each step waits longer at the synchronisation point than the one before.
WAIT_S = (0.005, 0.010, 0.015, 0.020, 0.025, 0.030)
DATA_S = 0.003


class FakeClock:
    """Stands in for the time module where the watcher and the host events
    read the clock: time moves only when the test advances it, so every
    figure a step carries is known exactly, however loaded the machine."""

    def __init__(self):
        self.ns = 1_735_689_600 * 10**9
        self.origin = self.ns

    def advance(self, seconds):
        self.ns += round(seconds * 1e9)

    def time_ns(self):
        return self.ns

    def time(self):
        return self.ns / 1e9

    def perf_counter(self):
        return 1000.0 + (self.ns - self.origin) / 1e9

    monotonic = perf_counter

    def __getattr__(self, name):  # sleep and the rest: the real ones
        return getattr(time, name)


class ManualSyncTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        tmp = tempfile.TemporaryDirectory(prefix="deepseed-test-")
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "run.ndjson")
        log = logging.getLogger("deepseed")
        self.addCleanup(log.setLevel, log.level)
        log.setLevel(logging.ERROR)
        self.clock = FakeClock()
        for name in ("deepseed.steps", "deepseed.torch_utils", "deepseed.readback"):
            p = mock.patch.object(importlib.import_module(name), "time", self.clock)
            p.start()
            self.addCleanup(p.stop)
        # The watcher keeps its host clock as a bound function (one lookup
        # less a step): that one is replaced too.
        p = mock.patch.object(importlib.import_module("deepseed.steps"), "_now", self.clock.perf_counter)
        p.start()
        self.addCleanup(p.stop)

    def test_each_step_carries_its_own_arrival_and_wait(self):
        torch = sys.modules["torch"]
        clock = self.clock
        run = deepseed.init(project="manual", run_id="manual1", file=self.path, handle_signals=False,
                            layer_every=0)
        model = torch.nn.Module(forward=lambda x: x)
        w = run.watch(model, manual=True, grad_norm_every=0)
        arrivals, closes, pending_seen = [], [], False
        for i, wait in enumerate(WAIT_S):
            clock.advance(DATA_S)  # the data loader
            for _ in range(2):  # two accumulated micro-batches
                w.step_begin(torch.Tensor(0.0, (4, 8)))
                clock.advance(0.001)
                loss = torch.Tensor(1.0 + i, requires_grad=True)
                w.backward_begin(loss)
                clock.advance(0.002)
                w.backward_end()
            arrivals.append(clock.time_ns())
            clock.advance(wait)  # the rank waits for its peers
            w.optimizer_begin()
            clock.advance(0.001)
            closes.append(clock.time())
            w.step_end(extra={"epoch": 0})
            pending_seen = pending_seen or len(w.pending) > 0
        run.finish()
        self.assertTrue(pending_seen, "no record was deferred")
        with open(self.path) as f:
            steps = [r for r in expand_steps(map(json.loads, f)) if r["kind"] == "step"]
        self.assertEqual([s["step"] for s in steps], list(range(1, len(WAIT_S) + 1)))
        for i, s in enumerate(steps):
            # Marked at the last micro-batch's backward end; the wait is
            # that step's own, however late the record was built.
            self.assertEqual(s["sync_ns"], arrivals[i])
            self.assertAlmostEqual(s["sync_wait_ms"], WAIT_S[i] * 1000, places=3,
                                   msg="step %d carries another step's wait" % s["step"])
            self.assertEqual(s["samples"], 8)
            # The record's time is when its step closed, not when it was
            # built (a step or more later).
            self.assertAlmostEqual(s["time"], closes[i], places=6, msg="step %d's time is not its close" % s["step"])
        for s in steps[1:]:
            self.assertAlmostEqual(s["data_ms"], DATA_S * 1000, places=3)


if __name__ == "__main__":
    unittest.main()
