"""Communication time of a distributed step, measured on the device
(docs/ranks.md): ``comm_ms``, the time during which at least one of the
step's collectives was in flight, and ``comm_exposed_ms``, the time the
compute stream spent waiting on communication instead of computing.

Collectives are timed by two events each: one recorded on the stream that
issues the collective just before it, one after it completed (on the same
stream for a blocking call, on a side stream made to wait on the returned
work otherwise). A blocking call on the compute stream (``async_op=False``;
on gloo the host itself waits there for the slowest peer, as DeepSpeed's
ZeRO-1/2 gradient reductions do) is also a wait of that stream, from its
issue to its end: its time is communication the step waited for, not
compute of the phase it was called in. DistributedDataParallel issues its all-reduces from C++, so
a DDP model gets a communication hook doing what DDP's default hook does
(average the bucket with one all-reduce) with those two events around it.
The functions of torch.distributed that FSDP (FSDP2's ``fully_shard`` and
FSDP1) and DeepSpeed ZeRO call are wrapped once per process; outside a
watched step the wrapper only passes the call on.

The compute stream's waits are timed where they are made: FSDP makes the
compute stream wait for an all-gather or a reduce-scatter with
``Stream.wait_event`` / ``wait_stream``, both of which end in
``torch.cuda.Event.wait``; DeepSpeed ZeRO-3 waits on the work an
asynchronous all-gather returned (``Work.wait``, which makes the current
stream wait), makes the compute stream wait for its all-gather stream
(``wait_stream``) and, with ``overlap_comm``, holds the host until its
reduce-scatter stream is done (``Stream.synchronize`` at the end of the
backward, ``Event.synchronize`` when too many all-gathers or
reduce-scatters are in flight). An event on the compute stream before the
wait and one after it span exactly the time that stream stood still: for a
host wait, from the moment the compute stream ran out of work (or the host
began to wait, if later) to the moment the host queued more. Waits on other
streams, the waits inside a timed collective and the hook's own reads of
its events pass straight through. DDP's wait, at the end of the backward,
is the synchronisation window the watcher already measures
(``sync_wait_ms``); waits inside that window are not timed twice.

DeepSpeed takes ``torch.distributed.all_gather_into_tensor`` and
``reduce_scatter_tensor`` once, when its communication backend starts
(``deepspeed.initialize``), usually before the model is watched; attaching
points that backend at the timed functions too.

Nothing here synchronizes: the events are read with the step's others, once
the device has run them. Under FSDP or ZeRO, where a rank waits for a late
peer at whichever collective comes first, a step's ``sync_wait_ms`` is its
whole exposed communication and the step carries no ``sync_ns``: the server
then ranks lateness by waits (the longest wait less the rank's own), which
needs no clock. The forward and backward times of such a step are their
compute time, the waits inside them taken out, so that the breakdown's
parts add up to the step.

Off with DEEPSEED_COMM=off."""

from __future__ import annotations

import functools
import os
import sys
import threading

import torch

from .compiled import compiling

# The torch.distributed functions timed. all_gather_object and the like go
# through these.
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "reduce_scatter",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "_all_gather_base", "_reduce_scatter_base")
# Host waits timed: torch.cuda.Stream.synchronize, torch.cuda.Event.synchronize
# and torch.cuda.synchronize.
HOST_WAITS = ("Stream.synchronize", "Event.synchronize", "synchronize")
# DeepSpeed's communication backend keeps these torch.distributed functions
# (attribute of the backend: the functions it may hold).
DEEPSPEED_CAPTURED = {"all_gather_function": ("all_gather_into_tensor", "_all_gather_base"),
                      "reduce_scatter_function": ("reduce_scatter_tensor", "_reduce_scatter_base")}
# A step keeps at most this many spans of each kind (a bound for a model
# with thousands of FSDP units; the rest are not timed).
MAX_SPANS = 4096
# Side streams timing collectives: one for each stream that issues them, up
# to this many (the rest share one).
MAX_SIDE = 8

_lock = threading.Lock()
_orig = {}  # name -> the function wrapped
_probe = None  # the CommProbe of the watcher timing steps now
_tls = threading.local()  # depth: a timed collective calling another


def enabled():
    return os.environ.get("DEEPSEED_COMM", "").strip().lower() not in ("off", "0", "false", "no")


def attach(steps):
    """A CommProbe for the model of a watcher's steps (a
    :class:`~deepseed.steps.StepState`), or None: a single process, a torch
    without torch.distributed, or DEEPSEED_COMM=off."""
    global _probe
    if steps.run.world_size <= 1 or not enabled():
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    p = CommProbe(steps)
    with _lock:
        _install(dist)
        _probe = p
    _rebind_deepspeed(dist)
    p.hook_ddp(steps.root)
    return p


def _rebind_deepspeed(dist):
    """Points DeepSpeed's communication backend, when it started before the
    hook wrapped torch.distributed, at the wrapped functions."""
    mod = sys.modules.get("deepspeed.comm.comm")
    cdb = getattr(mod, "cdb", None) if mod is not None else None
    if cdb is None:
        return
    for attr, names in DEEPSPEED_CAPTURED.items():
        held = getattr(cdb, attr, None)
        for name in names:
            if held is not None and held is _orig.get(name):
                try:
                    setattr(cdb, attr, getattr(dist, name))
                except (AttributeError, TypeError):
                    pass
                break


def opens_before(module):
    """Whether the watcher's forward pre-hook must run before the module's
    own: FSDP2 gathers the root's parameters (and may wait for them) in a
    pre-hook, and DeepSpeed ZeRO-3 (whose parameters carry a ``ds_id``)
    gathers the root's and starts prefetching the first blocks' in one;
    those then fall inside the step."""
    if any(c.__name__ == "FSDPModule" for c in type(module).__mro__):
        return True
    try:
        return any(hasattr(p, "ds_id") for p in module.parameters())
    except Exception:
        return False


def _install(dist):
    if _orig:
        return
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None or not callable(fn):
            continue
        _orig[name] = fn
        setattr(dist, name, _timed(fn))
    ev = getattr(getattr(torch, "cuda", None), "Event", None)
    if ev is not None and hasattr(ev, "wait"):
        _orig["Event.wait"] = ev.wait
        ev.wait = _timed_wait(ev.wait)
    work = getattr(dist, "Work", None)
    if work is not None and hasattr(work, "wait"):
        orig = work.wait
        try:
            work.wait = _timed_work_wait(orig)
            _orig["Work.wait"] = orig
        except (TypeError, AttributeError):  # a class that takes no attribute: untimed
            pass
    cuda = getattr(torch, "cuda", None)
    for name in HOST_WAITS:
        cls, _, attr = name.rpartition(".")
        owner = getattr(cuda, cls, None) if cls else cuda
        fn = getattr(owner, attr, None) if owner is not None else None
        if fn is None or not callable(fn):
            continue
        try:
            setattr(owner, attr, _timed_host_wait(fn))
            _orig[name] = fn
        except (TypeError, AttributeError):
            pass


def _wait_work(work):
    """Waits on a collective's work without timing the wait."""
    f = _orig.get("Work.wait")
    return f(work) if f is not None else work.wait()


def _timed(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if compiling():  # traced: the call as it is (compiled.py)
            return fn(*args, **kwargs)
        p = _probe
        if p is None or p.steps.cur is None or getattr(_tls, "depth", 0):
            return fn(*args, **kwargs)
        return p.collective(fn, args, kwargs)
    return call


def _timed_wait(fn):
    @functools.wraps(fn)
    def wait(event, stream=None):
        if compiling():  # traced: the call as it is (compiled.py)
            return fn(event, stream)
        p = _probe
        if p is None or p.steps.cur is None:
            return fn(event, stream)
        return p.wait(fn, event, stream)
    return wait


def _timed_work_wait(fn):
    @functools.wraps(fn)
    def wait(work, *args, **kwargs):
        if compiling():  # traced: the call as it is (compiled.py)
            return fn(work, *args, **kwargs)
        p = _probe
        if p is None or p.steps.cur is None or getattr(_tls, "depth", 0):
            return fn(work, *args, **kwargs)
        return p.timed_wait(None, fn, work, *args, **kwargs)
    return wait


def _timed_host_wait(fn):
    @functools.wraps(fn)
    def wait(*args, **kwargs):
        if compiling():  # traced: the call as it is (compiled.py)
            return fn(*args, **kwargs)
        p = _probe
        # Any thread's: autograd runs the backward's hooks (ZeRO's
        # reduce-scatters and their waits) on a thread of its own. The hook's
        # reads of its own events are its callers'.
        if (p is None or p.steps.cur is None or getattr(_tls, "depth", 0)
                or sys._getframe(1).f_globals.get("__name__", "").startswith(__package__ + ".")):
            return fn(*args, **kwargs)
        return p.timed_wait(p.steps.pool.stream if p.cuda else None, fn, *args, host=True, **kwargs)
    return wait


class Spans:
    """One step's timed collectives and compute-stream waits."""

    __slots__ = ("coll", "waits")

    def __init__(self):
        self.coll = []  # (start event, end event, the collective's name)
        self.waits = []  # (phase "f" / "b" / "o", start event, end event)


class CommProbe:
    """Times the collectives and waits of the open step of steps (a
    :class:`~deepseed.steps.StepState`); fill()
    turns them into the step record's fields when it is read back."""

    def __init__(self, steps):
        self.steps = steps
        self.cuda = steps.cuda
        self._free = []
        self._side = {}  # issuing stream's handle -> its side stream
        self.ddp = False
        # The last collective entered in a step, for the hang forensics
        # (hang.py): (name, number in the run, step, end event).
        self.seq = 0
        self.last = None

    # ---- events -----------------------------------------------------------

    def _event(self):
        if self._free:
            return self._free.pop()
        return self.steps.pool.get() if not self.cuda else torch.cuda.Event(enable_timing=True)

    def _record(self, stream=None):
        ev = self._event()
        if self.cuda:
            ev.record(stream if stream is not None else torch.cuda.current_stream())
        else:
            ev.record()
        return ev

    def _spans(self):
        cur = self.steps.cur
        if cur is None:
            return None
        s = cur.comm
        if s is None:
            s = cur.comm = Spans()
        return s

    # ---- collectives ---------------------------------------------------------

    def _side_stream(self, stream):
        """The side stream timing collectives issued on stream. Each issuing
        stream has its own: on one shared side stream a collective queued
        behind a stream that is late (ZeRO-3's reduce-scatters wait for the
        backward) would hold back the events of collectives issued on
        another (the all-gathers) that already ran."""
        key = getattr(stream, "cuda_stream", None)
        side = self._side.get(key)
        if side is None:
            if len(self._side) >= MAX_SIDE:
                key = None
                side = self._side.get(None)
            if side is None:
                side = self._side[key] = torch.cuda.Stream()
        return side

    def _start(self, pre, stream):
        """The start of a collective issued on stream after the event pre:
        an event on a side stream once both the issuing stream reached pre
        and the host had issued the collective. A stream that sat idle while
        the host prepared the call does not count it as communication.
        Returns the event and the side stream."""
        side = self._side_stream(stream)
        _orig["Event.wait"](pre, side)
        return self._record(side), side

    def collective(self, fn, args, kwargs):
        s = self._spans()
        if s is None or len(s.coll) >= MAX_SPANS:
            return fn(*args, **kwargs)
        name = getattr(fn, "__name__", "collective")
        stream = torch.cuda.current_stream() if self.cuda else None
        pre = self._record(stream)
        _tls.depth = 1
        try:
            out = fn(*args, **kwargs)
        finally:
            _tls.depth = 0
        blocking = out is None or not hasattr(out, "wait")
        if not self.cuda:
            e1 = self._record()
            s.coll.append((pre, e1, name))
            if blocking:
                self._blocked(s, pre, e1, stream)
            self.seq += 1
            self.last = (name, self.seq, self.steps.cur.step, e1)
            return out
        e0, side = self._start(pre, stream)
        if not blocking:
            # An asynchronous call: the side stream waits on the work,
            # which leaves the caller's streams as they were.
            with torch.cuda.stream(side):
                _wait_work(out)
            e1 = self._record(side)
        else:
            e1 = self._record(stream)
        s.coll.append((e0, e1, name))
        if not (blocking and self._blocked(s, pre, e1, stream)):
            self._free.append(pre)
        self.seq += 1
        self.last = (name, self.seq, self.steps.cur.step, e1)
        return out

    def _blocked(self, s, pre, e1, stream):
        """A collective that returned once it was done (async_op=False; on
        gloo the host itself waits in it for the slowest peer) held the
        compute stream from pre to e1: that span is a wait, counted as one
        (out of the phase it fell in, into the exposed communication), so
        that a rank's waits for a late peer never read as its own work.
        False when it is not counted: another stream's collective, or one
        inside the end-of-backward window the watcher times whole."""
        cur = self.steps.cur
        if len(s.waits) >= MAX_SPANS or not self._is_compute(stream):
            return False
        if cur.bwd and cur.bwd[-1][1] is not None and cur.sync_end is None and cur.opt is None:
            return False
        s.waits.append(("f" if cur.fwd_open else ("b" if cur.bwd_open else "o"), pre, e1))
        return True

    def hook_ddp(self, root):
        """Registers the timed all-reduce as DDP's communication hook; a
        model that has its own keeps it (and its all-reduces go untimed)."""
        if type(root).__name__ != "DistributedDataParallel" or not self.cuda:
            return
        try:
            if getattr(root, "_comm_hooks", None):
                return
            root.register_comm_hook(None, self._ddp_allreduce)
            self.ddp = True
        except Exception as e:
            self.steps.link.warn_once("commhook", "deepseed: communication hook: %s", e)

    def _ddp_allreduce(self, state, bucket):
        # What DDP's default hook does: the bucket's mean over the ranks,
        # with one asynchronous all-reduce.
        group = self.steps.root.process_group
        buf = bucket.buffer()
        buf.div_(group.size())
        s = self._spans()
        pre = self._record() if s is not None and len(s.coll) < MAX_SPANS else None
        work = _orig["all_reduce"](buf, group=group, async_op=True)
        if pre is not None:
            e0, side = self._start(pre, torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _wait_work(work)
            e1 = self._record(side)
            s.coll.append((e0, e1, "all_reduce (DDP)"))
            self._free.append(pre)
            self.seq += 1
            self.last = ("all_reduce (DDP)", self.seq, self.steps.cur.step if self.steps.cur else None, e1)
        return work.get_future().then(lambda f: f.value()[0])

    # ---- waits ---------------------------------------------------------------

    def _is_compute(self, stream):
        pool = self.steps.pool
        if not self.cuda:
            return getattr(stream, "compute", True)
        if stream is None:
            return torch.cuda.current_stream() == pool.stream
        return stream == pool.stream

    def wait(self, fn, event, stream):
        return self.timed_wait(stream, fn, event, stream)

    def timed_wait(self, stream, fn, *args, host=False, **kwargs):
        """Calls fn (a wait of stream, None: the current one), spanned by
        two events when that is the compute stream. A host wait (host=True)
        is spanned on the compute stream whatever it waits for."""
        cur = self.steps.cur
        s = self._spans()
        if s is None or len(s.waits) >= MAX_SPANS or not (host or self._is_compute(stream)):
            return fn(*args, **kwargs)
        if cur.bwd and cur.bwd[-1][1] is not None and cur.sync_end is None and cur.opt is None:
            # Inside the end-of-backward window the watcher times whole.
            return fn(*args, **kwargs)
        phase = "f" if cur.fwd_open else ("b" if cur.bwd_open else "o")
        rec_on = stream if stream is not None else (self.steps.pool.stream if self.cuda else None)
        e0 = self._record(rec_on)
        out = fn(*args, **kwargs)
        s.waits.append((phase, e0, self._record(rec_on)))
        return out

    # ---- read-back -----------------------------------------------------------

    def fill(self, slot, rec, sync):
        """Puts comm_ms and comm_exposed_ms in the step's record, the waits
        out of its forward and backward times and, where the compute stream
        waited on collectives, the exposed time as its sync_wait_ms (without
        sync_ns). Events not yet run are left out."""
        s = slot.comm
        slot.comm = None
        window = sync.get("sync_wait_ms")
        if s is None:
            if window is not None:
                rec["comm_exposed_ms"] = window
            return
        ref = slot.ev_start
        iv = []
        for e0, e1, _ in s.coll:
            if e1.query():
                iv.append((ref.elapsed_time(e0), ref.elapsed_time(e1)))
        by = {"f": 0.0, "b": 0.0, "o": 0.0}
        for ph, e0, e1 in s.waits:
            if e1.query():
                by[ph] += max(0.0, e0.elapsed_time(e1))
        if iv:
            rec["comm_ms"] = round(union_ms(iv), 4)
        waited = by["f"] + by["b"] + by["o"]
        exposed = waited + (window or 0.0)
        rec["comm_exposed_ms"] = round(exposed, 4)
        for ph, key in (("f", "forward_ms"), ("b", "backward_ms")):
            if by[ph] and key in rec:
                rec[key] = round(max(0.0, rec[key] - by[ph]), 4)
        if s.waits:
            sync["sync_wait_ms"] = rec["comm_exposed_ms"]
            sync.pop("sync_ns", None)
        free = self._free
        for e0, e1, _ in s.coll:
            free.extend((e0, e1))
        for _, e0, e1 in s.waits:
            free.extend((e0, e1))
        del free[4096:]

    def close(self):
        global _probe
        with _lock:
            if _probe is self:
                _probe = None


def union_ms(intervals):
    """The length of the union of (start, end) intervals."""
    tot, hi = 0.0, None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if hi is None or a > hi:
            tot += b - a
            hi = b
        elif b > hi:
            tot += b - hi
            hi = b
    return tot
