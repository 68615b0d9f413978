"""A real HTTP server on 127.0.0.1 that records what the hook posts."""

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deepseed.records import expand_steps


class Capture:
    """Collects POSTed NDJSON batches.

    statuses: codes answered to the first requests, in order; then 200.
    hold: when set, every request waits until release() before answering.
    bad_kind: records of this kind are refused as ingest refuses an
        invalid record: 400 naming the first one's index, nothing kept.
    """

    def __init__(self, statuses=(), hold=False, keep_alive=False, drop_idle=False, refuse_steps=False, bad_kind=None):
        self.lock = threading.Lock()
        self.requests = []  # (path, headers, raw body, records)
        self.statuses = list(statuses)
        self.release_event = threading.Event()
        if not hold:
            self.release_event.set()
        self.got_request = threading.Event()
        self.peers = []  # client (host, port) of each request
        cap = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 keeps connections open between requests; drop_idle
            # closes each one after its answer without saying so, as a
            # server timing out an idle keep-alive connection does.
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n)
                raw = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
                # A steps record (many steps in columns) is read as the step
                # records it holds, as the server stores them.
                lines = [json.loads(l) for l in raw.decode("utf-8").splitlines() if l.strip()]
                recs = expand_steps(lines)
                cap.got_request.set()
                cap.release_event.wait(60)
                bad = [i for i, r in enumerate(recs) if bad_kind is not None and r.get("kind") == bad_kind]
                with cap.lock:
                    status = cap.statuses.pop(0) if cap.statuses else (400 if bad else 200)
                    out = b'{"accepted":%d}' % len(recs) if status == 200 else b'{"error":"test"}'
                    if status == 400 and bad:
                        out = json.dumps({"error": "invalid batch, nothing stored",
                                          "record": {"index": bad[0], "kind": bad_kind, "message": "test"}}).encode()
                    kinds = [r.get("kind") for r in lines]
                    if refuse_steps and "steps" in kinds:
                        # What a server older than the steps record answers.
                        status = 400
                        out = json.dumps({"error": "invalid batch, nothing stored: line %d: field kind: unknown kind "
                                          "\"steps\" (want one of run, step, layers)" % (kinds.index("steps") + 1),
                                          "record": {"index": kinds.index("steps"), "field": "kind"}}).encode()
                    cap.requests.append((self.path, dict(self.headers), raw, recs, status))
                    cap.peers.append(self.client_address)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass
                if drop_idle:
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release(self):
        self.release_event.set()

    def records(self, kind=None, accepted_only=True):
        with self.lock:
            out = []
            for _, _, _, recs, status in self.requests:
                if accepted_only and status != 200:
                    continue
                out.extend(r for r in recs if kind is None or r.get("kind") == kind)
            return out

    def raw_lines(self, kind):
        """The NDJSON lines of accepted records of kind, as sent."""
        with self.lock:
            out = []
            for _, _, raw, _, status in self.requests:
                if status != 200:
                    continue
                for line in raw.decode("utf-8").splitlines():
                    if line.strip() and json.loads(line).get("kind") == kind:
                        out.append(line)
            return out

    def close(self):
        self.release_event.set()
        self.server.shutdown()
        self.server.server_close()
