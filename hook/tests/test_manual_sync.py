"""The synchronisation fields of steps whose phases a framework callback
marks (manual=True, as the Lightning callback does), through the real
watcher with the torch stand-in of faketorch: records are built a step or
more after the step closed, each from its own step's marks."""

import json
import logging
import os
import sys
import tempfile
import time
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402

from . import faketorch  # noqa: E402

# Each step waits longer at the synchronisation point than the one before.
WAIT_S = (0.005, 0.010, 0.015, 0.020, 0.025, 0.030)
DATA_S = 0.003


class ManualSyncTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        tmp = tempfile.TemporaryDirectory(prefix="deepseed-test-")
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "run.ndjson")
        log = logging.getLogger("deepseed")
        self.addCleanup(log.setLevel, log.level)
        log.setLevel(logging.ERROR)

    def test_each_step_carries_its_own_arrival_and_wait(self):
        torch = sys.modules["torch"]
        run = deepseed.init(project="manual", run_id="manual1", file=self.path, handle_signals=False,
                            layer_every=0)
        model = torch.nn.Module(forward=lambda x: x)
        w = run.watch(model, manual=True, grad_norm_every=0)
        # Each step's marks are bracketed by clock readings taken around
        # them, so every check below is an order, true on a loaded machine.
        arrivals, marks, bwd_at, opt_at, closing, closes, pending_seen = [], [], [], [], [], [], False
        for i, wait in enumerate(WAIT_S):
            time.sleep(DATA_S)
            for k in range(2):  # two accumulated micro-batches
                w.step_begin(torch.Tensor(0.0, (4, 8)))
                loss = torch.Tensor(1.0 + i, requires_grad=True)
                w.backward_begin(loss)
                if k == 1:
                    marks.append(time.time_ns())
                    bwd_at.append(time.perf_counter())
                w.backward_end()
            arrivals.append(time.time_ns())
            time.sleep(wait)  # the rank waits for its peers
            w.optimizer_begin()
            opt_at.append(time.perf_counter())
            closing.append(time.time())
            w.step_end(extra={"epoch": 0})
            closes.append(time.time())
            pending_seen = pending_seen or len(w.pending) > 0
        run.finish()
        self.assertTrue(pending_seen, "no record was deferred")
        with open(self.path) as f:
            steps = [r for r in map(json.loads, f) if r["kind"] == "step"]
        self.assertEqual([s["step"] for s in steps], list(range(1, len(WAIT_S) + 1)))
        for i, s in enumerate(steps):
            self.assertIsInstance(s["sync_ns"], int)
            # Marked at the last micro-batch's backward end: between the
            # clock readings taken just before and just after it.
            self.assertLessEqual(marks[i], s["sync_ns"])
            self.assertLessEqual(s["sync_ns"], arrivals[i])
            # The wait: at least the sleep, at most the time from before
            # that backward end to after the optimizer began (rounded to
            # the microsecond), so never a neighbouring step's wait.
            self.assertGreaterEqual(s["sync_wait_ms"], WAIT_S[i] * 1000)
            self.assertLessEqual(s["sync_wait_ms"], (opt_at[i] - bwd_at[i]) * 1000 + 1e-3,
                                 "step %d carries another step's wait" % s["step"])
            self.assertEqual(s["samples"], 8)
            # The record's time is when its step closed, not when it was
            # built (a step or more later).
            self.assertLessEqual(closing[i] - 1e-6, s["time"], "step %d's time is not its close" % s["step"])
            self.assertLessEqual(s["time"], closes[i] + 1e-6)
        waits = [s["sync_wait_ms"] for s in steps]
        self.assertEqual(waits, sorted(waits), "waits out of step order: %s" % waits)
        for s in steps[1:]:
            self.assertGreaterEqual(s["data_ms"], DATA_S * 1000 * 0.9)


if __name__ == "__main__":
    unittest.main()
