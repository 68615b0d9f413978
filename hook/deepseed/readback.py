"""The read-back of watched steps: a step's events and values wait in the
watcher's queue until the device has run them, then become the step's
entries in the columns of a steps record (phase times, synchronisation
fields on the wall clock through the device-clock anchor) and, on armed
steps, the layers record.

A StepReader, owned by the Watcher, reads the queue of closed steps it
shares with the StepState (steps.py), in order and in batches (one device
query vouches for a batch: events of one stream complete in order). The
training thread reads them itself when a step closes with READ_PENDING
steps waiting, or with the oldest waiting READ_EVERY_S: a few hundred µs
once every few dozen short steps, one step's read-back on every long one.
Read on a thread of its own instead, the same work costs the training
thread more than itself: each device query hands the interpreter between
the threads, and the training thread then waits for the reader's Python
at its next event. On a GPU a reader thread still wakes every
READ_EVERY_S and reads the steps that waited READ_LATE_S (a loop that
stopped stepping: evaluation, a checkpoint, the end of an epoch), so
nothing waits for the next step to be sent. Elsewhere (the host clock's
timers, tests) the training thread reads each step at the next one's
open, and at the run's end."""

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
ANCHOR_KEEP = 64  # with ANCHOR_EVERY, the newest 1,024 steps: the clocks drift apart slowly
ANCHOR_EVERY = 16
READ_EVERY_S = 0.1
# The training thread reads the steps waiting when this many have closed
# (steps.py), so that short steps are read in batches of about this size.
READ_PENDING = 32
# The reader thread reads what the training thread left this long.
READ_LATE_S = 0.5
READ_YIELD_S = 2e-5
READ_BATCH = 16  # steps the reader thread builds under the read lock between two yields of the interpreter


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
        self.wake = None  # set to stop the reader thread's wait
        # Steps built and not yet added to the columns, oldest first: built
        # under the read lock, delivered under the run's (never under both,
        # see _read_loop), so that two readers deliver in the order built.
        self.outbox = collections.deque()
        self.read_at = 0.0  # perf_counter of the last read that took a step
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
        # The previous emitted step's end event and its device time since
        # the anchor (ns): a step that begins there is placed from it with
        # one short interval instead of a second one back to the anchor
        # (cheaper, and exact where an interval of hours in a float32 of
        # milliseconds is not).
        self.chain_ev = None
        self.chain_ns = 0
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
                pending = self.pending
                while not stop.is_set() and pending and time.perf_counter() - self.read_at >= READ_LATE_S:
                    # Steps are built under the read lock (in order, with
                    # the clock state they update) and handed to the run
                    # outside it: the reader never waits for the run's lock
                    # while holding its own, which close() takes.
                    with self.lock:
                        took = self._take_batch(READ_BATCH)
                    self._deliver_outbox()
                    if took < READ_BATCH:
                        break
                    time.sleep(READ_YIELD_S)
                cols = self.columns
                if cols is not None and cols.steps and time.perf_counter() - cols.since >= STEPS_MAX_AGE_S:
                    with self.link.lock:
                        self.send_steps()
            except Exception as e:  # pragma: no cover - defensive: the reader must not die
                self.link.warn_once("reader", "deepseed: reading step timings: %s", e)

    def read_waiting(self):
        """The training thread's read: every waiting step whose events have
        completed, in batches, unless the reader thread is reading now."""
        lock = self.lock
        if lock is not None and not lock.acquire(False):
            return
        try:
            self._take_batch(len(self.pending))
        finally:
            if lock is not None:
                lock.release()
        self._deliver_outbox()

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
        """Takes up to n finished steps off the queue, oldest first, builds
        them and puts what could be read in the outbox; returns how many
        were taken. The newest step of the batch is asked whether its
        events completed; the older ones, recorded on the same stream
        before it, have too, and only their values' batches are asked
        about."""
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
                return 1
            return 0
        sid = pending[m - 1].sid
        out = self.outbox
        build = self._build
        took = 0
        for _ in range(m):
            slot = pending[0]
            if took < m - 1 and not (slot.sid == sid and self._values_ready(slot) or self._ready(slot)):
                break
            pending.popleft()
            took += 1
            built = build(slot)
            if built is not None:
                out.append(built)
        self.read_at = time.perf_counter()
        return took

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
        first, one at a time (with wait, after the device has run them)."""
        if wait:
            self.fetch.flush()
        while self._take_one(wait):
            self._deliver_outbox()
        self._deliver_outbox()

    def _take_one(self, wait):
        """Takes the oldest finished step off the queue if it can be and
        puts its records in the outbox (none when they could not be read);
        False when no step was ready."""
        while self.pending:
            slot = self.pending[0]
            # A step waits for the next one to begin (its step time runs to
            # that start) unless the run is closing.
            if slot.nxt_start is None and not wait:
                return False
            if not wait and not self._ready(slot):
                if len(self.pending) <= MAX_PENDING:
                    return False
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
            built = self._build(slot)
            if built is not None:
                self.outbox.append(built)
            self.read_at = time.perf_counter()
            return True
        return False

    def _deliver_outbox(self):
        """Adds the steps built so far to the steps that leave together, in
        the order they were built, and sends their layers records, under
        one taking of the run's lock."""
        out = self.outbox
        if not out:
            return
        try:
            link = self.link
            with link.lock:
                now = time.perf_counter()
                while out:
                    step, fields, t, measured, layers = out.popleft()
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
            start = slot.ev_start
            end = slot.nxt_start if slot.nxt_start is not None else slot.ev_end
            step_ms = None
            if start is not None and end is not None:
                step_ms = start.elapsed_time(end)
                rec["step_ms"] = _nonneg_ms(step_ms)
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
            sync = {}
            self._sync_fields(slot, sync, step_ms if end is slot.ev_end else None)
            if self.comm is not None:
                self.comm.fill(slot, rec, sync)
            if slot.data_ms is not None:
                iw = sync.get("input_wait_ms")
                rec["data_ms"] = round_ms(slot.data_ms if iw is None else max(0.0, slot.data_ms - iw))
            if self.mem is not None:
                rec["gpu_mem_peak_gb"], rec["gpu_mem_reserved_gb"] = self.mem
            if sync:
                rec.update(sync)
            if slot.samples:
                rec["samples"] = int(slot.samples)
            if slot.tokens:
                rec["tokens"] = int(slot.tokens)
            f = dict(slot.extra) if slot.extra else {}
            if slot.lr is not None and "lr" not in f:
                f["lr"] = slot.lr
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
                # (Said in _deliver_outbox: the run's lock is not taken under the
                # reader's.)
                layers = None
                self.no_layer_hook = True
            return slot.step, f, t, rec, layers
        except Exception as e:
            self.link.warn_once("emit", "deepseed: reading step timings: %s", e)
            return None
        finally:
            nxt = slot.nxt_start
            if self.chain_ev is not nxt:
                self.chain_ev = None  # it goes back to the pool below
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

    def _since_anchor_ns(self, slot, ev, from_start_ms=None):
        """Device ns from the anchor to ev, one of slot's events: from the
        previous step's end where slot began there (with from_start_ms, the
        interval from slot's start to ev, when the caller has it), else
        from the anchor."""
        if self.chain_ev is not None and slot.ev_start is self.chain_ev:
            if from_start_ms is None:
                from_start_ms = self.chain_ev.elapsed_time(ev)
            return self.chain_ns + int(round(from_start_ms * 1e6))
        return int(round(self.anchor.elapsed_time(ev) * 1e6))

    def _sync_fields(self, slot, out, step_ms=None):
        """Puts sync_ns, sync_wait_ms and input_wait_ms of an emitted step
        in out, where it has them. step_ms, when given, is the device time
        from the step's start to its ev_end."""
        bwd_end = slot.bwd[-1][1] if slot.bwd else None
        anchor = self.anchor
        if self.cuda and anchor:
            walls = self.anchor_walls
            # The host recorded the step's open_ev at open_ns: the device
            # ran it no sooner, so open_ns − its device time since the
            # anchor bounds the anchor's wall time from below. Steps whose
            # synchronisation fields are sent refine it, and every
            # ANCHOR_EVERY-th step in between that recorded one (each costs
            # a device query).
            if slot.open_ev is not None and (slot.phases or slot.step % ANCHOR_EVERY == 0):
                walls.append(slot.open_ns - int(anchor.elapsed_time(slot.open_ev) * 1e6))
            base = walls.max()
            if bwd_end is not None:
                out["sync_ns"] = base + self._since_anchor_ns(slot, bwd_end)
                if slot.sync_end is not None:
                    out["sync_wait_ms"] = round_ms(max(0.0, bwd_end.elapsed_time(slot.sync_end)))
            last_end = self.last_end_wall_ns
            if slot.data_ms is not None and last_end is not None and self.last_close_ns is not None:
                busy = (last_end - self.last_close_ns) / 1e6
                out["input_wait_ms"] = round_ms(min(max(0.0, busy), slot.data_ms))
            end = slot.ev_end
            if end is None:
                self.last_end_wall_ns = self.chain_ev = None
            else:
                end_ns = self._since_anchor_ns(slot, end, step_ms)
                # Kept only while it stays out of the pool: as the next
                # step's start (an event the pool hands out again is
                # recorded anew).
                self.chain_ev = end if end is slot.nxt_start else None
                self.chain_ns = end_ns
                self.last_end_wall_ns = base + end_ns
            self.last_close_ns = slot.close_ns
        elif slot.host_arrive_ns is not None:
            out["sync_ns"] = slot.host_arrive_ns
            if slot.host_release_ns is not None:
                out["sync_wait_ms"] = round_ms(max(0.0, (slot.host_release_ns - slot.host_arrive_ns) / 1e6))

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
