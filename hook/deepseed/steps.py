"""A watched step's state and the hooks that drive it: the StepState opens
a step at the first training forward of the model after the last step
closed and closes it after the optimizer's step (or, without an
optimizer, when the next training forward begins after a backward).
Several forward/backward passes inside one step (gradient accumulation)
add up.

Its hooks run on the training thread every step: each one records an event
on the stream looked up at the step's start and keeps references; nothing
is read from the device here. A closed Step waits in the queue it shares
with the StepReader (readback.py) until its events have completed.

Which steps sample layers, phases and the gradient norm is decided here,
when a step opens.
"""

from __future__ import annotations

import time

import torch

from .compiled import compiling, cudagraphs_in_use
from .env import env_period, is_set
from .phases import phase_offset
from .readback import READ_EVERY_S, READ_PENDING
from .torch_utils import (fused_grad_norm, graph_task_id, in_backward, iter_tensors, output_loss, peak_memory_gb,
                          queue_callback)

# The gradient norm reads every gradient; by default it is taken every
# GRAD_NORM_EVERY steps (DEEPSEED_GRAD_NORM_EVERY, grad_norm_every=).
GRAD_NORM_EVERY = 10
# Forward, backward and optimizer times (and the synchronisation fields)
# take six more events and two autograd callbacks a step; a single process
# measures them every PHASE_EVERY steps (DEEPSEED_PHASE_EVERY,
# phase_every=), a distributed run every step (the per-rank truth compares
# the ranks' steps one by one). Step time, data time, loss, lr and
# throughput come every step. The timed steps fall half way between the
# layer steps (phase_offset), so that the layer profiler's own cost never
# lands in the phase times a breakdown averages.
PHASE_EVERY = 10
# In a single process, a sampled step (layers, phases, gradient norm) at its
# default period also comes no sooner than SAMPLE_MIN_MS after the previous
# one of its kind (DEEPSEED_SAMPLE_MIN_MS, sample_min_ms=; 0 turns the floor
# off; a period the caller set is kept exactly): each
# costs the training thread from about a hundred µs (phases, norm) to a
# millisecond or more (layers), which on steps of a few milliseconds would
# be most of what the hook costs. Steps of 25 ms or more keep their periods.
# A layer step, the costliest, comes no sooner than LAYER_FLOOR_TIMES the
# floor (1 s at the default) after the previous one: steps of 100 ms or more
# keep its period of 10, and on a real-sized model (steps of 40 ms, a layer
# step costing about a millisecond) layers cost about 0.1 % of the run
# instead of 0.25 %.
SAMPLE_MIN_MS = 250
LAYER_FLOOR_TIMES = 4
# The forward's end hook reads the loss a model returns and, on phase steps,
# marks the forward's end and the backward's start. When the first
# LOSS_PROBE_STEPS steps' outputs hold no loss, it is attached on phase
# steps only: a module with a hook of each kind costs every call more.
LOSS_PROBE_STEPS = 8
MEM_EVERY_S = 1.0
GRAPHS_CHECK_S = 0.5
FLUSH_PENDING = 16
_grad_enabled = torch.is_grad_enabled
_now = time.perf_counter  # the host clock of data time and the sampling floor


class Step:
    """One step's events (start, end, forward/backward/optimizer pairs, the
    synchronisation marks) and values (device values waiting in boxes,
    what the caller logged), from its open to its read-back. Opened every
    step on the training thread: what most steps leave as it is stays a
    class default, and only the lists a step appends to are its own."""

    ev_start = None
    opt = None
    ev_end = None
    samples = 0
    tokens = 0
    user = None
    user_step = False
    closed = False
    data_ms = None
    layer = None
    bwd_open = False
    ukeys = ()
    nxt_start = None
    open_ns = None  # host wall clock when open_ev was recorded
    open_ev = None  # the event recorded at the step's open, if any (its start, or its forward's)
    close_ns = None
    sync_end = None  # event after the end-of-backward collective
    host_arrive_ns = None  # host clock at the end of backward (no CUDA)
    host_release_ns = None
    phases = True  # forward, backward and optimizer timed (PHASE_EVERY)
    fwd_open = False  # a training forward began and has not returned
    comm = None  # comm.Spans: the step's timed collectives and waits
    nfwd = 0  # training forwards (micro-batches) in the step
    sid = None  # the stream its events are recorded on (EventPool.sid)
    lr = None  # the optimizer's learning rate, a number (a tensor one waits in boxes)

    def __init__(self, step):
        self.step = step
        self.fwd = []  # [start, end] pairs
        self.bwd = []
        self.losses = []  # Boxes, one per forward; the step's loss is their mean
        self.extra = {}
        self.boxes = []  # (key, Box) read once the device has them


class StepState:
    """The open step, the queue of closed ones, and the sampling plan of a
    :class:`deepseed.watch.Watcher`. Its hooks are registered by the
    Watcher (forward_pre, forward_post, optimizer_pre, optimizer_post), by
    a framework's adapter, or called by the PhaseMarks of a framework that
    marks phases itself.

    link is the run's :class:`~deepseed.link.RunLink`, whose next_step
    numbers the steps; reader is the StepReader that reads the queue back
    (it also holds the device clock's anchor and the last peak-memory
    reading); on_first_step is called once, when the first step opens."""

    def __init__(self, link, root, optimizer, adapter, pool, fetch, params, reader, pending, profiler, cuda=False,
                 dev_index=None, manual=False, batch_size=None, tokens_per_sample=None, layer_every=10,
                 grad_norm="auto", grad_norm_every=None, phase_every=None, sample_min_ms=None, layer_every_set=True,
                 on_first_step=None):
        self.link = link
        self.run = run = link.run
        self.root = root
        self.optimizer = optimizer
        self.adapter = adapter
        self.pool = pool
        self.fetch = fetch
        self.params = params
        self.reader = reader
        # True: each step is read at the next one's open (the host clock's
        # timers); False: in batches as steps close (readback.py).
        self.read_inline = True
        self.pending = pending
        self.profiler = profiler
        self.cuda = cuda
        self.dev_index = dev_index
        self.manual = bool(manual)
        self.batch_size = batch_size
        self.tokens_per_sample = tokens_per_sample
        self.on_first_step = on_first_step
        self.layer_every = int(layer_every or 0)
        self.grad_norm = grad_norm
        norm_set = grad_norm_every is not None or is_set("DEEPSEED_GRAD_NORM_EVERY")
        if grad_norm_every is None:
            grad_norm_every = env_period("DEEPSEED_GRAD_NORM_EVERY", GRAD_NORM_EVERY)
        self.grad_norm_every = max(0, int(grad_norm_every or 0))
        phase_set = phase_every is not None or is_set("DEEPSEED_PHASE_EVERY")
        if phase_every is None:
            phase_every = env_period("DEEPSEED_PHASE_EVERY", 1 if run.world_size > 1 else PHASE_EVERY)
        self.phase_every = max(1, int(phase_every))
        self.phase_off = 0
        if sample_min_ms is None:
            sample_min_ms = env_period("DEEPSEED_SAMPLE_MIN_MS", SAMPLE_MIN_MS)
        # A distributed run's ranks sample the same steps: by period alone.
        self.sample_min_s = max(0.0, float(sample_min_ms or 0)) / 1000.0 if run.world_size <= 1 else 0.0
        # A period the caller chose is kept exactly: the floor spaces the
        # default ones only.
        self.layer_floor = 0.0 if layer_every_set else self.sample_min_s * LAYER_FLOOR_TIMES
        self.phase_floor = 0.0 if phase_set else self.sample_min_s
        self.norm_floor = 0.0 if norm_set else self.sample_min_s
        self.layer_at = self.phase_at = self.norm_at = -1e9
        self.user_grad_norm = False
        self.sharded_grads = False
        self.batch_meta = True  # micro batch, accumulation and effective batch still to describe

        self.cur = None
        # The module whose hooks open steps: the watched root, or the
        # torch.compile wrapper around it (compiled.py). wrapped: its hooks
        # run around a compiled call (CompiledCall), not as module hooks.
        self.hook_root = root
        self.wrapped = False
        # Called once when an optimizer step comes with no step open: the
        # model's forward ran where the hooks are not (compiled after watch).
        self.on_unseen = None
        self.last_close_host = None
        # Peak memory is a running maximum; reading it costs ~100 µs, so it
        # is read at most every MEM_EVERY_S seconds and carried in between.
        self.mem_read_at = -1e9
        self.post_handle = None
        self.loss_seen = False
        self.loss_probe = LOSS_PROBE_STEPS
        self.compiled = False  # the watcher found the model, or a block of it, compiled
        self.graphs_at = -1e9

    def plan_phases(self):
        """Settles which steps time their phases, once the hooks are in.
        Sampling needs the optimizer's hooks to close a step: without them
        a step ends at the forward after its backward, which only the
        backward's hooks see. Frameworks that mark phases time them all."""
        if self.manual or self.adapter is not None or self.optimizer is None:
            self.phase_every = 1
        self.phase_off = phase_offset(self.phase_every, self.layer_every if self.profiler is not None else 0)

    # ---- hooks ----------------------------------------------------------------

    def forward_pre(self, module, args, kwargs):
        """The model's forward pre-hook: a training forward opens a step or
        joins the open one (the previous one closes first where no optimizer
        hook closes it). Empty where dynamo traces it (compiled.py)."""
        if compiling() or self.wrapped or module is not self.hook_root:
            return
        self.open_forward(module, args, kwargs)

    def open_forward(self, module, args, kwargs):
        """What forward_pre does, called directly around a compiled call."""
        try:
            if not module.training or not _grad_enabled() or (graph_task_id is not None and graph_task_id() != -1):
                return
            cur = self.cur
            if cur is not None:
                if cur.bwd:
                    self.end_open_backward(cur)
                    if self.optimizer is None and self.adapter is None:
                        self.close_step(self.pool.record())
                        cur = None
            if cur is None:
                cur = self.open_step()
            elif cur.phases:
                cur.fwd.append([self.pool.record(), None])
            cur.fwd_open = True
            cur.nfwd += 1
            self.count_batch(cur, args, kwargs)
        except Exception as e:
            self.link.warn_once("fwdpre", "deepseed: forward hook: %s", e)

    def forward_post(self, module, args, out):
        """The model's forward hook: keeps the loss the model returned and, on
        phase steps, marks the forward's end and hooks the backward's start."""
        if compiling() or self.wrapped or module is not self.hook_root:
            return
        self.close_forward(module, args, out)

    def close_forward(self, module, args, out):
        """What forward_post does, called directly around a compiled call."""
        try:
            cur = self.cur
            if cur is None or not cur.fwd_open or in_backward():
                return
            cur.fwd_open = False
            loss = output_loss(out)
            if loss is not None and self.wrapped_graphs(_now()):
                self.fetch.copy_now = True
            if loss is not None:
                cur.losses.append(self.fetch.add(loss))
                self.loss_seen = True
            if not cur.phases:
                return
            cur.fwd[-1][1] = self.pool.record()
            # The backward begins at the loss when the model computes it, else
            # at its first output (a loss computed outside the model begins
            # its backward there too).
            if loss is not None and loss.requires_grad:
                loss.register_hook(self.backward_start)
                return
            for t in iter_tensors(out):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self.backward_start)
                    break
        except Exception as e:
            self.link.warn_once("fwdpost", "deepseed: forward hook: %s", e)

    def attach_post(self):
        """Registers forward_post on the root (see LOSS_PROBE_STEPS)."""
        if self.post_handle is None and not self.wrapped:
            self.post_handle = self.hook_root.register_forward_hook(self.forward_post)

    def detach_post(self):
        h, self.post_handle = self.post_handle, None
        if h is not None:
            try:
                h.remove()
            except Exception:
                pass

    def backward_start(self, grad=None):
        """Marks the backward's start and queues backward_done to its end."""
        if compiling():
            return
        cur = self.cur
        if cur is None or cur.bwd_open:
            return
        cur.bwd_open = True
        cur.bwd.append([self.pool.record(), None])
        if queue_callback is not None and not self.manual:
            try:
                queue_callback(self.backward_done)
            except Exception:
                pass

    def backward_done(self):
        """Runs at the end of the backward, inside the autograd engine."""
        if compiling() or not self.end_backward():
            return
        # Queued from inside a callback, this runs after the callbacks
        # queued during the backward: DistributedDataParallel's, which
        # waits for (gloo) or makes the stream wait for (NCCL) the
        # gradient all-reduce. Its event marks the end of the collective.
        if queue_callback is not None:
            try:
                queue_callback(self.sync_done)
            except Exception:
                pass

    def end_backward(self):
        """Marks the end of the open backward (the rank's arrival at the
        synchronisation point); False when none was open."""
        cur = self.cur
        if cur is None or not cur.bwd or cur.bwd[-1][1] is not None:
            return False
        cur.bwd[-1][1] = self.pool.record()
        cur.bwd_open = False
        cur.host_arrive_ns = time.time_ns()
        if cur.sync_end is not None:  # an earlier micro-batch's
            self.pool.put(cur.sync_end)
        cur.sync_end = None
        cur.host_release_ns = None
        return True

    def sync_done(self):
        if compiling():
            return
        cur = self.cur
        if cur is None or cur.sync_end is not None or not cur.bwd:
            return
        cur.sync_end = self.pool.record()
        cur.host_release_ns = time.time_ns()

    def end_open_backward(self, cur):
        if cur.bwd and cur.bwd[-1][1] is None:
            cur.bwd[-1][1] = self.pool.record()
        cur.bwd_open = False

    def optimizer_pre(self, opt, args, kwargs):
        """The optimizer's step pre-hook."""
        if compiling():
            return
        try:
            cur = self.cur
            if cur is None:
                if self.on_unseen is not None:
                    fn, self.on_unseen = self.on_unseen, None
                    fn()
                return
            if not cur.phases:
                self.take_grad_norm(cur)
                return
            self.end_open_backward(cur)
            if cur.bwd and cur.sync_end is None:
                self.sync_done()
            self.take_grad_norm(cur)
            cur.opt = [self.pool.record(), None]
        except Exception as e:
            self.link.warn_once("optpre", "deepseed: optimizer hook: %s", e)

    def take_grad_norm(self, cur):
        """Adds the gradient norm to cur on the steps that take it."""
        # The norm's kernels go before the optimizer's start event so that
        # optimizer time is the optimizer's alone. One multi-tensor norm over
        # every gradient costs a read of all of them (about 0.5 ms of an H100
        # for BERT-large) and ~100 µs of launches, so it runs every
        # grad_norm_every steps.
        if (not self.grad_norm_every or cur.step % self.grad_norm_every or self.adapter is not None
                or self.grad_norm == "off" or self.user_grad_norm):
            return
        if self.grad_norm_every > 1 and self.norm_floor:
            now = _now()
            if now - self.norm_at < self.norm_floor:
                return
            self.norm_at = now
        gn = fused_grad_norm(self.params)
        if gn is not None:
            # Sharded gradients (FSDP) give this rank's part of the norm only.
            # Summing it over the ranks would take a collective inside the
            # hook, which hangs a job whose ranks do not all watch; the
            # model's norm is what model.clip_grad_norm_() returns, passed as
            # grad_norm=.
            cur.boxes.append(("grad_norm_shard" if self.sharded_grads else "grad_norm", self.fetch.add(gn)))

    def optimizer_post(self, opt, args, kwargs):
        """The optimizer's step post-hook: closes the step."""
        if compiling():
            return
        try:
            cur = self.cur
            if cur is None:
                return
            ev = self.pool.record()
            if cur.opt is not None:
                cur.opt[1] = ev
            self.read_lr(cur, opt or self.optimizer)
            if self.adapter is not None:
                self.adapter.after_step(cur)
            self.close_step(ev)
        except Exception as e:
            self.link.warn_once("optpost", "deepseed: optimizer hook: %s", e)

    def read_lr(self, cur, opt):
        """Adds opt's learning rate to cur unless the caller logged one."""
        if opt is None or "lr" in cur.ukeys:
            return
        try:
            lr = opt.param_groups[0]["lr"]
        except Exception:
            return
        if isinstance(lr, torch.Tensor):
            cur.boxes.append(("lr", self.fetch.add(lr)))
        else:
            cur.lr = lr

    # ---- open and close -------------------------------------------------------

    def open_step(self, forward=True):
        """Opens a step, decides what it samples and returns it (with its
        first forward begun, on a step that times its phases, unless
        forward is False: the forwards come later)."""
        link = self.link
        if self.on_first_step is not None:
            first, self.on_first_step = self.on_first_step, None
            first()
        now = _now()
        cur = Step(link.next_step)
        link.next_step += 1
        if self.last_close_host is not None:
            cur.data_ms = (now - self.last_close_host) * 1000.0
        pool = self.pool
        pool.use_current_stream(self.dev_index)
        cur.sid = pool.sid
        if self.cuda and self.reader.anchor is None:
            self.reader.take_anchor()
        if (self.profiler is not None and cur.step % self.layer_every == 0
                and (self.layer_every == 1 or now - self.layer_at >= self.layer_floor)):
            self.layer_at = now
            cur.layer = self.profiler.arm()
        if self.phase_every == 1:
            cur.phases = True
        else:
            # A layer step is no phase step unless every step is a layer step.
            cur.phases = (cur.step % self.phase_every == self.phase_off and (cur.layer is None or self.layer_every == 1)
                          and now - self.phase_at >= self.phase_floor)
            if cur.phases:
                self.phase_at = now
        if cur.phases and self.post_handle is None and not self.manual:
            self.attach_post()  # this step's forward is timed
        try:
            prev = self.pending[-1]
        except IndexError:
            prev = None
        if prev is None or prev.sid != cur.sid or prev.ev_end is None:
            cur.open_ns = time.time_ns()
            cur.ev_start = cur.open_ev = pool.record()
        else:
            # The step begins where the one before it ended, its data wait
            # included: one event a step where phases are not timed (an
            # event costs a launch-bound step more than the hook's Python).
            cur.ev_start = prev.ev_end
        if cur.phases and forward:
            if cur.open_ev is None:
                cur.open_ns = time.time_ns()
                cur.open_ev = pool.record()
            cur.fwd.append([cur.open_ev, None])  # the first forward begins here
        if prev is not None:
            prev.nxt_start = cur.ev_start
        self.cur = cur
        if self.pending and self.read_inline:
            self.reader.poll()
        return cur

    def close_step(self, ev_end):
        """Closes the open step at event ev_end and queues it for read-back."""
        cur = self.cur
        if cur is None:
            return
        self.end_open_backward(cur)
        cur.ev_end = ev_end
        cur.closed = True
        now = _now()
        cur.close_ns = time.time_ns()
        self.last_close_host = now
        if cur.layer is not None:
            self.profiler.disarm()
        if self.wrapped_graphs(now):
            self.fetch.copy_now = True
        if self.cuda and now - self.mem_read_at >= MEM_EVERY_S:
            self.mem_read_at = now
            self.reader.mem = peak_memory_gb(self.dev_index)
        extra = cur.extra
        parts = extra.pop("_loss_parts", None) if extra else None
        if parts and "loss" not in cur.ukeys:
            cur.boxes.append(("loss+", parts))
        elif cur.losses and "loss" not in cur.ukeys:
            cur.boxes.append(("loss", cur.losses))
        if extra:
            for k in [k for k, v in extra.items() if isinstance(v, torch.Tensor)]:
                cur.boxes.append((k, self.fetch.add(extra.pop(k))))
        if self.batch_meta and cur.nfwd and self.optimizer is not None:
            self.batch_meta = False
            self.describe_batch(cur)
        pending = self.pending
        pending.append(cur)
        self.cur = None
        if self.post_handle is not None and not self.loss_seen and self.phase_every > 1:
            if self.loss_probe > 0:
                self.loss_probe -= 1
            else:
                self.detach_post()  # until the next phase step
        # Values leave in batches, but before the steps waiting on them
        # would pass the stale guard.
        if self.fetch.due(now) or (len(pending) >= FLUSH_PENDING and self.fetch.waiting):
            self.fetch.flush()
        if not self.read_inline and (len(pending) >= READ_PENDING or now - self.reader.read_at >= READ_EVERY_S):
            self.reader.read_waiting()

    def scaler_update(self, scaler):
        """Runs before a GradScaler's update(), the end of a mixed-precision
        optimizer step: a step whose optimizer step the scaler skipped (inf
        or NaN gradients) closes here, marked skipped, instead of running
        into the next one as if it were a micro-batch of it; every step
        carries the loss scale it ran at."""
        if compiling():
            return
        try:
            scale = getattr(scaler, "_scale", None)
            if not isinstance(scale, torch.Tensor):
                scale = None
            cur = self.cur
            if cur is not None and cur.nfwd:
                cur.extra["skipped"] = True
                if scale is not None:
                    cur.extra["loss_scale"] = scale.detach().clone()
                self.close_step(self.pool.record())
            elif cur is None and scale is not None and self.pending:
                last = self.pending[-1]
                if last.nxt_start is None and "loss_scale" not in last.ukeys:
                    last.boxes.append(("loss_scale", self.fetch.add(scale.detach().clone())))
        except Exception as e:
            self.link.warn_once("scaler", "deepseed: GradScaler hook: %s", e)

    def wrapped_graphs(self, now):
        """True when values must be copied as they come: CUDA graph trees
        (compiled.cudagraphs_in_use) began replaying on this device. Asked
        every step of a model the watcher knows is compiled, and at most
        every GRAPHS_CHECK_S of one it does not (a module compiled out of
        its sight): a value a replay overwrote before that is lost (NaN),
        never wrong (Fetcher). now is the host clock (_now) of the call."""
        if not self.cuda or self.fetch.copy_now:
            return False
        if not self.compiled:
            if now - self.graphs_at < GRAPHS_CHECK_S:
                return False
            self.graphs_at = now
        return cudagraphs_in_use(self.dev_index)

    def describe_batch(self, cur):
        """The run's micro batch, gradient accumulation and effective batch,
        from the first optimizer step's forwards (each a micro-batch), where
        no framework said them."""
        meta = self.run.meta
        if meta.get("grad_accum") or meta.get("micro_batch"):
            return
        add = {"grad_accum": int(cur.nfwd)}
        if cur.samples:
            add["micro_batch"] = int(cur.samples // cur.nfwd)
            add["effective_batch"] = int(cur.samples) * max(1, int(self.run.world_size or 1))
        self.run.update_meta(**add)

    def attach(self, step, fields):
        """Joins values the user logged to the step in flight or the one just
        closed. Returns False when there is no such step."""
        slot = self.cur
        if slot is None and self.pending:
            last = self.pending[-1]
            if step is None or not last.user_step or step == last.step:
                slot = last
        if slot is None:
            return False
        if step is not None:
            slot.step = step
            slot.user_step = True
            self.link.next_step = step + 1
        if "grad_norm" in fields:
            self.user_grad_norm = True
        if slot.user is None:
            slot.user = {}
            slot.ukeys = set()
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                slot.boxes.append((k, self.fetch.add(v)))
            else:
                slot.user[k] = v
            slot.ukeys.add(k)
        if slot.closed and self.fetch.due(time.perf_counter()):
            self.fetch.flush()
        return True

    def count_batch(self, cur, args, kwargs):
        """Adds the samples and tokens of a forward's inputs to cur."""
        bs = self.batch_size
        if bs is not None:
            cur.samples += int(bs)
            if self.tokens_per_sample:
                cur.tokens += int(bs) * int(self.tokens_per_sample)
            return
        t = kwargs.get("input_ids") if kwargs else None
        if t is None and args and isinstance(args[0], torch.Tensor):
            t = args[0]
        if t is None:
            for x in iter_tensors(args):
                t = x
                break
        if t is None and kwargs:
            for x in iter_tensors(kwargs):
                t = x
                break
        if t is None:
            return
        shape = t.shape
        if not shape:
            return
        n = shape[0]
        cur.samples += n
        if len(shape) == 2 and not t.is_floating_point():
            cur.tokens += n * shape[1]
            if not self.run.meta.get("seq_len"):
                self.run.update_meta(seq_len=int(shape[1]))
        elif self.tokens_per_sample:
            cur.tokens += n * int(self.tokens_per_sample)
