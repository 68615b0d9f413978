"""Which steps carry forward, backward and optimizer times: every step of a
distributed run, every phase_every-th step of a single process (10 by
default: 5, 15, 25, half way between the layer steps), and step time, loss,
lr and samples on every step either way. Through the real watcher with the
torch stand-in of faketorch."""

import json
import os
import sys
import time
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402
from .cases import quiet_tempdir  # noqa: E402

PHASES = ("forward_ms", "backward_ms", "optimizer_ms")


class PhaseSamplingTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        self.dir = quiet_tempdir(self)

    def watched(self, name, **watch):
        """A run to a file and a watched model whose loss is 2.0; returns
        the run, the watcher, a function that trains n steps, and a
        function that reads the step records back."""
        torch = sys.modules["torch"]
        path = os.path.join(self.dir, name + ".ndjson")
        run = deepseed.init(project="phases", run_id=name, file=path, handle_signals=False, layer_every=0)
        model = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
        opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
        # The host steps here take microseconds: periods alone, unless a
        # test asks for the sampling floor.
        watch.setdefault("sample_min_ms", 0)
        w = run.watch(model, optimizer=opt, grad_norm_every=0, **watch)

        def train(n):
            for _ in range(n):
                loss = model(torch.Tensor(0.0, (4, 8)))
                loss.backward_reached()
                opt.step()

        def steps():
            with open(path) as f:
                return [r for r in expand_steps(map(json.loads, f)) if r["kind"] == "step"]

        return run, w, train, steps

    def train(self, name, steps=25, **watch):
        run, _, train, read = self.watched(name, **watch)
        train(steps)
        run.finish()
        return read()

    def assert_every_step_measured(self, steps):
        for s in steps:
            self.assertGreaterEqual(s["step_ms"], 0.0, s)
            self.assertEqual(s["loss"], 2.0, s)
            self.assertEqual(s["lr"], 0.125, s)
            self.assertEqual(s["samples"], 4, s)

    def test_single_process_times_phases_every_tenth_step(self):
        steps = self.train("single")
        self.assertEqual(len(steps), 25)
        self.assert_every_step_measured(steps)
        timed = [s["step"] for s in steps if all(k in s for k in PHASES)]
        self.assertEqual(timed, [5, 15, 25])
        for s in steps:
            if s["step"] not in timed:
                self.assertFalse(any(k in s for k in PHASES), s)

    def test_phase_every_one_times_every_step(self):
        steps = self.train("every", phase_every=1)
        self.assert_every_step_measured(steps)
        self.assertTrue(all(all(k in s for k in PHASES) for s in steps))

    def test_a_step_without_phases_costs_one_event_and_holds_its_data_wait(self):
        # A step whose phases are not timed begins where the one before it
        # ended: one event a step (each costs a launch-bound step more than
        # the hook's Python), and the data wait before a step inside its
        # step time, as its breakdown shows it.
        from deepseed import torch_utils
        run, w, train, read = self.watched("one-event")
        torch = sys.modules["torch"]
        model, opt = w.root, w.optimizer
        recorded = []
        real = torch_utils.EventPool.record

        def counted(pool):
            ev = real(pool)
            recorded.append(ev)
            return ev
        with mock.patch.object(torch_utils.EventPool, "record", counted):
            for i in range(30):
                before = len(recorded)
                time.sleep(0.004)  # the data loader
                loss = model(torch.Tensor(0.0, (4, 8)))
                loss.backward_reached()
                opt.step()
                if i + 1 not in (1, 5, 15, 25):  # the first has no step before it
                    self.assertEqual(len(recorded) - before, 1, "step %d" % (i + 1))
        run.finish()
        steps = read()
        self.assertEqual([s["step"] for s in steps], list(range(1, 31)))
        for s in steps:
            if s["step"] > 1:
                self.assertGreaterEqual(s["data_ms"], 4.0, s)
                self.assertGreaterEqual(s["step_ms"], s["data_ms"], s)
            if "forward_ms" in s:
                self.assertLessEqual(s["forward_ms"] + s["backward_ms"] + s["optimizer_ms"], s["step_ms"], s)

    def test_environment_sets_the_period(self):
        with mock.patch.dict(os.environ, {"DEEPSEED_PHASE_EVERY": "5"}):
            steps = self.train("env")
        timed = [s["step"] for s in steps if "forward_ms" in s]
        self.assertEqual(timed, [2, 7, 12, 17, 22])

    def test_background_reader_emits_every_step_in_order(self):
        # The reader thread a GPU run uses, here on host timers: records
        # leave while training runs, in step order, none lost at finish.
        run, w, train, read = self.watched("bg", background_read=True)
        self.assertTrue(w.reader.thread.is_alive())
        emitted_while_training = 0
        for _ in range(10):
            train(20)
            time.sleep(0.05)  # the reader's turn
            emitted_while_training = run.steps_logged
        self.assertGreater(emitted_while_training, 100, "the reader emitted nothing while training ran")
        run.finish()
        self.assertFalse(w.reader.thread.is_alive())
        steps = read()
        self.assertEqual([s["step"] for s in steps], list(range(1, 201)))
        self.assert_every_step_measured(steps)

    def test_steps_left_by_a_loop_that_stopped_are_read_without_the_next_step(self):
        # A few short steps, then no more (evaluation, a checkpoint): too few
        # for the training thread's batch, so the reader thread reads them;
        # the last waits for the next step's start, which its time runs to.
        run, w, train, read = self.watched("late", background_read=True)
        train(5)
        deadline = time.monotonic() + 60
        while run.steps_logged < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(run.steps_logged, 4)
        run.finish()
        self.assertEqual([s["step"] for s in read()], [1, 2, 3, 4, 5])

    def test_close_inside_the_runs_lock_is_bounded_and_loses_nothing(self):
        # A signal handler that finishes the run can interrupt the training
        # thread inside the run's lock while the reader waits for that lock
        # to hand over a step it built.
        run, w, train, read = self.watched("lock", background_read=True)
        with run._lock:
            train(50)
            time.sleep(0.1)  # the reader builds a step and waits for the lock
            # close() returns here, in the thread holding the lock the
            # reader waits for (a deadlock would never return), and loses
            # nothing.
            w.close(wait=True)
        w.reader.thread.join(2.0)
        self.assertFalse(w.reader.thread.is_alive())
        run.finish()
        self.assertEqual(sorted(s["step"] for s in read()), list(range(1, 51)))

    def test_layer_records_carry_their_steps_time(self):
        # A layers record is stamped with its step's end, as the step record
        # is: not with a duration mistaken for a time.
        torch = sys.modules["torch"]
        path = os.path.join(self.dir, "layers.ndjson")
        run = deepseed.init(project="phases", run_id="layers", file=path, handle_signals=False, layer_every=5)
        a, b = torch.nn.Module(forward=lambda x: x), torch.nn.Module(forward=lambda x: x)
        model = torch.nn.Module(forward=lambda x: b(a(x)) and torch.Tensor(2.0, requires_grad=True),
                                children=[a, b])
        opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
        before = time.time()
        run.watch(model, optimizer=opt, grad_norm_every=0, layers=["0", "1"], sample_min_ms=0)
        for _ in range(12):
            loss = model(torch.Tensor(0.0, (4, 8), requires_grad=True))
            loss.backward_reached()
            opt.step()
        run.finish()
        with open(path) as f:
            recs = expand_steps(map(json.loads, f))
        steps = {r["step"]: r for r in recs if r["kind"] == "step"}
        layers = [r for r in recs if r["kind"] == "layers"]
        self.assertEqual([r["step"] for r in layers], [5, 10])
        for r in layers:
            self.assertEqual(r["names"], ["0", "1"])
            self.assertGreaterEqual(r["time"], before)
            self.assertEqual(r["time"], steps[r["step"]]["time"])
        # The phases of a layer step would carry the layer profiler's cost:
        # with layers every 5 steps they are timed on 6, 16, ….
        self.assertEqual([s for s in sorted(steps) if "forward_ms" in steps[s]], [6])

    def test_short_steps_sample_no_sooner_than_the_floor(self):
        # On steps of about 5 ms (an injected clock), phases and the
        # gradient norm come every 10 steps but no sooner than 250 ms after
        # the previous of their kind, layers no sooner than 1 s; on 26 ms
        # steps the periods of phases and norm hold, layers come every 40
        # steps; on 101 ms steps every period holds.
        from deepseed import steps as steps_mod
        torch = sys.modules["torch"]
        every10, phases10 = list(range(10, 121, 10)), list(range(5, 121, 10))
        # The third case sets the periods itself: they are kept exactly,
        # however short the step.
        for step_s, want_layers, want_norms, want_phases, periods in (
                (0.00505, [10], [10, 60, 110], [5, 55, 105], {}),
                (0.026, [10, 50, 90], every10, phases10, {}),
                (0.101, every10, every10, phases10, {}),
                (0.00505, every10, every10, phases10, {"layer_every": 10, "phase_every": 10, "grad_norm_every": 10})):
            clock = [1000.0]
            path = os.path.join(self.dir, "floor%g%d.ndjson" % (step_s, len(periods)))
            with mock.patch.object(steps_mod, "_now", lambda: clock[0]), \
                    mock.patch.object(steps_mod, "fused_grad_norm", lambda params: torch.Tensor(3.0)):
                run = deepseed.init(project="phases", run_id="floor", file=path, handle_signals=False)
                a, b = torch.nn.Module(forward=lambda x: x), torch.nn.Module(forward=lambda x: x)
                model = torch.nn.Module(forward=lambda x: b(a(x)) and torch.Tensor(2.0, requires_grad=True),
                                        children=[a, b])
                opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
                w = run.watch(model, optimizer=opt, layers=["0", "1"], **periods)
                self.assertEqual(w.steps.sample_min_s, 0.25)
                for _ in range(120):
                    clock[0] += step_s
                    loss = model(torch.Tensor(0.0, (4, 8), requires_grad=True))
                    loss.backward_reached()
                    opt.step()
                run.finish()
            with open(path) as f:
                recs = expand_steps(map(json.loads, f))
            steps = [r for r in recs if r["kind"] == "step"]
            self.assertEqual([r["step"] for r in steps], list(range(1, 121)), step_s)
            self.assertEqual([r["step"] for r in recs if r["kind"] == "layers"], want_layers, step_s)
            self.assertEqual([r["step"] for r in steps if "forward_ms" in r], want_phases, step_s)
            self.assertEqual([r["step"] for r in steps if "grad_norm" in r], want_norms, step_s)
            self.assertTrue(all(r["grad_norm"] == 3.0 for r in steps if "grad_norm" in r))

    def test_forward_end_hook_only_on_phase_steps_without_an_output_loss(self):
        # A model whose output is no loss (the loss is computed outside)
        # keeps its forward's end hook for the first steps and then on
        # phase steps only; those still carry their phases, and every step
        # its step time. A model returning its loss keeps the hook.
        torch = sys.modules["torch"]
        for name, out, want_hooked in (("noloss", lambda x: torch.Tensor(2.0, (4, 1), requires_grad=True), False),
                                       ("loss", lambda x: torch.Tensor(2.0, requires_grad=True), True)):
            path = os.path.join(self.dir, name + ".ndjson")
            run = deepseed.init(project="phases", run_id=name, file=path, handle_signals=False, layer_every=0)
            model = torch.nn.Module(forward=out)
            opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
            run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
            hooked = []
            for _ in range(40):
                y = model(torch.Tensor(0.0, (4, 8)))
                hooked.append(len(model._post) == 1)
                y.backward_reached()
                opt.step()
            run.finish()
            self.assertEqual(model._post, [], name)  # finish() leaves no hook behind
            if want_hooked:
                self.assertTrue(all(hooked), name)
            else:
                # Steps 1-9 probe for a loss; then only the phase steps 15, 25, 35.
                self.assertEqual([i + 1 for i, h in enumerate(hooked) if h], list(range(1, 10)) + [15, 25, 35])
            with open(path) as f:
                steps = [r for r in expand_steps(map(json.loads, f)) if r["kind"] == "step"]
            self.assertEqual([s["step"] for s in steps], list(range(1, 41)), name)
            self.assertTrue(all(s["step_ms"] >= 0 and s["samples"] == 4 for s in steps), name)
            timed = [s["step"] for s in steps if all(k in s for k in PHASES)]
            self.assertEqual(timed, [5, 15, 25, 35], name)
            self.assertEqual(all(s.get("loss") == 2.0 for s in steps), want_hooked, name)

    def test_a_server_without_steps_records_gets_a_record_a_step(self):
        # A server or collector older than the steps record refuses it with
        # a 400 naming the kind: the batch goes again as step records, and
        # so does every later one; nothing is rejected.
        from .capture import Capture
        torch = sys.modules["torch"]
        cap = Capture(refuse_steps=True)
        self.addCleanup(cap.close)
        with self.assertLogs("deepseed", "WARNING") as logs:
            run = deepseed.init(project="phases", run_id="oldserver", collector_url=cap.url, handle_signals=False,
                                layer_every=0, batch_size=50)
            model = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
            opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
            run.watch(model, optimizer=opt, grad_norm_every=0, sample_min_ms=0)
            for _ in range(150):
                model(torch.Tensor(0.0, (4, 8))).backward_reached()
                opt.step()
            run.finish()
        steps = cap.records("step")
        self.assertEqual([s["step"] for s in steps], list(range(1, 151)))
        self.assert_every_step_measured(steps)
        self.assertEqual(len(cap.raw_lines("step")), 150)  # sent as step records
        self.assertEqual(cap.raw_lines("steps"), [])  # none accepted
        refused = [r for r in cap.requests if r[4] == 400]
        self.assertEqual(len(refused), 1)
        self.assertEqual((run.sender.rejected, run.sender.dropped), (0, 0))
        self.assertIn("takes no steps records", "\n".join(logs.output))

    def test_distributed_run_samples_by_period_alone(self):
        with mock.patch.dict(os.environ, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}):
            run, w, _, _ = self.watched("distfloor", sample_min_ms=None)
            self.assertEqual(w.steps.sample_min_s, 0.0)
            run.finish()
        with mock.patch.dict(os.environ, {"DEEPSEED_SAMPLE_MIN_MS": "250"}):
            run, w, _, _ = self.watched("envfloor", sample_min_ms=None)
            self.assertEqual(w.steps.sample_min_s, 0.25)
            run.finish()

    def test_phase_steps_fall_between_layer_steps(self):
        from deepseed.phases import phase_offset
        for every, layers in ((10, 10), (10, 5), (10, 20), (10, 2), (5, 10), (4, 2), (2, 2), (10, 0), (10, 1)):
            off = phase_offset(every, layers)
            phase_steps = [s for s in range(1, 200) if s % every == off]
            self.assertGreaterEqual(len(phase_steps), 199 // every, (every, layers, off))
            if layers > 1:
                self.assertFalse([s for s in phase_steps if s % layers == 0], (every, layers, off))

    def test_anchor_window_keeps_the_largest_of_the_newest(self):
        # The device clock's anchor is the largest of the newest lower bounds.
        import random
        from deepseed.readback import WindowMax
        rng = random.Random(7)
        for keep in (1, 2, 5, 256):
            w, seen = WindowMax(keep), []
            for _ in range(2000):
                v = rng.choice((rng.randint(0, 50), rng.randint(0, 10**12)))
                w.append(v)
                seen.append(v)
                self.assertEqual(w.max(), max(seen[-keep:]))
                self.assertEqual(len(w), min(len(seen), keep))

    def test_a_period_that_is_no_number_keeps_the_default(self):
        # A typo in a period must neither stop the script nor switch the
        # watcher off: the default holds and the log says which variable.
        env = {"DEEPSEED_PHASE_EVERY": "ten", "DEEPSEED_LAYER_EVERY": "x", "DEEPSEED_GRAD_NORM_EVERY": "1O"}
        torch = sys.modules["torch"]
        path = os.path.join(self.dir, "typo.ndjson")
        with mock.patch.dict(os.environ, env), self.assertLogs("deepseed", "WARNING") as logs:
            run = deepseed.init(project="phases", run_id="typo", file=path, handle_signals=False)
            model = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
            opt = torch.optim.Optimizer(model.parameters(), lr=0.125)
            w = run.watch(model, optimizer=opt)
            for _ in range(12):
                model(torch.Tensor(0.0, (4, 8))).backward_reached()
                opt.step()
            run.finish()
        self.assertIsNotNone(w, "watch() gave up")
        self.assertEqual((run.layer_every, w.steps.phase_every, w.steps.grad_norm_every), (10, 10, 10))
        with open(path) as f:
            timed = [r["step"] for r in expand_steps(map(json.loads, f)) if r["kind"] == "step" and "forward_ms" in r]
        self.assertEqual(timed, [5])
        said = "\n".join(logs.output)
        for name in env:
            self.assertIn(name, said)

    def test_distributed_run_times_every_step(self):
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
        with mock.patch.dict(os.environ, env):
            steps = self.train("dist")
        self.assertEqual(len(steps), 25)
        self.assert_every_step_measured(steps)
        self.assertTrue(all(all(k in s for k in PHASES) for s in steps))


if __name__ == "__main__":
    unittest.main()
