"""A refused answer never loses the run: a wrong token, a wrong address or
a busy destination sends the records to the local file, with one message
naming the setting to fix and the command that sends the file later; only
records the destination names as invalid are dropped, and counted."""

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import urllib.request

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.sender import Sender  # noqa: E402

from .capture import Capture  # noqa: E402


def read_ndjson(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def wait_until(cond, limit=60):
    """Polls cond until it holds; the limit only keeps a broken run from
    hanging the suite."""
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


class RefusedTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="deepseed-refused-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "run.ndjson")

    def capture(self, **kw):
        cap = Capture(**kw)
        self.addCleanup(cap.close)
        return cap

    def sender(self, cap, **kw):
        kw.setdefault("batch_size", 5)
        kw.setdefault("flush_interval", 0.01)
        return Sender(cap.url + "/api/v1/ingest", local_path=self.path, **kw)

    def test_refused_token_keeps_every_record_locally(self):
        for code in (401, 403):
            with self.subTest(code=code):
                if os.path.exists(self.path):
                    os.remove(self.path)
                cap = self.capture(statuses=[code] * 100)
                s = self.sender(cap, token="wrong")
                with self.assertLogs("deepseed", level="WARNING") as cm:
                    for i in range(23):
                        s.put({"kind": "event", "i": i})
                    self.assertTrue(s.flush(20))
                    self.assertTrue(s.close(5))
                self.assertEqual([r["i"] for r in read_ndjson(self.path)], list(range(23)))
                self.assertEqual((s.dropped, s.rejected, s.saved), (0, 0, 23))
                # Refused once: the later batches are not sent to be refused again.
                self.assertEqual(len(cap.requests), 1)
                first = cm.output[0]
                self.assertIn("token was refused with %d" % code, first)
                self.assertIn("DEEPSEED_COLLECTOR_TOKEN", first)
                self.assertIn("deepseed import " + self.path, first)
                self.assertEqual(len([m for m in cm.output if "refused" in m]), 2, cm.output)  # now, and at close
                self.assertNotIn("wrong", "\n".join(cm.output), "the token itself was logged")

    def test_wrong_address_keeps_records_and_names_the_server_variable(self):
        cap = self.capture(statuses=[404] * 10)
        s = Sender(cap.url + "/api/v1/ingest", local_path=self.path, server=cap.url, batch_size=5,
                   flush_interval=0.01)
        with self.assertLogs("deepseed", level="WARNING") as cm:
            for i in range(7):
                s.put({"kind": "event", "i": i})
            self.assertTrue(s.flush(20))
            self.assertTrue(s.close(5))
        self.assertEqual(len(read_ndjson(self.path)), 7)
        self.assertEqual(s.dropped, 0)
        self.assertIn("DEEPSEED_SERVER_URL", cm.output[0])
        self.assertIn("deepseed import %s --server %s" % (self.path, cap.url), cm.output[0])

    def test_busy_destination_is_retried_then_kept_locally(self):
        for code in (429, 503):
            with self.subTest(code=code):
                if os.path.exists(self.path):
                    os.remove(self.path)
                cap = self.capture(statuses=[code] * 1000)
                s = self.sender(cap, max_backoff=0.05)
                with self.assertLogs("deepseed", level="WARNING") as cm:
                    for i in range(9):
                        s.put({"kind": "event", "i": i})
                    # Answered "not now", the batch is sent again.
                    self.assertTrue(wait_until(lambda: len(cap.requests) > 1), "a busy answer was not retried")
                    s.close(0.5)
                self.assertEqual(sorted(r["i"] for r in read_ndjson(self.path)), list(range(9)))
                self.assertEqual((s.dropped, s.rejected), (0, 0))
                self.assertIn("deepseed import " + self.path, cm.output[-1])

    def test_only_the_invalid_record_is_dropped(self):
        cap = self.capture(bad_kind="bad")
        s = self.sender(cap, batch_size=10)
        with self.assertLogs("deepseed", level="WARNING") as cm:
            for i in range(10):
                s.put({"kind": "bad" if i in (3, 7) else "event", "i": i})
            self.assertTrue(s.flush(20))
            s.close(5)
        self.assertEqual([r["i"] for r in cap.records()], [0, 1, 2, 4, 5, 6, 8, 9])
        self.assertEqual((s.rejected, s.dropped, s.saved, s.sent), (2, 0, 0, 8))
        self.assertIn("records_rejected", cm.output[0])
        self.assertFalse(os.path.exists(self.path))

    def test_end_record_counts_the_refused_and_the_rejected(self):
        cap = self.capture(statuses=[400, 401])
        keep = os.environ.get("DEEPSEED_OFFLINE_DIR")
        os.environ["DEEPSEED_OFFLINE_DIR"] = self.dir
        try:
            with self.assertLogs("deepseed", level="WARNING"):
                run = deepseed.init(project="t", name="refused", collector_url=cap.url, flush_interval=0.05,
                                    handle_signals=False)
                for i in range(1, 4):
                    run.log_step(i, loss=1.0)
                run.finish()
        finally:
            if keep is None:
                os.environ.pop("DEEPSEED_OFFLINE_DIR")
            else:
                os.environ["DEEPSEED_OFFLINE_DIR"] = keep
        recs = read_ndjson(os.path.join(self.dir, run.run_id + ".ndjson"))
        end = [r for r in recs if r["kind"] == "end"]
        self.assertEqual(len(end), 1, recs)
        summ = end[0]["summary"]
        # The first batch was refused as invalid; everything after the
        # refused token is in the file, the end record too.
        self.assertGreaterEqual(summ["records_rejected"], 1)
        self.assertEqual(summ["records_rejected"] + summ["records_saved_locally"], 5)  # process, run, 3 steps
        self.assertEqual(summ["records_saved_locally"], len(recs) - 1)
        self.assertEqual((summ["records_dropped"], summ["records_sent"]), (0, 0))


SCRIPT = """
import sys
sys.path.insert(0, %(hook)r)
import deepseed
run = deepseed.init(project="refused-test", name="wrong-token", params={"lr": 0.1})
for i in range(1, 301):
    run.log_step(i, loss=1.0 / i, lr=0.1, samples=8, step_ms=12.5)
run.finish()
print(run.run_id, flush=True)
"""


@unittest.skipUnless(os.environ.get("DEEPSEED_TEST_SERVER_URL") and os.environ.get("DEEPSEED_TEST_BINARY")
                     and os.environ.get("DEEPSEED_TEST_TOKEN"),
                     "DEEPSEED_TEST_SERVER_URL, DEEPSEED_TEST_TOKEN and DEEPSEED_TEST_BINARY not set")
class RealServerRefusedTest(unittest.TestCase):
    """A real deepseed server refuses the token: the run is kept whole and
    deepseed import with the right token stores it."""

    def setUp(self):
        self.url = os.environ["DEEPSEED_TEST_SERVER_URL"].rstrip("/")
        self.token = os.environ["DEEPSEED_TEST_TOKEN"]
        self.dir = tempfile.mkdtemp(prefix="deepseed-refused-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def get(self, path):
        req = urllib.request.Request(self.url + path, headers={"Authorization": "Bearer " + self.token})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def test_wrong_token_then_import(self):
        env = dict(os.environ, DEEPSEED_OFFLINE_DIR=self.dir, DEEPSEED_SERVER_URL=self.url,
                   DEEPSEED_TOKEN="wrong-token")
        for k in ("DEEPSEED_MODE", "DEEPSEED_FILE", "DEEPSEED_RUN_ID"):
            env.pop(k, None)
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT % {"hook": HOOK})], capture_output=True,
                           text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        run_id = p.stdout.strip()
        path = os.path.join(self.dir, run_id + ".ndjson")
        recs = read_ndjson(path)
        self.assertEqual([r["step"] for r in recs if r["kind"] == "step"], list(range(1, 301)))
        end = [r for r in recs if r["kind"] == "end"]
        self.assertEqual(len(end), 1, p.stderr)
        self.assertEqual(end[0]["summary"]["records_dropped"], 0)
        self.assertIn("DEEPSEED_TOKEN", p.stderr)
        self.assertIn("deepseed import %s --server %s" % (path, self.url), p.stderr)
        self.assertNotIn("wrong-token", p.stderr)

        imp = subprocess.run([os.environ["DEEPSEED_TEST_BINARY"], "import", path, "--server", self.url],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, DEEPSEED_TOKEN=self.token))
        self.assertEqual(imp.returncode, 0, imp.stderr)
        run = self.get("/api/v1/runs/" + run_id)
        self.assertEqual(run.get("status"), "finished", run)
        series = self.get("/api/v1/runs/%s/series?metric=loss" % run_id)["series"]
        self.assertEqual(sorted(p_["step"] for p_ in series[0]["points"]), list(range(1, 301)))

    def test_only_the_invalid_record_is_dropped(self):
        s = Sender(self.url + "/api/v1/ingest", token=self.token, batch_size=50, flush_interval=0.01,
                   local_path=os.path.join(self.dir, "x.ndjson"), server=self.url)
        run_id = "refused-bad-record"
        s.put({"kind": "run", "run_id": run_id, "project": "refused-test", "name": "bad-record"})
        logging.getLogger("deepseed").setLevel(logging.ERROR)
        self.addCleanup(logging.getLogger("deepseed").setLevel, logging.NOTSET)
        for i in range(1, 11):
            s.put({"kind": "step", "run_id": run_id, "rank": -1 if i == 4 else 0, "step": i, "loss": float(i)})
        self.assertTrue(s.flush(30))
        s.close(5)
        self.assertEqual((s.rejected, s.dropped, s.saved), (1, 0, 0))
        series = self.get("/api/v1/runs/%s/series?metric=loss" % run_id)["series"]
        self.assertEqual(sorted(p_["step"] for p_ in series[0]["points"]), [1, 2, 3, 5, 6, 7, 8, 9, 10])


if __name__ == "__main__":
    unittest.main()
