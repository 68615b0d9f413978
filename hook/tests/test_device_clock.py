"""The device clock of read-back steps: a step's time (its end on the wall
clock) and its sync_ns come from CUDA events through the anchor taken at
the first step. A step that begins where the one before it ended is placed
from that end with one interval of its own; the others (a new stream, a
step whose events were lost) from the anchor. Either way every time is the
device's, and an event the pool hands out again never places a step from
where it was before. CUDA events are stood in for by events at known
device times whose intervals are float32 milliseconds, as CUDA's are."""

import os
import random
import struct
import sys
import types
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

from . import faketorch  # noqa: E402

WALL0 = 1_700_000_000_000_000_000  # the anchor's wall time, ns


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


class DeviceEvent:
    """An event the device ran at ns (device clock)."""

    def __init__(self, ns=None):
        self.ns = ns

    def elapsed_time(self, end):
        return f32((end.ns - self.ns) / 1e6)

    def query(self):
        return True


class DeviceClockTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        from deepseed.link import RunLink
        from deepseed.readback import StepReader
        from deepseed.steps import Step
        from deepseed.torch_utils import EventPool
        self.Step = Step
        run = types.SimpleNamespace(run_id="clock", rank=0, meta={})
        self.pool = EventPool(False)
        self.reader = StepReader(RunLink(run), None, self.pool, None, True, [])
        self.reader.anchor = DeviceEvent(0)
        self.reader.anchor_walls.append(WALL0)

    def event_at(self, ns):
        """An event from the pool, recorded anew at ns."""
        ev = self.pool._free.pop() if self.pool._free else DeviceEvent()
        ev.ns = ns
        return ev

    def test_times_are_the_devices_however_steps_begin_and_events_return(self):
        rng = random.Random(3)
        t = 5_000_000  # the first step begins 5 ms after the anchor
        prev_end = None
        slots, want = [], []
        for i in range(3000):
            s = self.Step(i + 1)
            # Most steps begin where the one before ended; every so often a
            # step records a start of its own (another stream, a gap).
            if prev_end is None or i % 37 == 0:
                t += rng.randint(0, 3_000_000)
                s.ev_start = self.event_at(t)
                if slots:
                    slots[-1].nxt_start = s.ev_start
            else:
                s.ev_start = prev_end
                slots[-1].nxt_start = prev_end
            t += rng.randint(1_000_000, 40_000_000)
            if i % 5 == 0:  # a timed backward: its end is the rank's arrival
                s.bwd = [[s.ev_start, self.event_at(t - 400_000)]]
            s.ev_end = prev_end = self.event_at(t)
            s.close_ns = WALL0 + t
            slots.append(s)
            want.append((t, t - 400_000 if i % 5 == 0 else None))
            # Steps are read back a few behind the newest, their events
            # returned to the pool as they are.
            if len(slots) > 4:
                self.check(slots.pop(0), want.pop(0))
        slots[-1].nxt_start = None
        for s, w in zip(slots, want):
            self.check(s, w)

    def check(self, slot, want):
        end_ns, arrive_ns = want
        step, fields, t, rec, layers = self.reader._build(slot)
        # Within what a float32 interval from the anchor resolves (a step
        # placed from the anchor is off by up to half its last place, and
        # the steps placed from it carry that), and a microsecond more for
        # t, a float of seconds: a step placed from an event the pool had
        # handed out again would be off by milliseconds to seconds.
        bound = end_ns * 2 ** -24 + 1000
        self.assertLess(abs(t * 1e9 - (WALL0 + end_ns)), bound, "step %d" % step)
        if arrive_ns is None:
            self.assertNotIn("sync_ns", rec)
        else:
            self.assertLess(abs(rec["sync_ns"] - (WALL0 + arrive_ns)), arrive_ns * 2 ** -24 + 10, "step %d" % step)


if __name__ == "__main__":
    unittest.main()
