"""Background sender: batches records as NDJSON and POSTs them.

The training thread only appends to a bounded deque (O(1), one short lock);
a daemon thread encodes, compresses and sends. Nothing here raises into the
caller and nothing waits on the network except :meth:`Sender.close`, whose
wait is bounded. What cannot be delivered goes to a local file
(localfile.py), which ``deepseed import`` sends later.

sender_for() picks a run's sender from its arguments and the environment:
this one, or one of localfile.py's that never use the network.
"""

from __future__ import annotations

import collections
import gzip
import http.client
import ipaddress
import json
import logging
import os
import threading
import time
import urllib.parse

from .localfile import FileSender, LocalFile, NullSender, encode, import_hint, path_for
from .records import expand_steps

log = logging.getLogger("deepseed")

INGEST_PATH = "/api/v1/ingest"
DEFAULT_COLLECTOR_URL = "http://127.0.0.1:9464"


def ingest_url(base: str) -> str:
    """Returns the ingest endpoint for a collector or server base address."""
    base = base.rstrip("/")
    if base.endswith(INGEST_PATH):
        return base
    return base + INGEST_PATH


def base_url(url: str) -> str:
    """The collector or server base address of an ingest URL."""
    return url[: -len(INGEST_PATH)] if url.endswith(INGEST_PATH) else url


# Records the sender thread encodes before it lets the training thread have
# the interpreter: JSON holds the GIL, and a thread that asks for it back
# waits up to sys.getswitchinterval() (5 ms) for a busy holder.
ENCODE_CHUNK = 16


# Answers that mean "not now": the records stay queued and are sent again.
RETRY_STATUSES = (408, 425, 429)
# Answers that mean "these records are invalid": the only ones dropped.
BAD_RECORD_STATUSES = (400, 422)


def _bad_record(detail, n):
    """The index of the record an ingest 400 names ({"record": {"index":
    i}}), or None when it names none within a batch of n."""
    try:
        i = json.loads(detail)["record"]["index"]
    except Exception:
        return None
    return i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n else None


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
        local_path: where records that cannot be delivered go instead of
            being dropped: those evicted from a full queue, and at close
            those still waiting once nothing answers or the timeout is up.
            None drops them (and counts them in :attr:`dropped`).
        server: the server's address for the "send them later" hint, when
            url is the server itself rather than a collector.
    """

    def __init__(self, url, token=None, max_queue=10000, batch_size=500, flush_interval=1.0,
                 timeout=10.0, compress=True, max_backoff=30.0, local_path=None, server=None):
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
        self._batch = None  # the batch the sender thread is posting
        self._unreachable = False  # the last attempt got no answer at all
        self._local = LocalFile(local_path) if local_path else None
        self._server = base_url(server) if server else None
        self._steps_refused = False  # the destination predates steps records
        # Set once the destination refused these records for a reason no
        # retry mends (a wrong token, a wrong address): every record from
        # then on goes to the local file, to be sent with deepseed import.
        self._refused = None
        # Set by drain() once nothing answered while the run finished: what
        # is queued, in flight or put later goes to the local file at once.
        self._spill = False

        # Counters, readable by tests and by Run.summary().
        self.dropped = 0  # evicted from a full queue
        self.rejected = 0  # refused by the destination with a 4xx
        self.sent = 0
        self.failures = 0  # attempts that failed and were retried
        self.saved = 0  # written to local_path instead
        self._warned = set()

        self._thread = threading.Thread(target=self._loop, name="deepseed-sender", daemon=True)
        self._thread.start()

    # ---- training-thread side -------------------------------------------------

    def put(self, record) -> None:
        """Queues one record; never blocks on I/O, never raises."""
        try:
            evicted = None
            with self._lock:
                if self._spill or (self._closing and self._deadline is not None
                                   and time.monotonic() > self._deadline):
                    evicted = record
                else:
                    if len(self._q) >= self.max_queue:
                        evicted = self._q.popleft()
                    self._q.append(record)
                n = len(self._q)
            if evicted is not None:
                self._keep_locally([evicted])
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

    def drain(self, timeout=5.0) -> bool:
        """flush, but gives up as soon as an attempt gets no answer at all:
        what finish() waits on before the end record. Once it gave up so,
        what is queued or in flight goes to the local file at once, and so
        does every record put later (the end record): the end record's
        counts then say where the records are (records_saved_locally), not
        that they are still pending."""
        end = time.monotonic() + timeout
        self._wake.set()
        with self._lock:
            self._unreachable = False
            while self._q or self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                if self._unreachable:
                    break
                self._idle.wait(min(left, 0.05))
                self._wake.set()
            else:
                return True
        if self._local is not None and self._local.failed is None:
            self._spill_locally(end)
        return False

    def _spill_locally(self, end):
        """Sends what is queued to the local file and has the sender
        thread do the same with its batch in flight, waiting for that
        until end (monotonic) at most."""
        with self._lock:
            self._spill = True
            left = list(self._q)
            self._q.clear()
        self._wake.set()
        self._keep_locally(left)
        with self._lock:
            while self._inflight:
                wait = end - time.monotonic()
                if wait <= 0:
                    break
                self._idle.wait(min(wait, 0.05))
                self._wake.set()

    def close(self, timeout=5.0) -> bool:
        """Sends what is queued, waiting at most timeout seconds, then stops.
        Returns True when everything was handed over."""
        timeout = max(0.0, timeout)
        with self._lock:
            self._closing = True
            self._deadline = time.monotonic() + timeout
            # One more try at close, whatever the last attempt saw.
            self._unreachable = False
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            left = list(self._q)
            self._q.clear()
            if self._thread.is_alive() and self._batch:
                # Still waiting on an answer: keep a copy. Should it get
                # through after all, the server stores it once.
                left = list(self._batch) + left
        self._keep_locally(left)
        if self._local is not None:
            self._local.close()
        if self.saved and self._local.failed is None:
            log.warning("deepseed: %d records could not be sent to %s%s; they are in %s. "
                        "Send them later with: %s", self.saved, base_url(self.url),
                        " (%s)" % self._refused if self._refused else "", self._local.path,
                        import_hint(self._local.path, self._server, self.token or self._refused))
        elif left:
            self._warn_once("close", "deepseed: gave up on %d records at exit after %.1fs", len(left), timeout)
        return not left

    def _keep_locally(self, records):
        """Writes records that cannot be delivered to the local file, or
        counts them dropped when there is none or it fails."""
        n = self._local.write(records) if self._local is not None else 0
        with self._lock:
            self.saved += n
            self.dropped += len(records) - n
        if self._local is not None and self._local.failed is not None:
            self._warn_once("local", "deepseed: cannot write %s (%s); records that cannot be sent are dropped",
                            self._local.path, self._local.failed)

    @property
    def local_path(self):
        """The file undeliverable records went to, or None if none did."""
        return self._local.path if self._local is not None and self._local.written else None

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
            if closing and (empty or self._past_deadline() or self._unreachable):
                break
            if empty or (not closing and len(self._q) < self.batch_size):
                self._wake.wait(self.flush_interval if not closing else 0.05)
                self._wake.clear()
            batch = self._take()
            if not batch:
                continue
            ok = False
            if self._refused or self._spill:
                self._keep_locally(batch)
                batch = []
            while batch:
                ok, retry, rest = self._post(batch)
                if rest:
                    # The destination named one bad record and stored
                    # nothing: send the others again at once.
                    batch = rest
                    with self._lock:
                        self._inflight = len(batch)
                        self._batch = batch
                    continue
                if ok or not retry:
                    break
                self.failures += 1
                # At close, nothing listening means nothing will: the
                # records go to the local file now rather than at the
                # deadline.
                if not (self._closing and self._unreachable):
                    # Wait before retrying, but never past close()'s deadline.
                    self._sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                if self._spill:
                    self._keep_locally(batch)
                    batch = None
                    break
                if self._closing and (self._past_deadline() or self._unreachable):
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
                self._batch = None
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
            if left <= 0 or self._spill or (self._closing and self._past_deadline()):
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
            self._batch = batch
        return batch

    def _requeue_merge(self, batch):
        # The batch being retried counts against the queue bound, so a long
        # outage keeps memory bounded: keep the newest max_queue records.
        evicted = []
        with self._lock:
            total = len(batch) + len(self._q)
            over = total - self.max_queue
            if over > 0:
                cut = min(over, len(batch))
                evicted = batch[:cut]
                batch = batch[cut:]
                over -= cut
                for _ in range(over):
                    evicted.append(self._q.popleft())
            room = self.batch_size - len(batch)
            while room > 0 and self._q:
                batch.append(self._q.popleft())
                room -= 1
            self._inflight = len(batch)
            self._batch = batch
        self._keep_locally(evicted)
        return batch

    def _post(self, batch):
        """Returns (ok, retry, rest): rest, when not None, is the batch
        without the one record the destination refused as bad, to be sent
        again at once."""
        if self._steps_refused and any(r.get("kind") == "steps" for r in batch):
            self._expand(batch)
        try:
            body = encode(batch, ENCODE_CHUNK)
        except Exception as e:  # pragma: no cover - encode has a default
            self._warn_once("encode", "deepseed: could not encode records: %s", e)
            self.rejected += len(batch)
            return False, False, None
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
            self._unreachable = False
        except Exception as e:  # connection refused, timeout, DNS, reset…
            self._unreachable = True
            self._drop_conn()
            self._warn_once("conn", "deepseed: cannot reach %s (%s); holding up to %d records and retrying "
                            "(is %s right?)%s", self.url, e, self.max_queue, self._url_var(),
                            "; what cannot be sent goes to " + self._local.path if self._local is not None else "")
            return False, True, None
        if 200 <= code < 300:
            self.sent += len(batch)
            return True, False, None
        if code in RETRY_STATUSES or code >= 500:
            # Not now: the queue holds the records and, at exit, what is
            # left goes to the local file.
            self._warn_once("http%d" % code, "deepseed: %s answered %d, retrying: %s", self.url, code, detail[:500])
            return False, True, None
        if (code == 400 and not self._steps_refused and "unknown kind" in detail and "steps" in detail
                and any(r.get("kind") == "steps" for r in batch)):
            # A server or collector older than the steps record: its steps
            # go one record each from now on, this batch at once.
            self._steps_refused = True
            self._warn_once("steps", "deepseed: %s takes no steps records; sending one record a step", self.url)
            return self._post(batch)
        if code in BAD_RECORD_STATUSES:
            bad = _bad_record(detail, len(batch))
            if bad is not None and len(batch) > 1:
                self.rejected += 1
                self._warn_once("reject", "deepseed: %s refused a record as invalid with %d (it is dropped and "
                                "counted in records_rejected): %s", self.url, code, detail[:500])
                return False, False, batch[:bad] + batch[bad + 1:]
            self.rejected += len(batch)
            self._warn_once("reject", "deepseed: %s refused %d records as invalid with %d (they are dropped and "
                            "counted in records_rejected): %s", self.url, len(batch), code, detail[:500])
            return False, False, None
        self._refuse(code, detail)
        self._keep_locally(batch)
        return False, False, None

    def _token_var(self):
        return "DEEPSEED_TOKEN" if self._server else "DEEPSEED_COLLECTOR_TOKEN"

    def _url_var(self):
        return "DEEPSEED_SERVER_URL" if self._server else "DEEPSEED_COLLECTOR_URL"

    def _refuse(self, code, detail):
        """Sends every record from now on to the local file: the
        destination refused them for a reason that retrying cannot mend,
        and says once which setting to fix and how to send them later."""
        if code in (401, 403):
            why = "the token was refused with %d; set %s to a token the server accepts" % (code, self._token_var())
        else:
            why = "answered %d; set %s to the address of a DeepSeed %s" % (
                code, self._url_var(), "server" if self._server else "collector")
        self._refused = why
        detail = detail[:200].strip()
        if self._local is None:
            self._warn_once("refused", "deepseed: %s: %s (%s); records are dropped", base_url(self.url), why, detail)
            return
        self._warn_once("refused", "deepseed: %s: %s (%s). This run's records go to %s instead; send them with: %s",
                        base_url(self.url), why, detail, self._local.path,
                        import_hint(self._local.path, self._server, True))

    def _expand(self, batch):
        """Replaces the batch's steps records by their step records, in
        place (the batch being posted is the one close() keeps)."""
        batch[:] = expand_steps(batch)
        with self._lock:
            self._inflight = len(batch)

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
                detail = data[:4096].decode("utf-8", "replace")
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


def sender_for(run_id, rank, world_size, mode=None, collector_url=None, server_url=None, token=None,
               max_queue=10000, batch_size=500, flush_interval=1.0, compress=None, file=None):
    """The sender of a run's process (rank of world_size), from the run's
    init() arguments and the environment: none when the mode
    (DEEPSEED_MODE) disables sending, a FileSender offline or given a file
    (DEEPSEED_FILE), else a Sender to the server (server_url,
    DEEPSEED_SERVER_URL) or to the node's collector."""
    mode = (mode or os.environ.get("DEEPSEED_MODE") or "online").lower()
    if mode in ("disabled", "off", "false", "0"):
        return NullSender()
    file = file or os.environ.get("DEEPSEED_FILE")
    if mode == "offline" or file:
        return FileSender(file or path_for(run_id, rank, world_size))
    if compress is None and os.environ.get("DEEPSEED_GZIP"):
        compress = os.environ["DEEPSEED_GZIP"].lower() not in ("0", "false", "no")
    server_url = server_url or os.environ.get("DEEPSEED_SERVER_URL")
    server = None
    if server_url:
        server = server_url
        url = ingest_url(server_url)
        token = token or os.environ.get("DEEPSEED_TOKEN")
    else:
        url = ingest_url(collector_url or os.environ.get("DEEPSEED_COLLECTOR_URL") or DEFAULT_COLLECTOR_URL)
        token = token or os.environ.get("DEEPSEED_COLLECTOR_TOKEN")
    if compress is None:
        compress = not is_loopback(url)
    return Sender(url, token=token, max_queue=max_queue, batch_size=batch_size, flush_interval=flush_interval,
                  compress=compress, local_path=path_for(run_id, rank, world_size), server=server)


def is_loopback(url):
    """True when url names this machine by a loopback address or
    localhost: there gzip would cost the training host CPU to save bytes
    that never cross a network (the node's collector, by default)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["Sender", "sender_for", "ingest_url", "base_url"]
