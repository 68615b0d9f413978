"""Hang forensics: where a rank is when its steps stop.

A watchdog thread wakes every few seconds (a fifth of the threshold, 1 to
30 s) and compares the run's count of steps with what it saw last. When no
step was recorded for DEEPSEED_HANG_S seconds (300 by default; 0 or "off"
turns the watchdog off), and when the process gets SIGTERM (a launcher's
timeout, a scheduler's cancel), it sends one event of type ``hang`` on the
run. Its text is a JSON object:

    reason           "stalled" or "SIGTERM"
    rank, pid, host  who
    step             the step the rank is on (in_step: whether it is open)
    steps_recorded   steps sent so far
    stalled_s        seconds since the last step was recorded
    last_collective  the last collective the rank entered in a step: its
                     name, its number in the run, the step, and whether the
                     device completed it (an event query, which never waits)
    nccl             torch's NCCL flight recorder's newest entries, where it
                     is on (TORCH_NCCL_TRACE_BUFFER_SIZE)
    threads          every thread's Python stack, innermost frame last

The server turns the events into a ``hang`` alert naming the rank(s) that
stopped first (docs/alerts.md). The watchdog takes no lock of the training
thread's and reads the device only through that event query, so it cannot
make a hang worse; a stall is reported once, and again only after steps
resumed. SIGTERM reaches the watchdog through the interpreter's wake-up
descriptor, so it is reported even when the main thread is stuck inside
the device or a collective and no Python handler can run there; if the
run's own SIGTERM handler has not ended the process a few seconds later,
the watchdog ends it as SIGTERM would have.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from . import env

log = logging.getLogger("deepseed")

DEFAULT_HANG_S = 300.0
MAX_TEXT = 60000  # the event's text is cut at 65,536 characters
TERM_GRACE_S = 5.0


def threshold():
    """Seconds without a step before a hang is reported; 0: off."""
    v = os.environ.get("DEEPSEED_HANG_S", "").strip().lower()
    if v in ("off", "no", "false"):
        return 0.0
    try:
        return max(0.0, float(v)) if v else DEFAULT_HANG_S
    except ValueError:
        return DEFAULT_HANG_S


class Watchdog:
    """The watchdog thread of the run whose :class:`~deepseed.link.RunLink`
    is link: it watches the link's step counts and reports through the
    run."""

    def __init__(self, link, hang_s, own_sigterm=False):
        self.link = link
        self.run = link.run
        self.hang_s = float(hang_s)
        self.every = min(30.0, max(1.0, self.hang_s / 5))
        self.own_sigterm = own_sigterm
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reported = set()  # reasons reported for the current stall
        self._seen = (-1, None)
        self._since = time.monotonic()
        self._rfd = self._wfd = None
        self._old_wakeup = None
        self._wake_signals()
        self.thread = threading.Thread(target=self._loop, name="deepseed-watchdog", daemon=True)
        self.thread.start()

    def _wake_signals(self):
        # The interpreter writes each signal's number to this descriptor
        # from its C handler, whatever the main thread is doing.
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            if old != -1:  # someone else's (an event loop): leave it
                signal.set_wakeup_fd(old)
                os.close(r)
                os.close(w)
                return
            self._rfd, self._wfd = r, w
        except (ValueError, OSError, AttributeError):
            pass

    def stop(self):
        self._stop.set()
        if self._wfd is not None:
            try:
                os.write(self._wfd, b"\0")
            except OSError:
                pass
        if threading.current_thread() is threading.main_thread() and self._wfd is not None:
            try:
                old = signal.set_wakeup_fd(-1)
                if old != self._wfd:  # replaced since: put it back
                    signal.set_wakeup_fd(old)
            except (ValueError, OSError):
                pass

    def _loop(self):
        while not self._stop.is_set():
            sigs = self._sleep(self.every)
            if self._stop.is_set():
                break
            try:
                if signal.SIGTERM in sigs:
                    self.report("SIGTERM")
                    self._end_after_term()
                    continue
                self._check()
            except Exception as e:  # pragma: no cover - the watchdog must not die
                self.link.warn_once("watchdog", "deepseed: hang watchdog: %s", e)
        for fd in (self._rfd, self._wfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _sleep(self, seconds):
        """Sleeps, waking early for a signal; returns the signals seen."""
        if self._rfd is None:
            self._stop.wait(seconds)
            return set()
        try:
            ready, _, _ = select.select([self._rfd], [], [], seconds)
            if not ready:
                return set()
            return set(os.read(self._rfd, 512))
        except (OSError, ValueError):
            self._stop.wait(seconds)
            return set()

    def _check(self, now=None):
        now = time.monotonic() if now is None else now
        link = self.link
        seen = (link.steps_logged, link.next_step)
        if seen != self._seen:
            self._seen, self._since = seen, now
            self._reported.clear()
            return False
        if link.steps_logged == 0 or now - self._since < self.hang_s:
            return False
        return self.report("stalled", now)

    def _end_after_term(self):
        if not self.own_sigterm:
            return
        end = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < end:
            if self.run.finished or self._stop.is_set():
                return
            time.sleep(0.1)
        # The main thread never ran the handler: it is stuck where Python
        # cannot interrupt it. End as SIGTERM would have.
        try:
            self.run.sender.flush(2.0)
        except Exception:
            pass
        os._exit(128 + signal.SIGTERM)

    def report(self, reason, now=None):
        """Sends the hang event once per stall and reason; True if sent."""
        with self._lock:
            if reason in self._reported:
                return False
            self._reported.add(reason)
        now = time.monotonic() if now is None else now
        snap = snapshot(self.link, reason, now - self._since, skip=self.thread.ident)
        self.run.event("hang", encode(snap), step=snap.get("step"))
        try:
            self.run.sender.flush(2.0)
        except Exception:
            pass
        log.warning("deepseed: rank %s: %s at step %s; where every thread is was sent as a hang event",
                    self.run.rank, "no step for %.0f s" % snap["stalled_s"] if reason == "stalled" else reason,
                    snap.get("step"))
        return True


def snapshot(link, reason, stalled_s, skip=None):
    """What the hang event of link's run says (see the module's doc)."""
    w = link.watcher
    cur = getattr(w, "cur", None) if w is not None else None
    snap = {"reason": reason, "rank": link.run.rank, "pid": os.getpid(), "host": socket.gethostname(),
            "step": int(cur.step) if cur is not None else int(link.next_step - 1), "in_step": cur is not None,
            "steps_recorded": int(link.steps_logged), "stalled_s": round(float(stalled_s), 1)}
    probe = getattr(w, "comm", None) if w is not None else None
    last = getattr(probe, "last", None)
    if last is not None:
        name, seq, step, ev = last
        try:
            done = bool(ev.query())
        except Exception:
            done = None
        snap["last_collective"] = {"name": name, "seq": seq, "step": step, "completed": done}
    nccl = nccl_trace()
    if nccl:
        snap["nccl"] = nccl
    snap["threads"] = stacks(skip)
    return snap


def stacks(skip=None):
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:  # the watchdog itself
            continue
        lines = traceback.format_stack(frame, limit=25)
        out.append({"name": names.get(ident, str(ident)), "ident": ident, "stack": "".join(lines)[-6000:]})
    # The main thread first: it is where the training loop is.
    main = threading.main_thread().ident
    out.sort(key=lambda t: (t["ident"] != main, t["name"]))
    for t in out:
        del t["ident"]
    return out


def nccl_trace(keep=4):
    """The newest entries of torch's NCCL flight recorder, or None."""
    if os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "").strip() in ("", "0"):
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        import pickle
        raw = torch._C._distributed_c10d._dump_nccl_trace(True, False, False)
        entries = pickle.loads(raw).get("entries", [])
    except Exception:
        return None
    out = []
    for e in entries[-keep:]:
        out.append({k: e.get(k) for k in ("collective_seq_id", "profiling_name", "state", "process_group",
                                          "time_discovered_completed_ns") if k in e})
    return out or None


def encode(snap):
    """The snapshot as JSON within the event's text limit: stacks go
    first, the last threads' whole."""
    text = json.dumps(snap, default=str)
    while len(text) > MAX_TEXT and snap.get("threads"):
        snap["threads"].pop()
        snap["threads_cut"] = snap.get("threads_cut", 0) + 1
        text = json.dumps(snap, default=str)
    return text


def start(link, own_sigterm):
    """The watchdog of link's run, or None when off."""
    s = threshold()
    if s <= 0 or (link.run.world_size <= 1 and not env.is_set("DEEPSEED_HANG_S")):
        return None
    try:
        return Watchdog(link, s, own_sigterm)
    except Exception as e:
        link.warn_once("watchdog", "deepseed: hang watchdog: %s", e)
        return None
