"""Background sender: batches records as NDJSON and POSTs them.

The training thread only appends to a bounded deque (O(1), one short lock);
a daemon thread encodes, compresses and sends. Nothing here raises into the
caller and nothing waits on the network except :meth:`Sender.close`, whose
wait is bounded.
"""

from __future__ import annotations

import collections
import gzip
import http.client
import json
import logging
import threading
import time
import urllib.parse

log = logging.getLogger("deepseed")

INGEST_PATH = "/api/v1/ingest"


def ingest_url(base: str) -> str:
    """Returns the ingest endpoint for a collector or server base address."""
    base = base.rstrip("/")
    if base.endswith(INGEST_PATH):
        return base
    return base + INGEST_PATH


def _default(o):
    # Tensors, numpy scalars and the like: numbers where they are numbers,
    # text otherwise, so one odd value never loses a whole batch.
    try:
        return float(o)
    except Exception:
        return str(o)


def encode(records) -> bytes:
    """NDJSON with NaN and Infinity written as Python writes them."""
    lines = [json.dumps(r, allow_nan=True, separators=(",", ":"), default=_default) for r in records]
    return ("\n".join(lines) + "\n").encode("utf-8")


class Sender:
    """Sends records to one ingest URL from a background thread.

    Args:
        url: full ingest URL.
        token: bearer token, or None.
        max_queue: records held while the destination is slow or down; past
            it the oldest are dropped and counted in :attr:`dropped`.
        batch_size: records per POST at most.
        flush_interval: seconds between sends when fewer than batch_size
            records are waiting.
        timeout: seconds for one HTTP request.
        compress: gzip the body.
    """

    def __init__(self, url, token=None, max_queue=10000, batch_size=500, flush_interval=1.0,
                 timeout=10.0, compress=True, max_backoff=30.0):
        self.url = url
        self.token = token
        self.max_queue = max(1, int(max_queue))
        self.batch_size = max(1, int(batch_size))
        self.flush_interval = flush_interval
        self.timeout = timeout
        self._conn = None  # kept-alive connection, used by the sender thread only
        self.compress = compress
        self.max_backoff = max_backoff

        self._q = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._deadline = None  # monotonic time by which close() gives up
        self._idle = threading.Condition(self._lock)
        self._inflight = 0

        # Counters, readable by tests and by Run.summary().
        self.dropped = 0  # evicted from a full queue
        self.rejected = 0  # refused by the destination with a 4xx
        self.sent = 0
        self.failures = 0  # attempts that failed and were retried
        self._warned = set()

        self._thread = threading.Thread(target=self._loop, name="deepseed-sender", daemon=True)
        self._thread.start()

    # ---- training-thread side -------------------------------------------------

    def put(self, record) -> None:
        """Queues one record; never blocks on I/O, never raises."""
        try:
            with self._lock:
                if self._closing and self._deadline is not None and time.monotonic() > self._deadline:
                    self.dropped += 1
                    return
                if len(self._q) >= self.max_queue:
                    self._q.popleft()
                    self.dropped += 1
                self._q.append(record)
                n = len(self._q)
            if n >= self.batch_size:
                self._wake.set()
        except Exception:  # pragma: no cover - defensive
            pass

    def flush(self, timeout=5.0) -> bool:
        """Waits up to timeout seconds for everything queued so far to be
        sent (or given up on). Returns True when the queue emptied."""
        end = time.monotonic() + timeout
        self._wake.set()
        with self._lock:
            while self._q or self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
                self._wake.set()
        return True

    def close(self, timeout=5.0) -> bool:
        """Sends what is queued, waiting at most timeout seconds, then stops.
        Returns True when everything was handed over."""
        with self._lock:
            self._closing = True
            self._deadline = time.monotonic() + max(0.0, timeout)
        self._wake.set()
        self._thread.join(max(0.0, timeout) + 0.5)
        with self._lock:
            left = len(self._q) + self._inflight
            self.dropped += len(self._q)
            self._q.clear()
        if left:
            self._warn_once("close", "deepseed: gave up on %d records at exit after %.1fs", left, timeout)
        return left == 0

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._q) + self._inflight

    # ---- sender thread ------------------------------------------------------

    def _loop(self):
        backoff = 0.5
        while True:
            with self._lock:
                closing = self._closing
                empty = not self._q
            if closing and (empty or self._past_deadline()):
                break
            if empty or (not closing and len(self._q) < self.batch_size):
                self._wake.wait(self.flush_interval if not closing else 0.05)
                self._wake.clear()
            batch = self._take()
            if not batch:
                continue
            while True:
                ok, retry = self._post(batch)
                if ok or not retry:
                    break
                self.failures += 1
                # Wait before retrying, but never past close()'s deadline.
                self._sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                if self._closing and self._past_deadline():
                    # Give up: put the batch back so close() counts it.
                    with self._lock:
                        self._q.extendleft(reversed(batch))
                    batch = None
                    break
                # While retrying the queue keeps filling; fold newer records
                # into the batch so that the oldest are the ones dropped.
                batch = self._requeue_merge(batch)
            if ok:
                backoff = 0.5
            with self._lock:
                self._inflight = 0
                self._idle.notify_all()
        self._drop_conn()
        with self._lock:
            self._idle.notify_all()

    def _past_deadline(self):
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _sleep(self, seconds):
        # Cut short by close(): at exit the deadline, not the backoff, bounds
        # the retries.
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0 or (self._closing and self._past_deadline()):
                return
            if self._closing:
                time.sleep(min(left, 0.1))
                return
            self._wake.wait(min(left, 0.1))
            self._wake.clear()

    def _take(self):
        with self._lock:
            n = min(len(self._q), self.batch_size)
            batch = [self._q.popleft() for _ in range(n)]
            self._inflight = n
        return batch

    def _requeue_merge(self, batch):
        # The batch being retried counts against the queue bound, so a long
        # outage keeps memory bounded: keep the newest max_queue records.
        with self._lock:
            total = len(batch) + len(self._q)
            over = total - self.max_queue
            if over > 0:
                cut = min(over, len(batch))
                batch = batch[cut:]
                self.dropped += cut
                over -= cut
                for _ in range(over):
                    self._q.popleft()
                    self.dropped += 1
            room = self.batch_size - len(batch)
            while room > 0 and self._q:
                batch.append(self._q.popleft())
                room -= 1
            self._inflight = len(batch)
        return batch

    def _post(self, batch):
        """Returns (ok, retry)."""
        try:
            body = encode(batch)
        except Exception as e:  # pragma: no cover - encode has a default
            self._warn_once("encode", "deepseed: could not encode records: %s", e)
            self.rejected += len(batch)
            return False, False
        headers = {"Content-Type": "application/x-ndjson", "User-Agent": "deepseed-hook"}
        if self.compress:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        timeout = self.timeout
        if self._closing and self._deadline is not None:
            timeout = max(0.05, min(timeout, self._deadline - time.monotonic()))
        try:
            code, detail = self._request(body, headers, timeout)
        except Exception as e:  # connection refused, timeout, DNS, reset…
            self._drop_conn()
            self._warn_once("conn", "deepseed: cannot reach %s (%s); holding up to %d records and retrying",
                            self.url, e, self.max_queue)
            return False, True
        if 200 <= code < 300:
            self.sent += len(batch)
            return True, False
        if code in (408, 425, 429) or code >= 500:
            self._warn_once("http%d" % code, "deepseed: %s answered %d, retrying: %s", self.url, code, detail)
            return False, True
        self.rejected += len(batch)
        self._warn_once("reject", "deepseed: %s refused %d records with %d: %s", self.url, len(batch), code, detail)
        return False, False

    def _request(self, body, headers, timeout):
        """POSTs body on a kept-alive connection; returns (status, detail).

        One connection is reused for every batch: a new TCP connection per
        post costs both this process and the collector more than the post
        itself. A connection the peer closed is reopened once at once.
        """
        u = urllib.parse.urlsplit(self.url)
        path = (u.path or "/") + ("?" + u.query if u.query else "")
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
                self._conn = cls(u.hostname, u.port, timeout=timeout)
            else:
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
            try:
                self._conn.request("POST", path, body=body, headers=headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the server closed while idle.
                # Sending again is safe even if the first copy got through:
                # ingest stores a repeated batch only once.
                self._drop_conn()
                if fresh or attempt:
                    raise
                continue
            if resp.will_close:
                self._drop_conn()
            detail = ""
            if resp.status >= 300:
                detail = data[:500].decode("utf-8", "replace")
            return resp.status, detail
        raise ConnectionError("no answer")  # pragma: no cover

    def _drop_conn(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # pragma: no cover
                pass
            self._conn = None

    def _warn_once(self, key, msg, *args):
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            log.warning(msg, *args)
        except Exception:  # pragma: no cover
            pass


class NullSender:
    """Used when sending is disabled: keeps nothing."""

    url = None
    dropped = rejected = sent = failures = 0
    pending = 0

    def put(self, record):
        pass

    def flush(self, timeout=5.0):
        return True

    def close(self, timeout=5.0):
        return True


class FileSender(NullSender):
    """Appends NDJSON to a local file, for offline runs; the file can be
    posted later as is."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._f = open(path, "a", encoding="utf-8")

    def put(self, record):
        try:
            line = encode([record]).decode("utf-8")
            with self._lock:
                self._f.write(line)
                self.sent += 1
        except Exception:
            pass

    def flush(self, timeout=5.0):
        with self._lock:
            self._f.flush()
        return True

    def close(self, timeout=5.0):
        with self._lock:
            if not self._f.closed:
                self._f.close()
        return True


__all__ = ["Sender", "NullSender", "FileSender", "encode", "ingest_url"]
