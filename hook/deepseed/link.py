"""What a Run shares with the parts that work for it: the watcher and its
parts (watch.py, steps.py, readback.py, phases.py), the communication
probe (comm.py), the hang watchdog (hang.py) and the framework
integrations.

The Run (run.py) creates its RunLink first thing and keeps this state
there, not in copies: the number the next step gets, the count of steps
recorded, the FLOPs figures of each step's TFLOP/s and MFU, the watcher,
the lock that orders records, where records go, and which warnings were
given. It hands the link to what it creates (its watcher, its watchdog);
the watcher hands it to its parts. An integration reaches it through the
watcher that the run's watch() returned, as ``watcher.link``; the Run's
own API stays what hook/README.md describes.

Per-step code binds what it calls once and reads these attributes
directly: a part holds the link, never the Run's private names.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("deepseed")


class RunLink:
    """A Run's shared state, as its parts see it.

    Attributes:
        run: the :class:`~deepseed.run.Run` (its public API: run_id, rank,
            meta, update_meta(), event(), …).
        lock: the run's lock (re-entrant): held while a record is built
            and queued, so that records leave in order.
        send: queues one record on the run's sender (the sender's own
            ``put``, bound once); never blocks, never raises.
        next_step: the number the next step gets; the watcher's steps and
            log_step() count it up, a framework that numbers its steps
            itself sets it.
        steps_logged: steps recorded so far (what the hang watchdog sees
            progress by).
        fpt, peak: the model's training FLOPs per token and the GPU's peak
            TFLOP/s of each step's tflops and mfu (None while unknown).
        flops_cfg: the watched model's config, whose layers and width give
            the attention part of fpt.
        watcher: the run's :class:`~deepseed.watch.Watcher`, or None.
    """

    __slots__ = ("run", "lock", "send", "next_step", "steps_logged", "fpt", "peak", "flops_cfg", "watcher",
                 "_warned")

    def __init__(self, run):
        self.run = run
        self.lock = threading.RLock()
        self.send = None  # the Run's sender's put, set once the sender exists
        self.next_step = 1
        self.steps_logged = 0
        self.fpt = self.peak = None
        self.flops_cfg = None
        self.watcher = None
        self._warned = set()

    def warn_once(self, key, msg, *args):
        """Logs msg % args as a warning the first time key is given."""
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(msg, *args)

