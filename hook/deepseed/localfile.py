"""Records kept on this machine as NDJSON, and the senders that never use
the network.

encode() writes records as NDJSON lines, the form of every batch and file
the hook writes. A LocalFile is where the HTTP Sender (sender.py) puts
what it cannot deliver, and where a FileSender writes an offline run's
records; path_for() names a run's file and ``deepseed import`` sends it
later (import_hint() says how). A NullSender keeps nothing: a run whose
sending is disabled.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

log = logging.getLogger("deepseed")


def _default(o):
    # Tensors, numpy scalars and the like: numbers where they are numbers,
    # text otherwise, so one odd value never loses a whole batch.
    try:
        return float(o)
    except Exception:
        return str(o)


_dumps = json.JSONEncoder(allow_nan=True, separators=(",", ":"), default=_default).encode


def encode(records, yield_every=0) -> bytes:
    """NDJSON with NaN and Infinity written as Python writes them. With
    yield_every, gives up the GIL after every that many records."""
    if not yield_every:
        lines = [_dumps(r) for r in records]
    else:
        lines = []
        for i in range(0, len(records), yield_every):
            lines.extend(_dumps(r) for r in records[i:i + yield_every])
            time.sleep(0)
    return ("\n".join(lines) + "\n").encode("utf-8")


def import_hint(path, server=None, token=None) -> str:
    """How to send a local NDJSON file later: to the server (its base
    address) when known, else to whichever the user names (a server, or a
    node's collector, which takes the same records)."""
    cmd = "deepseed import %s --server %s" % (path, server or "SERVER_URL")
    if token:
        cmd = "DEEPSEED_TOKEN=... " + cmd
    return cmd


def path_for(run_id, rank, world_size):
    """Where a process's records go when they cannot be sent (or always,
    offline): DEEPSEED_OFFLINE_DIR (default ./deepseed-runs), one file per
    run, one per rank when there are several, so that ranks never write the
    same file. ``deepseed import`` sends it."""
    d = os.environ.get("DEEPSEED_OFFLINE_DIR") or "deepseed-runs"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id) or "run"
    name = safe + (".rank%d" % rank if world_size > 1 else "") + ".ndjson"
    return os.path.join(d, name)


class LocalFile:
    """Appends records as NDJSON to a file created on first use. Shared by
    the training thread (records evicted from a full queue) and the sender
    thread, so it takes its own lock; writes are buffered, no fsync."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.written = 0
        self.failed = None
        self._f = None
        self._lock = threading.Lock()

    def write(self, records) -> int:
        """Returns how many records were written (0 once the file failed)."""
        if not records:
            return 0
        try:
            data = encode(records).decode("utf-8")
            with self._lock:
                if self.failed is not None:
                    return 0
                if self._f is None:
                    d = os.path.dirname(self.path)
                    if d:
                        os.makedirs(d, exist_ok=True)
                    self._f = open(self.path, "a", encoding="utf-8")
                self._f.write(data)
                self.written += len(records)
            return len(records)
        except Exception as e:
            with self._lock:
                self.failed = e
            return 0

    def close(self):
        with self._lock:
            if self._f is not None and not self._f.closed:
                try:
                    self._f.close()
                except Exception as e:  # pragma: no cover - disk full at close
                    self.failed = e


class NullSender:
    """Used when sending is disabled: keeps nothing."""

    url = None
    local_path = None
    dropped = rejected = sent = failures = saved = 0
    pending = 0

    def put(self, record):
        pass

    def flush(self, timeout=5.0):
        return True

    def close(self, timeout=5.0):
        return True


class FileSender(NullSender):
    """Appends NDJSON to a local file, for offline runs; the file can be
    sent later with ``deepseed import FILE``, which says so at close.
    Records are written in batches (every BUFFER records or FLUSH_S
    seconds, and at flush and close), not one write per record. Written
    records count in :attr:`saved` (records_saved_locally): nothing here
    is sent, so :attr:`sent` stays 0."""

    BUFFER = 256
    FLUSH_S = 1.0

    def __init__(self, path):
        self._file = LocalFile(path)
        self.path = self._file.path
        self._buf = []
        self._since = 0.0

    @property
    def local_path(self):
        return self.path if self._file.written else None

    @property
    def pending(self):
        return len(self._buf)

    def put(self, record):
        buf = self._buf
        if not buf:
            self._since = time.monotonic()
        buf.append(record)
        if len(buf) >= self.BUFFER or time.monotonic() - self._since >= self.FLUSH_S:
            self._write()

    def _write(self):
        buf, self._buf = self._buf, []
        if not buf:
            return
        n = self._file.write(buf)
        self.saved += n
        self.dropped += len(buf) - n

    def flush(self, timeout=5.0):
        self._write()
        with self._file._lock:
            if self._file._f is not None:
                self._file._f.flush()
        return True

    drain = flush

    def close(self, timeout=5.0):
        self._write()
        self._file.close()
        if self._file.written:
            log.warning("deepseed: offline: %d records are in %s. Send them with: %s",
                        self._file.written, self.path, import_hint(self.path))
        return self._file.failed is None


__all__ = ["LocalFile", "NullSender", "FileSender", "encode", "import_hint", "path_for"]
