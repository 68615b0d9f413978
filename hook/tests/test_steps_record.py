"""The steps record: watched steps gathered as columns, and read back as
the step records the server stores."""

import json
import math
import os
import sys
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

from deepseed.records import StepColumns, expand_steps  # noqa: E402
from deepseed.localfile import encode  # noqa: E402


def wire(records):
    """The records as the server reads them: encoded, decoded, expanded."""
    return expand_steps(json.loads(line) for line in encode(records).decode().splitlines())


class StepColumnsTest(unittest.TestCase):
    def test_steps_come_back_as_the_step_records_they_were(self):
        cols = StepColumns("r1", 3)
        cols.add(7, 100.0, {"step_ms": 2.0, "samples": 4, "tokens": 512, "data_ms": 0.25}, {"lr": 0.1}, 0.0)
        cols.add(8, 100.5, {"step_ms": 4.0, "samples": 4, "tokens": 512, "forward_ms": 1.5},
                 {"lr": 0.1, "loss": float("nan"), "forward_ms": 1.23456, "skipped": 1, "acc": 2, "epoch": 1}, 0.0)
        cols.add(9, None, {"step_ms": 0.0, "samples": 4, "tokens": 512}, {"lr": 0.1, "throughput_sps": 7.0}, 0.0)
        recs = cols.records(flops_token=1e6, peak=100.0)
        self.assertEqual(len(recs), 1)
        rec = recs[0]
        # Values the same for every step travel once.
        self.assertEqual((rec["kind"], rec["run_id"], rec["rank"], rec["step"], rec["lr"], rec["samples"]),
                         ("steps", "r1", 3, [7, 8, 9], 0.1, 4))
        a, b, c = wire(recs)
        self.assertEqual(a, {"kind": "step", "run_id": "r1", "rank": 3, "step": 7, "time": 100.0, "step_ms": 2.0,
                             "samples": 4, "tokens": 512, "data_ms": 0.25, "lr": 0.1, "throughput_sps": 2000.0,
                             "throughput_tps": 256000.0, "tflops": 0.256, "mfu": 0.00256})
        # A caller's value wins over the measured one, rounded as durations
        # are; a name that is no step field goes to metrics.
        self.assertEqual(b["forward_ms"], 1.2346)
        self.assertTrue(math.isnan(b["loss"]))
        self.assertEqual((b["skipped"], b["epoch"], b["metrics"]), (True, 1.0, {"acc": 2.0}))
        self.assertNotIn("data_ms", b)
        # No time (the server stamps it) and no throughput from a zero step
        # time, but the one the caller gave.
        self.assertNotIn("time", c)
        self.assertEqual(c["throughput_sps"], 7.0)
        self.assertNotIn("tflops", c)
        self.assertNotIn("metrics", c)

    def test_a_callers_tflops_is_kept_without_a_derived_mfu_as_in_a_step_record(self):
        cols = StepColumns("r1", 0)
        cols.add(1, 100.0, {"step_ms": 2.0, "tokens": 512}, {"tflops": 9.0}, 0.0)
        cols.add(2, 100.5, {"step_ms": 2.0, "tokens": 512}, {}, 0.0)
        a, b = wire(cols.records(flops_token=1e6, peak=100.0))
        self.assertEqual(a["tflops"], 9.0)
        self.assertNotIn("mfu", a)
        self.assertEqual((b["tflops"], b["mfu"]), (0.256, 0.00256))

    def test_metrics_past_a_records_bound_split_the_steps(self):
        # Each step has few metrics, all of them together more than one
        # record may carry (256 names): the steps go in several records.
        cols = StepColumns("r", 0)
        for i in range(64):
            cols.add(i, float(i), {"step_ms": 1.0}, {"m%d_%d" % (i, j): float(j) for j in range(5)}, 0.0)
        recs = cols.records()
        self.assertGreater(len(recs), 1)
        for r in recs:
            self.assertLessEqual(len(r["metrics"]), 256)
        steps = wire(recs)
        self.assertEqual([s["step"] for s in steps], list(range(64)))
        self.assertEqual(steps[10]["metrics"], {"m10_%d" % j: float(j) for j in range(5)})


if __name__ == "__main__":
    unittest.main()
