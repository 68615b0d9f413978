"""Communication time of a distributed step (deepseed/comm.py) through the
real watcher, with the torch stand-in of faketorch plus a fake
torch.distributed and a fake torch.cuda.Event whose wait() stands for the
compute stream waiting on a collective. Timers are host events read from an
injected clock that the fake operations advance, so every duration below
is exact and none depends on how loaded the machine is."""

import json
import logging
import os
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

from . import faketorch  # noqa: E402

# What one step of the fake FSDP model takes on the injected clock, in ms.
ALL_GATHER, FWD_WAIT, FWD = 2.0, 5.0, 10.0
BWD_WAIT, BWD, REDUCE_SCATTER, OPT = 4.0, 20.0, 3.0, 1.0
# A wait of another stream (the all-gather stream on its copy-in): host
# time here, as everything is, but no wait of the compute stream.
SIDE_WAIT = 7.0
# What the compute stream waits on an asynchronous all-gather's work (ZeRO-3).
ZERO_WAIT = 6.0


class Clock:
    def __init__(self):
        self.t = 1000.0

    def perf_counter(self):
        return self.t

    def advance(self, ms):
        self.t += ms / 1000.0


class Stream:
    def __init__(self, compute):
        self.compute = compute


class Fixture(unittest.TestCase):
    """The fake torch.distributed and torch.cuda on the injected clock."""

    def setUp(self):
        self.addCleanup(faketorch.install())
        self.torch = sys.modules["torch"]
        self.clock = Clock()
        clock = self.clock

        def collective(ms):
            def fn(*args, async_op=False, **kwargs):
                clock.advance(ms)
                return None
            return fn

        class Event:
            delay_ms = 0.0

            def wait(self, stream=None):
                clock.advance(self.delay_ms)

            def synchronize(self):
                # The host waits until the event's stream has reached it.
                clock.advance(self.delay_ms)

        class CudaStream:
            """A stream whose synchronize() holds the host delay_ms."""
            delay_ms = 0.0

            def synchronize(self):
                clock.advance(self.delay_ms)

        class Work:
            """An asynchronous collective's work: waiting on it is the
            current stream waiting until the collective is done."""

            def __init__(self, ms):
                self.ms = ms

            def wait(self):
                clock.advance(self.ms)
                return True

        def async_gather(*args, async_op=False, **kwargs):
            if async_op:
                return Work(ZERO_WAIT)
            clock.advance(ALL_GATHER)

        self.Event, self.Work, self.CudaStream = Event, Work, CudaStream
        self.torch.distributed = types.SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: False, Work=Work, all_gather=async_gather,
            all_gather_into_tensor=collective(ALL_GATHER), reduce_scatter_tensor=collective(REDUCE_SCATTER))
        self.torch.cuda = types.SimpleNamespace(is_available=lambda: False, Event=Event, Stream=CudaStream,
                                                synchronize=lambda device=None: None)
        env = mock.patch.dict(os.environ, {"WORLD_SIZE": "2", "RANK": "0"})
        env.start()
        self.addCleanup(env.stop)
        import deepseed.torch_utils as tu
        tu.time = types.SimpleNamespace(perf_counter=clock.perf_counter)
        tmp = tempfile.TemporaryDirectory(prefix="deepseed-test-")
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "run.ndjson")
        log = logging.getLogger("deepseed")
        self.addCleanup(log.setLevel, log.level)
        log.setLevel(logging.ERROR)

    def wait(self, ms, compute=True):
        ev = self.Event()
        ev.delay_ms = ms
        ev.wait(Stream(compute))

    def steps(self, run):
        run.finish()
        with open(self.path) as f:
            return [r for r in expand_steps(map(json.loads, f)) if r["kind"] == "step"]



class CommTest(Fixture):
    def fsdp_run(self, steps=4):
        """A model that gathers its parameters and waits for them in its
        forward, waits again and reduce-scatters its gradients in its
        backward, as FSDP does."""
        torch, dist, clock = self.torch, self.torch.distributed, self.clock

        def forward(x):
            dist.all_gather_into_tensor(None, None)
            self.wait(FWD_WAIT)
            self.wait(SIDE_WAIT, compute=False)
            clock.advance(FWD)
            return torch.Tensor(1.0, requires_grad=True)

        model = torch.nn.Module(forward=forward)
        opt = torch.optim.Optimizer(model.parameters())
        run = deepseed.init(project="comm", run_id="comm1", file=self.path, handle_signals=False, layer_every=0)
        run.watch(model, optimizer=opt, grad_norm_every=0, background_read=False, phase_every=1)
        for _ in range(steps):
            loss = model(torch.Tensor(0.0, (4, 8)))
            loss.backward_reached()
            self.wait(BWD_WAIT)
            clock.advance(BWD)
            dist.reduce_scatter_tensor(None, None)
            clock.advance(0.5)
            opt.step()
            clock.advance(OPT)
        return self.steps(run)

    def test_fsdp_step_carries_its_communication_and_waits_as_its_sync_wait(self):
        steps = self.fsdp_run()
        self.assertEqual(len(steps), 4)
        for s in steps:
            self.assertEqual(s["comm_ms"], ALL_GATHER + REDUCE_SCATTER)
            # The collectives, blocking here, held the compute stream: they
            # are waits too.
            self.assertEqual(s["comm_exposed_ms"], FWD_WAIT + BWD_WAIT + ALL_GATHER + REDUCE_SCATTER)
            # The waits come out of the phases they fell in; a wait on
            # another stream stays in its phase.
            self.assertEqual(s["forward_ms"], SIDE_WAIT + FWD)
            self.assertEqual(s["backward_ms"], BWD + 0.5)
            # A rank is late by how much less it waited than its peers: no
            # arrival time, its whole exposed wait as its sync wait.
            self.assertNotIn("sync_ns", s)
            self.assertEqual(s["sync_wait_ms"], s["comm_exposed_ms"])
            named = s["forward_ms"] + s["backward_ms"] + s["comm_exposed_ms"] + s["optimizer_ms"]
            self.assertLessEqual(named, s["step_ms"] + 1e-6)

    def test_a_wait_inside_a_host_blocking_collective_is_waiting_not_work(self):
        # gloo: a blocking all-reduce holds the host (and the idle compute
        # stream) until the slowest peer arrives, here 40 ms after this
        # rank, as DeepSpeed's ZeRO-2 gradient reduction at the
        # accumulation boundary does between the backward and the step.
        torch, dist, clock = self.torch, self.torch.distributed, self.clock
        late = 40.0

        def all_reduce(*args, async_op=False, **kwargs):
            clock.advance(late)

        dist.all_reduce = all_reduce

        def forward(x):
            clock.advance(FWD)
            return torch.Tensor(1.0, requires_grad=True)

        model = torch.nn.Module(forward=forward)
        opt = torch.optim.Optimizer(model.parameters())
        run = deepseed.init(project="comm", run_id="gloo1", file=self.path, handle_signals=False, layer_every=0)
        run.watch(model, optimizer=opt, grad_norm_every=0, background_read=False, phase_every=1)
        for _ in range(3):
            loss = model(torch.Tensor(0.0, (4, 8)))
            loss.backward_reached()
            clock.advance(BWD)
            torch.distributed.all_reduce(None)
            opt.step()
            clock.advance(OPT)
        steps = self.steps(run)
        self.assertEqual(len(steps), 3)
        for s in steps:
            self.assertEqual(s["comm_exposed_ms"], late)
            self.assertEqual(s["sync_wait_ms"], late)
            self.assertEqual(s["forward_ms"], FWD)
            self.assertEqual(s["backward_ms"], BWD)  # the wait taken out of the backward it fell in
            # What is left of the step once its waits are out is this
            # rank's own work: no 40 ms of it.
            own = s["step_ms"] - s["sync_wait_ms"]
            self.assertAlmostEqual(own, FWD + BWD + OPT, delta=1.0)

    def test_no_communication_fields_in_a_single_process(self):
        with mock.patch.dict(os.environ, {"WORLD_SIZE": "1"}):
            steps = self.fsdp_run(steps=2)
        for s in steps:
            self.assertNotIn("comm_ms", s)
            self.assertNotIn("comm_exposed_ms", s)
            # The waits stay in the phase times.
            self.assertEqual(s["forward_ms"], ALL_GATHER + FWD_WAIT + SIDE_WAIT + FWD)

    def test_off_leaves_torch_distributed_alone(self):
        orig = self.torch.distributed.all_gather_into_tensor
        with mock.patch.dict(os.environ, {"DEEPSEED_COMM": "off"}):
            steps = self.fsdp_run(steps=2)
        self.assertIs(self.torch.distributed.all_gather_into_tensor, orig)
        self.assertNotIn("comm_ms", steps[0])

    def test_collectives_outside_a_step_pass_through_untimed(self):
        torch, dist = self.torch, self.torch.distributed
        model = torch.nn.Module(forward=lambda x: torch.Tensor(1.0, requires_grad=True))
        opt = torch.optim.Optimizer(model.parameters())
        run = deepseed.init(project="comm", run_id="comm2", file=self.path, handle_signals=False, layer_every=0)
        run.watch(model, optimizer=opt, grad_norm_every=0, background_read=False)
        for _ in range(3):
            dist.all_gather_into_tensor(None, None)  # between steps: a checkpoint's, an eval's
            self.wait(FWD_WAIT)
            model(torch.Tensor(0.0, (4, 8))).backward_reached()
            opt.step()
        steps = self.steps(run)
        self.assertEqual(len(steps), 3)
        for s in steps:
            self.assertNotIn("comm_ms", s)
            self.assertEqual(s.get("comm_exposed_ms", 0.0), 0.0)
            self.assertEqual(s["forward_ms"], 0.0)

    def test_ddp_exposed_communication_is_its_end_of_backward_wait(self):
        # DDP's compute stream waits for the gradient all-reduce once, at
        # the end of the backward: the window the watcher times.
        torch = self.torch
        run = deepseed.init(project="comm", run_id="comm3", file=self.path, handle_signals=False, layer_every=0)
        model = torch.nn.Module(forward=lambda x: x)
        w = run.watch(model, manual=True, grad_norm_every=0, background_read=False)
        for i in range(3):
            w.step_begin(torch.Tensor(0.0, (4, 8)))
            w.backward_begin(torch.Tensor(1.0, requires_grad=True))
            w.backward_end()
            w.optimizer_begin()
            w.step_end()
        for s in self.steps(run):
            self.assertIn("sync_ns", s)
            self.assertEqual(s["comm_exposed_ms"], s["sync_wait_ms"])
            self.assertNotIn("comm_ms", s)

    def test_zero3_waits_on_asynchronous_work_are_exposed(self):
        # ZeRO-3 gathers the next layer's parameters asynchronously and waits
        # on the work before using them.
        torch, dist, clock = self.torch, self.torch.distributed, self.clock

        def forward(x):
            work = dist.all_gather(None, None, async_op=True)
            clock.advance(FWD)
            work.wait()
            return torch.Tensor(1.0, requires_grad=True)

        model = torch.nn.Module(forward=forward)
        opt = torch.optim.Optimizer(model.parameters())
        run = deepseed.init(project="comm", run_id="comm4", file=self.path, handle_signals=False, layer_every=0)
        run.watch(model, optimizer=opt, grad_norm_every=0, background_read=False, phase_every=1)
        for _ in range(3):
            model(torch.Tensor(0.0, (4, 8))).backward_reached()
            clock.advance(BWD)
            opt.step()
        self.Work(1.0).wait()  # outside a step: not timed
        for s in self.steps(run):
            self.assertEqual(s["comm_exposed_ms"], ZERO_WAIT)
            self.assertEqual(s["forward_ms"], FWD)
            self.assertEqual(s["sync_wait_ms"], ZERO_WAIT)
            self.assertNotIn("sync_ns", s)

    def test_union_counts_overlap_once(self):
        from deepseed.comm import union_ms
        self.assertEqual(union_ms([]), 0.0)
        self.assertEqual(union_ms([(0, 2), (1, 3), (5, 6), (5.5, 5.6), (4, 4)]), 4.0)
        self.assertEqual(union_ms([(5, 6), (0, 1)]), 2.0)


# What a ZeRO-3 step with overlap_comm holds its host for, in ms: a wait for
# an earlier bucket's reduce-scatter inside the backward (too many in
# flight), and the wait for the reduce-scatter stream at the end of it.
BUCKET_WAIT, EPILOGUE_WAIT = 2.5, 9.0


class DeepSpeedTest(Fixture):
    """A stand-in DeepSpeed engine with ZeRO-3's shape of step: the backward
    ends inside autograd (its callbacks), the engine then waits on the host
    for its reduce-scatter stream, and its communication backend holds the
    torch.distributed functions it took when it started, before the model
    was watched."""

    def setUp(self):
        super().setUp()
        self.callbacks = []
        import deepseed.steps as steps
        clock = self.clock
        for patch in (mock.patch.object(steps, "queue_callback", self.callbacks.append),
                      # The backward's end and the callbacks' on the injected clock.
                      mock.patch.object(steps, "time", types.SimpleNamespace(
                          time_ns=lambda: int(clock.t * 1e9), perf_counter=clock.perf_counter))):
            patch.start()
            self.addCleanup(patch.stop)
        dist = self.torch.distributed
        # deepspeed.initialize: the backend keeps the functions as they are now.
        self.cdb = types.SimpleNamespace(all_gather_function=dist.all_gather_into_tensor,
                                         reduce_scatter_function=dist.reduce_scatter_tensor)
        mods = {"deepspeed": types.ModuleType("deepspeed"), "deepspeed.comm": types.ModuleType("deepspeed.comm"),
                "deepspeed.comm.comm": types.SimpleNamespace(cdb=self.cdb)}
        patch = mock.patch.dict(sys.modules, mods)
        patch.start()
        self.addCleanup(patch.stop)

    def engine(self):
        torch, clock, cdb, test = self.torch, self.clock, self.cdb, self
        reduce_stream = self.CudaStream()
        reduce_stream.delay_ms = EPILOGUE_WAIT
        bucket_event = self.Event()
        bucket_event.delay_ms = BUCKET_WAIT

        def forward(x):
            cdb.all_gather_function(None, None)
            clock.advance(FWD)
            return torch.Tensor(1.0, requires_grad=True)

        class Engine:
            module = torch.nn.Module(forward=forward)

        # ZeRO-3's partitioned parameters, and its pre-forward hook on the
        # root, registered when the engine was made: it gathers the root's
        # parameters (and starts the first blocks' prefetch).
        for p in Engine.module.parameters():
            p.ds_id = 0
        Engine.module.register_forward_pre_hook(lambda m, args, kwargs=None: cdb.all_gather_function(None, None))

        class Engine(Engine):

            def __call__(self, x):
                return self.module(x)

            def is_gradient_accumulation_boundary(self):
                return True

            def backward(self, loss):
                loss.backward_reached()
                clock.advance(BWD)
                # Autograd runs the gradient hooks on a thread of its own.
                t = threading.Thread(target=bucket_event.synchronize)
                t.start()
                t.join()
                cdb.reduce_scatter_function(None, None)
                while test.callbacks:  # autograd's end: the hook's callbacks
                    test.callbacks.pop(0)()
                # independent_gradient_partition_epilogue
                reduce_stream.synchronize()

            def step(self):
                clock.advance(OPT)

        return Engine()

    def train(self, engine, steps=3, run_id="ds1"):
        run = deepseed.init(project="comm", run_id=run_id, file=self.path, handle_signals=False, layer_every=0)
        run.watch(engine, grad_norm_every=0, background_read=False)
        for _ in range(steps):
            engine.backward(engine(self.torch.Tensor(0.0, (4, 8))))
            engine.step()
        return self.steps(run)

    def test_zero3_host_waits_are_the_exposed_communication(self):
        steps = self.train(self.engine())
        self.assertEqual(len(steps), 3)
        for s in steps:
            # The host waits and the blocking collectives (the root's
            # gather, in the engine's hook, is in the step).
            self.assertEqual(s["comm_exposed_ms"], BUCKET_WAIT + EPILOGUE_WAIT + 2 * ALL_GATHER + REDUCE_SCATTER)
            self.assertEqual(s["sync_wait_ms"], s["comm_exposed_ms"])
            self.assertNotIn("sync_ns", s)
            # The waits inside the backward come out of it; the one after it
            # is in no phase.
            self.assertEqual(s["backward_ms"], BWD)
            self.assertEqual(s["forward_ms"], FWD)

    def test_backend_started_before_the_hook_is_timed(self):
        dist = self.torch.distributed
        steps = self.train(self.engine())
        for s in steps:
            self.assertEqual(s.get("comm_ms"), 2 * ALL_GATHER + REDUCE_SCATTER)
        # The backend now holds the timed functions; a backend holding a
        # function of its own keeps it.
        self.assertIs(self.cdb.all_gather_function, dist.all_gather_into_tensor)
        self.assertIs(self.cdb.reduce_scatter_function, dist.reduce_scatter_tensor)

    def test_backend_function_of_its_own_is_kept(self):
        own = lambda *a, **k: self.clock.advance(ALL_GATHER)  # noqa: E731
        self.cdb.all_gather_function = own
        steps = self.train(self.engine())
        self.assertIs(self.cdb.all_gather_function, own)
        for s in steps:
            self.assertEqual(s.get("comm_ms"), REDUCE_SCATTER)  # both gathers by the backend's own

    def test_host_waits_outside_a_step_or_of_the_hook_are_not_timed(self):
        engine = self.engine()
        stream = self.CudaStream()
        stream.delay_ms = 50.0
        own = {"__name__": "deepseed.readback"}
        exec("def read(ev):\n    ev.synchronize()\n", own)
        ev = self.Event()
        ev.delay_ms = 40.0
        inner = engine.module._forward

        def forward(x):
            own["read"](ev)  # the hook reading its own events
            return inner(x)

        engine.module._forward = forward
        stream.synchronize()  # before the first step
        steps = self.train(engine)
        for s in steps:
            self.assertEqual(s["comm_exposed_ms"], BUCKET_WAIT + EPILOGUE_WAIT + 2 * ALL_GATHER + REDUCE_SCATTER)
            # It stays in the phase it fell in.
            self.assertEqual(s["forward_ms"], 40.0 + FWD)
