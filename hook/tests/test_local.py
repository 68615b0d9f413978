"""Nothing listening: the records go to a local file, the run says where
and how to send them, and the exit never waits past the flush timeout."""

import json
import os
import shutil
import socket
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
from deepseed.records import expand_steps  # noqa: E402
from deepseed.sender import Sender  # noqa: E402

from .capture import Capture  # noqa: E402


def closed_port_url():
    """An address where nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port


def read_ndjson(path):
    with open(path, encoding="utf-8") as f:
        return expand_steps(json.loads(line) for line in f if line.strip())


SCRIPT = """
import sys, time
sys.path.insert(0, %(hook)r)
import deepseed
run = deepseed.init(project="offline-test", name="nothing-listens", collector_url=%(url)r,
                    flush_timeout=%(flush)s, params={"lr": 0.1},
                    meta={"model": "tiny", "zero_stage": 0, "precision": "fp32"})
for i in range(1, 21):
    run.log_step(i, loss=1.0 / i, lr=0.1, samples=8, step_ms=12.5)
run.log_eval(20, loss=0.5, accuracy=0.75)
t0 = time.monotonic()
run.finish()
print("finish_s=%%.3f run_id=%%s" %% (time.monotonic() - t0, run.run_id), flush=True)
"""


class LocalFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="deepseed-offline-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_script(self, url, flush=5, extra_env=None):
        env = dict(os.environ, DEEPSEED_OFFLINE_DIR=self.dir)
        for k in ("DEEPSEED_SERVER_URL", "DEEPSEED_MODE", "DEEPSEED_FILE", "DEEPSEED_RUN_ID"):
            env.pop(k, None)
        env.update(extra_env or {})
        code = textwrap.dedent(SCRIPT % {"hook": HOOK, "url": url, "flush": flush})
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        return p, time.monotonic() - t0

    def test_nothing_listening_writes_a_local_file_at_once(self):
        # A flush timeout far beyond the subprocess's own limit: the run
        # ends at all only by not waiting it out.
        p, _ = self.run_script(closed_port_url(), flush=3600)
        self.assertEqual(p.returncode, 0, p.stderr)
        fields = dict(kv.split("=", 1) for kv in p.stdout.split())
        run_id, finish_s = fields["run_id"], float(fields["finish_s"])
        self.assertLess(finish_s, 3600, "finish waited out the flush timeout with nothing listening")
        path = os.path.join(self.dir, run_id + ".ndjson")
        self.assertTrue(os.path.exists(path), "no local file %s; stderr:\n%s" % (path, p.stderr))
        recs = read_ndjson(path)
        kinds = [r["kind"] for r in recs]
        for k in ("process", "run", "eval", "end"):
            self.assertIn(k, kinds)
        self.assertEqual(sorted(r["step"] for r in recs if r["kind"] == "step"), list(range(1, 21)))
        self.assertEqual(len(recs), len(set(json.dumps(r, sort_keys=True) for r in recs)), "a record written twice")
        # Where, and how to send it later.
        self.assertIn(path, p.stderr)
        self.assertIn("deepseed import " + path, p.stderr)
        self.assertNotIn("gave up", p.stderr)

    def test_exit_never_waits_past_the_flush_timeout(self):
        cap = Capture(hold=True)  # takes the connection, answers after 60 s
        try:
            p, _ = self.run_script(cap.url, flush=1)
        finally:
            requests = list(cap.requests)
            cap.close()
        self.assertEqual(p.returncode, 0, p.stderr)
        fields = dict(kv.split("=", 1) for kv in p.stdout.split())
        # The process ended while the server still held its request (it
        # answers after 60 s): the exit did not wait for the answer.
        self.assertEqual(requests, [])
        recs = read_ndjson(os.path.join(self.dir, fields["run_id"] + ".ndjson"))
        self.assertIn("end", [r["kind"] for r in recs])
        self.assertEqual(len([r for r in recs if r["kind"] == "step"]), 20)

    def assert_summary_says_all_saved_locally(self, p):
        # The end record is the last line of the file: its counts are of
        # every record before it, all of which are in the file.
        self.assertEqual(p.returncode, 0, p.stderr)
        run_id = dict(kv.split("=", 1) for kv in p.stdout.split())["run_id"]
        with open(os.path.join(self.dir, run_id + ".ndjson"), encoding="utf-8") as f:
            lines = [json.loads(x) for x in f if x.strip()]
        self.assertEqual(lines[-1]["kind"], "end")
        summ = lines[-1]["summary"]
        self.assertEqual({k: summ[k] for k in ("records_saved_locally", "records_pending", "records_sent",
                                                 "records_dropped")},
                         {"records_saved_locally": len(lines) - 1, "records_pending": 0, "records_sent": 0,
                          "records_dropped": 0})

    def test_summary_counts_records_kept_locally_with_nothing_listening(self):
        self.assert_summary_says_all_saved_locally(self.run_script(closed_port_url())[0])

    def test_summary_counts_records_kept_locally_offline(self):
        p, _ = self.run_script(closed_port_url(), extra_env={"DEEPSEED_MODE": "offline"})
        self.assert_summary_says_all_saved_locally(p)

    def test_ranks_write_their_own_files(self):
        p, _ = self.run_script(closed_port_url(), extra_env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                                             "DEEPSEED_RUN_ID": "two-ranks"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "two-ranks.rank1.ndjson")), os.listdir(self.dir))

    def test_offline_mode_says_how_to_send(self):
        p, _ = self.run_script(closed_port_url(), extra_env={"DEEPSEED_MODE": "offline"})
        self.assertEqual(p.returncode, 0, p.stderr)
        run_id = dict(kv.split("=", 1) for kv in p.stdout.split())["run_id"]
        path = os.path.join(self.dir, run_id + ".ndjson")
        self.assertEqual(len([r for r in read_ndjson(path) if r["kind"] == "step"]), 20)
        self.assertIn("deepseed import " + path, p.stderr)

    def test_full_queue_spills_instead_of_dropping(self):
        cap = Capture(hold=True)
        path = os.path.join(self.dir, "spill.ndjson")
        try:
            s = Sender(cap.url + "/api/v1/ingest", max_queue=50, batch_size=10, flush_interval=0.01, local_path=path)
            s.put({"kind": "event", "i": 0})
            self.assertTrue(cap.got_request.wait(10), "first batch never posted")
            for i in range(1, 1000):
                s.put({"kind": "event", "i": i})
            self.assertEqual(s.dropped, 0)
            self.assertEqual(s.saved, 949)
            cap.release()
            self.assertTrue(s.flush(20))
            self.assertTrue(s.close(5))
        finally:
            cap.close()
        sent = [r["i"] for r in cap.records()]
        kept = [r["i"] for r in read_ndjson(path)]
        self.assertEqual(sorted(sent + kept), list(range(1000)))


@unittest.skipUnless(os.environ.get("DEEPSEED_TEST_SERVER_URL") and os.environ.get("DEEPSEED_TEST_BINARY"),
                     "DEEPSEED_TEST_SERVER_URL and DEEPSEED_TEST_BINARY not set")
class ImportLaterTest(unittest.TestCase):
    """The file written with nothing listening, sent later with
    deepseed import to a real server, is the run."""

    def test_import_the_local_file(self):
        url = os.environ["DEEPSEED_TEST_SERVER_URL"].rstrip("/")
        token = os.environ.get("DEEPSEED_TEST_TOKEN")
        d = tempfile.mkdtemp(prefix="deepseed-offline-")
        self.addCleanup(shutil.rmtree, d, True)
        env = dict(os.environ, DEEPSEED_OFFLINE_DIR=d)
        for k in ("DEEPSEED_SERVER_URL", "DEEPSEED_MODE", "DEEPSEED_FILE", "DEEPSEED_RUN_ID"):
            env.pop(k, None)
        code = textwrap.dedent(SCRIPT % {"hook": HOOK, "url": closed_port_url(), "flush": 5})
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        run_id = dict(kv.split("=", 1) for kv in p.stdout.split())["run_id"]
        path = os.path.join(d, run_id + ".ndjson")

        ienv = dict(os.environ)
        if token:
            ienv["DEEPSEED_TOKEN"] = token
        imp = subprocess.run([os.environ["DEEPSEED_TEST_BINARY"], "import", path, "--server", url],
                             capture_output=True, text=True, timeout=120, env=ienv)
        self.assertEqual(imp.returncode, 0, imp.stderr)

        def get(path_):
            req = urllib.request.Request(url + path_)
            if token:
                req.add_header("Authorization", "Bearer " + token)
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())

        run = get("/api/v1/runs/" + run_id)
        self.assertEqual(run.get("project"), "offline-test", run)
        self.assertEqual(run.get("status"), "finished", run)
        series = get("/api/v1/runs/%s/series?metric=loss" % run_id)["series"]
        self.assertEqual(len(series), 1, series)
        points = {p_["step"]: p_["value"] for p_ in series[0]["points"]}
        self.assertEqual(sorted(points), list(range(1, 21)))
        self.assertAlmostEqual(points[20], 1.0 / 20)

        # Sent again, nothing is stored twice.
        again = subprocess.run([os.environ["DEEPSEED_TEST_BINARY"], "import", path, "--server", url],
                               capture_output=True, text=True, timeout=120, env=ienv)
        self.assertEqual(again.returncode, 0, again.stderr)
        series = get("/api/v1/runs/%s/series?metric=loss" % run_id)["series"]
        self.assertEqual([p_["count"] for p_ in series[0]["points"]], [1] * 20)


if __name__ == "__main__":
    unittest.main()
