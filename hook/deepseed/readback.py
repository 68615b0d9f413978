"""The read-back of watched steps: a step's events and values wait in the
watcher's queue until the device has run them, then become the step's
entries in the columns of a steps record (phase times, synchronisation
fields on the wall clock through the device-clock anchor) and, on armed
steps, the layers record.

A StepReader, owned by the Watcher, reads the queue of closed steps it
shares with the StepState (steps.py). On a GPU it runs on a reader thread
of its own (the training thread only queues closed steps): the reader
wakes every READ_EVERY_S, or when READ_WAKE_PENDING steps wait, and reads
the steps whose events completed, in order and in batches (one device
query vouches for a batch: events of one stream complete in order),
sleeping READ_YIELD_S after every READ_BATCH of them so that the training
thread, when it wants the interpreter back, waits for a few steps'
read-back at most. Each wake-up and each device query hands the
interpreter between the threads, which costs the training thread more
than the work itself: they are few. Much of it then runs while the training thread
is inside backward() or waiting for the device, with the interpreter
free. Elsewhere (the host clock's timers, tests) it runs on the training
thread, at a step's open and at the run's end."""

from __future__ import annotations

import collections
import threading
import time

import torch

from .layers import events_of
from .records import MS_DECIMALS, STEPS_MAX_AGE_S, STEPS_PER_RECORD, StepColumns, round_ms

# What a run's layer_times metadata says when its layer hooks never ran.
NO_LAYER_HOOK = ("unavailable: no layer hook ran in a profiled step; the layers run inside a compiled graph "
                 "(torch.compile of the whole model), so compile each block instead (block.compile()) to time them")
MAX_PENDING = 256
ANCHOR_KEEP = 256
ANCHOR_EVERY = 4
READ_EVERY_S = 0.1
# The training thread wakes the reader sooner when this many closed steps
# wait (steps.py), so that short steps are read in batches of about this
# size, not one by one as they come.
READ_WAKE_PENDING = 32
READ_YIELD_S = 2e-5
READ_BATCH = 16  # steps built under the read lock between two yields of the interpreter


def _ms_sum(pairs):
    """The summed milliseconds of (start, end) event pairs, None if none
    is complete."""
    tot, n = 0.0, 0
    for a, b in pairs:
        if a is not None and b is not None:
            tot += a.elapsed_time(b)
            n += 1
    return tot if n else None


def _nonneg_ms(v):
    # round_ms(max(0.0, v)), NaN included, in one call.
    return round(v, MS_DECIMALS) if v > 0 else 0.0


class WindowMax:
    """The largest of the last `keep` values appended, kept as they come
    (a queue of decreasing candidates) instead of scanned at every read."""

    __slots__ = ("keep", "n", "q")

    def __init__(self, keep):
        self.keep = keep
        self.n = 0
        self.q = collections.deque()  # (index, value), values decreasing

    def append(self, v):
        q = self.q
        while q and q[-1][1] <= v:
            q.pop()
        q.append((self.n, v))
        self.n += 1
        while q[0][0] < self.n - self.keep:
            q.popleft()

    def max(self):
        return self.q[0][1]

    def __len__(self):
        return min(self.n, self.keep)


class StepReader:
    """Reads back the steps queued in pending (closed
    :class:`~deepseed.steps.Step` objects, oldest first) once their events
    have completed, and sends their records through link, the run's
    :class:`~deepseed.link.RunLink`. It holds the device clock's anchor
    and the last peak-memory reading the steps set."""

    def __init__(self, link, pending, pool, fetch, cuda, layer_names):
        self.link = link
        self.run = link.run
        self.pending = pending
        self.pool = pool
        self.fetch = fetch
        self.cuda = cuda
        self.layer_names = layer_names
        self.thread = None  # the reader thread, when read-back runs in the background
        self.lock = None  # held while the reader thread builds one step
        self.stop_event = None
        self.wake = None  # set by the training thread when READ_WAKE_PENDING steps wait
        self.columns = None  # steps read back and not sent yet (records.StepColumns)
        self.closing = False  # the watcher is closing: a step built now is sent at once
        self.comm = None  # the comm.CommProbe of a distributed run
        self.mem = None  # (peak, reserved) GiB, as last read when a step closed
        # Device-to-wall-clock anchor: an event and the candidate wall
        # times (ns) of it, each a lower bound; the newest ANCHOR_KEEP count.
        self.anchor = None
        self.anchor_walls = WindowMax(ANCHOR_KEEP)
        self.last_end_wall_ns = None  # the previous emitted step's end, wall clock
        self.last_close_ns = None
        self.no_layer_hook = False  # a profiled step's layer hooks never ran (compiled layers)

    def start(self):
        """Reads back on a thread of its own from now on."""
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._read_loop, name="deepseed-reader", daemon=True)
        self.thread.start()

    def _read_loop(self):
        stop, wake = self.stop_event, self.wake
        while True:
            wake.wait(READ_EVERY_S)
            wake.clear()
            if stop.is_set():
                return
            try:
                while not stop.is_set():
                    # Steps are built under the read lock (in order, with
                    # the clock state they update) and handed to the run
                    # outside it: the reader never waits for the run's lock
                    # while holding its own, which close() takes.
                    with self.lock:
                        took, built = self._take_batch(READ_BATCH)
                    if built:
                        self._deliver_all(built)
                    if took < READ_BATCH:
                        break
                    time.sleep(READ_YIELD_S)
                cols = self.columns
                if cols is not None and cols.steps and time.perf_counter() - cols.since >= STEPS_MAX_AGE_S:
                    with self.link.lock:
                        self.send_steps()
            except Exception as e:  # pragma: no cover - defensive: the reader must not die
                self.link.warn_once("reader", "deepseed: reading step timings: %s", e)

    def stop(self, wait):
        """Stops the reader thread; with wait, until it has (the training
        thread then reads what is left itself)."""
        r = self.thread
        if r is None:
            return
        self.stop_event.set()
        self.wake.set()
        if wait and r is not threading.current_thread():
            r.join(2.0)

    def _ready(self, slot):
        # Events of one stream complete in order: once the next step's start
        # has, so has every event of this step. Its values wait for their
        # batch (Fetcher), which leaves by size or age at a step's close.
        end = slot.nxt_start
        return end is not None and end.query() and self._values_ready(slot)

    def _take_batch(self, n):
        """Takes up to n finished steps off the queue, oldest first, and
        builds them: (how many were taken, the records of those that could
        be read). The newest step of the batch is asked whether its events
        completed; the older ones, recorded on the same stream before it,
        have too, and only their values' batches are asked about."""
        pending = self.pending
        m = min(n, len(pending))
        while m and pending[m - 1].nxt_start is None:
            m -= 1
        while m and not self._ready(pending[m - 1]):
            m -= 1
        if not m:
            # The oldest step's events never completed (a device fault, or
            # events recorded on a stream nothing runs): it is dropped once
            # too many steps wait behind it, as it would hold them forever.
            if len(pending) > MAX_PENDING and pending[0].nxt_start is not None:
                self.link.warn_once("stale", "deepseed: CUDA events of step %d never completed", pending[0].step)
                pending.popleft()
                return 1, []
            return 0, []
        sid = pending[m - 1].sid
        out = []
        took = 0
        for _ in range(m):
            slot = pending[0]
            if took < m - 1 and not (slot.sid == sid and self._values_ready(slot) or self._ready(slot)):
                break
            pending.popleft()
            took += 1
            built = self._build(slot)
            if built is not None:
                out.append(built)
        return took, out

    def _values_ready(self, slot):
        """True once every value the step waits on has come back."""
        for _, box in slot.boxes:
            if isinstance(box, list):
                if not all(b.ready() for b in box):
                    return False
            elif not box.ready():
                return False
        return True

    def _slot_events(self, slot):
        if not slot.fwd and not slot.bwd and slot.opt is None and slot.layer is None and slot.sync_end is None:
            # A step without phase events: its start and end, never shared.
            return [e for e in (slot.ev_start, slot.ev_end) if e is not None]
        evs = [slot.ev_start, slot.ev_end, slot.sync_end]
        if slot.opt is not None:
            evs.extend(slot.opt)
        for pair in slot.fwd:
            evs.extend(pair)
        for pair in slot.bwd:
            evs.extend(pair)
        evs.extend(events_of(slot.layer))
        # One event can end two intervals (optimizer and step, step start and
        # first forward); list it once so that the pool never hands it out
        # twice.
        seen, out = set(), []
        for e in evs:
            if e is not None and id(e) not in seen:
                seen.add(id(e))
                out.append(e)
        return out

    def drain(self):
        """Reads every step left, waiting for the device (at the end of a
        run, once the reader thread has stopped)."""
        if self.thread is None:
            self.poll(wait=True)
        elif self.lock.acquire(timeout=2.0):
            # The reader holds it only while it builds one step.
            try:
                self.poll(wait=True)
            finally:
                self.lock.release()
        else:  # pragma: no cover - a reader stuck inside the device
            self.link.warn_once("readerstuck", "deepseed: %d steps not read at close", len(self.pending))

    def poll(self, wait=False):
        """Emits every finished step whose events have completed, oldest
        first."""
        if wait:
            self.fetch.flush()
        while True:
            took, built = self._take_one(wait)
            if not took:
                return
            self._deliver(built)

    def _take_one(self, wait):
        """Takes the oldest finished step off the queue if it can be and
        builds its records: (True, records, or None when they could not be
        read), or (False, None) when no step was ready."""
        while self.pending:
            slot = self.pending[0]
            # A step waits for the next one to begin (its step time runs to
            # that start) unless the run is closing.
            if slot.nxt_start is None and not wait:
                return False, None
            if not wait and not self._ready(slot):
                if len(self.pending) <= MAX_PENDING:
                    return False, None
                self.link.warn_once("stale", "deepseed: CUDA events of step %d never completed", slot.step)
                self.pending.popleft()
                continue
            if wait:
                for ev in self._slot_events(slot):
                    ev.synchronize()
                if slot.nxt_start is not None:
                    slot.nxt_start.synchronize()
                for _, box in slot.boxes:
                    for b in (box if isinstance(box, list) else (box,)):
                        if b.batch is not None:
                            b.batch.poll(wait=True)
            self.pending.popleft()
            return True, self._build(slot)
        return False, None

    def _deliver(self, built):
        """Adds a step made by _build to the steps that leave together, and
        sends its layers record."""
        if built is not None:
            self._deliver_all((built,))

    def _deliver_all(self, built):
        """_deliver for steps made by _build, oldest first, under one
        taking of the run's lock."""
        try:
            link = self.link
            with link.lock:
                now = time.perf_counter()
                for step, fields, t, measured, layers in built:
                    cols = self.columns
                    if cols is None:
                        cols = self.columns = StepColumns(self.run.run_id, self.run.rank)
                    cols.add(step, t, measured, fields, now)
                    link.steps_logged += 1
                    if layers is not None:
                        link.send(layers)
                    # Once the watcher is closed (a step the reader built
                    # while close() ran), nothing would send it later.
                    if len(cols.steps) >= STEPS_PER_RECORD or now - cols.since >= STEPS_MAX_AGE_S or self.closing:
                        self.send_steps()
                if self.no_layer_hook and not self.run.meta.get("layer_times"):
                    self.run.update_meta(layer_times=NO_LAYER_HOOK)
        except Exception as e:
            self.link.warn_once("emit", "deepseed: sending step timings: %s", e)

    def send_steps(self):
        """Sends the steps read back so far as one steps record (the
        caller holds the run's lock)."""
        cols = self.columns
        if cols is None or not cols.steps:
            return
        self.columns = None
        link = self.link
        try:
            for rec in cols.records(link.fpt, link.peak):
                link.send(rec)
        except Exception as e:
            link.warn_once("emit", "deepseed: sending step timings: %s", e)

    def _build(self, slot):
        """The step record's parts and the layers record of a step whose
        events completed; returns its events to the pool."""
        try:
            # What the watcher measured goes into the record as it is (known
            # fields, finite or clamped numbers); what a caller or framework
            # added (extra, device values, logged fields) goes through the
            # run's checks after it, and wins over a measured field.
            rec = {}
            end = slot.nxt_start if slot.nxt_start is not None else slot.ev_end
            if slot.ev_start is not None and end is not None:
                rec["step_ms"] = _nonneg_ms(slot.ev_start.elapsed_time(end))
            if slot.fwd:
                fw = _ms_sum(slot.fwd)
                if fw is not None:
                    rec["forward_ms"] = _nonneg_ms(fw)
            if slot.bwd:
                bw = _ms_sum(slot.bwd)
                if bw is not None:
                    rec["backward_ms"] = _nonneg_ms(bw)
            if slot.opt is not None:
                op = _ms_sum((slot.opt,))
                if op is not None:
                    rec["optimizer_ms"] = _nonneg_ms(op)
            # The step's synchronisation fields, from its own events: the
            # record is built once they (and its values) have arrived.
            sync = self._sync_fields(slot)
            if self.comm is not None:
                self.comm.fill(slot, rec, sync)
            if slot.data_ms is not None:
                iw = sync.get("input_wait_ms")
                rec["data_ms"] = round_ms(slot.data_ms if iw is None else max(0.0, slot.data_ms - iw))
            if self.mem is not None:
                rec["gpu_mem_peak_gb"], rec["gpu_mem_reserved_gb"] = self.mem
            rec.update(sync)
            if slot.samples:
                rec["samples"] = int(slot.samples)
            if slot.tokens:
                rec["tokens"] = int(slot.tokens)
            f = dict(slot.extra) if slot.extra else {}
            for k, box in slot.boxes:
                if k == "loss+":
                    f["loss"] = sum(b.value for b in box)
                elif isinstance(box, list):
                    f[k] = sum(b.value for b in box) / len(box)
                else:
                    f[k] = box.value
            if slot.user:
                f.update(slot.user)
            # The record's time is when the step ended (the device's end of
            # its work on the wall clock, else the host's close), not when it
            # is read back: records are built in batches, later.
            end_ns = self.last_end_wall_ns if self.cuda and self.anchor else None
            if end_ns is None:
                end_ns = slot.close_ns
            t = end_ns / 1e9 if end_ns is not None else None
            layers = self._layers_record(slot, t) if slot.layer is not None else None
            if layers is not None and not any(v == v for v in layers["forward_ms"]):
                # No layer hook ran: the layers ran inside a compiled graph
                # (compiled.py). Say so once instead of sending NaNs.
                # (Said in _deliver: the run's lock is not taken under the
                # reader's.)
                layers = None
                self.no_layer_hook = True
            return slot.step, f, t, rec, layers
        except Exception as e:
            self.link.warn_once("emit", "deepseed: reading step timings: %s", e)
            return None
        finally:
            nxt = slot.nxt_start
            for ev in self._slot_events(slot):
                if ev is not nxt:
                    self.pool.put(ev)

    # ---- synchronisation ------------------------------------------------------

    def take_anchor(self):
        """Maps device events to the wall clock: one synchronize, once."""
        try:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            self.anchor = ev
            self.anchor_walls.append(time.time_ns())
        except Exception as e:
            self.anchor = False
            self.link.warn_once("anchor", "deepseed: device clock anchor: %s", e)

    def _wall_ns(self, ev):
        """Wall-clock ns of a completed event, or None."""
        if not self.anchor or ev is None:
            return None
        return self.anchor_walls.max() + int(self.anchor.elapsed_time(ev) * 1e6)

    def _sync_fields(self, slot):
        """sync_ns, sync_wait_ms and input_wait_ms of an emitted step."""
        out = {}
        bwd_end = slot.bwd[-1][1] if slot.bwd else None
        if self.cuda and self.anchor:
            # The host recorded the step's start event at open_ns: the
            # device ran it no sooner, so open_ns − its device time since
            # the anchor bounds the anchor's wall time from below. Steps
            # whose synchronisation fields are sent refine it, and every
            # ANCHOR_EVERY-th step in between (each costs a device query).
            if slot.ev_start is not None and (slot.phases or slot.step % ANCHOR_EVERY == 0):
                self.anchor_walls.append(slot.open_ns - int(self.anchor.elapsed_time(slot.ev_start) * 1e6))
            if bwd_end is not None:
                out["sync_ns"] = self._wall_ns(bwd_end)
                if slot.sync_end is not None:
                    out["sync_wait_ms"] = round_ms(max(0.0, bwd_end.elapsed_time(slot.sync_end)))
            if slot.data_ms is not None and self.last_end_wall_ns is not None and self.last_close_ns is not None:
                busy = (self.last_end_wall_ns - self.last_close_ns) / 1e6
                out["input_wait_ms"] = round_ms(min(max(0.0, busy), slot.data_ms))
            end = slot.ev_end
            self.last_end_wall_ns = self._wall_ns(end) if end is not None else None
            self.last_close_ns = slot.close_ns
        elif slot.host_arrive_ns is not None:
            out["sync_ns"] = slot.host_arrive_ns
            if slot.host_release_ns is not None:
                out["sync_wait_ms"] = round_ms(max(0.0, (slot.host_release_ns - slot.host_arrive_ns) / 1e6))
        return {k: v for k, v in out.items() if v is not None}

    def _layers_record(self, slot, t=None):
        fwd, bwd = [], []
        for row in slot.layer:
            tot = 0.0
            n = 0
            for a, b in row["fwd"]:
                if b is not None:
                    tot += a.elapsed_time(b)
                    n += 1
            fwd.append(round_ms(tot) if n else float("nan"))
            bs, be = row["bstart"], row["bend"]
            if bs and len(be) >= len(bs):
                bwd.append(round_ms(sum(max(0.0, a.elapsed_time(b)) for a, b in zip(bs, be))))
            else:
                bwd.append(float("nan"))
        rec = {"kind": "layers", "run_id": self.run.run_id, "rank": self.run.rank, "step": int(slot.step),
               "time": t if t is not None else time.time(), "names": list(self.layer_names), "forward_ms": fwd,
               "backward_ms": bwd}
        return rec
