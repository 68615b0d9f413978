"""Core tests: a real local HTTP server, no torch."""

import json
import logging
import math
import os
import re
import subprocess
import sys
import textwrap
import time
import unittest
import urllib.request

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed import env  # noqa: E402
from deepseed.sender import Sender  # noqa: E402

from .capture import Capture  # noqa: E402

RECORDS_GO = os.path.join(os.path.dirname(HOOK), "api", "records.go")
STRUCT_OF_KIND = {"run": "Run", "step": "Step", "layers": "Layers", "eval": "Eval", "memory": "Memory",
                  "event": "Event", "end": "End", "process": "Process"}


def go_json_fields():
    """JSON field names of each struct in api/records.go."""
    with open(RECORDS_GO, encoding="utf-8") as f:
        src = f.read()
    out = {}
    for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", src, re.S | re.M):
        out[m.group(1)] = set(re.findall(r'json:"([a-z0-9_]+)', m.group(2)))
    return out


def quiet_run(url, **kw):
    kw.setdefault("flush_interval", 0.05)
    kw.setdefault("handle_signals", False)
    return deepseed.init(project="test", name="core", collector_url=url, **kw)


class RecordsTest(unittest.TestCase):
    def setUp(self):
        self.cap = Capture()

    def tearDown(self):
        self.cap.close()

    def test_records_match_wire_contract(self):
        ds_config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
                     "fp16": {"enabled": True}, "zero_optimization": {"stage": 2,
                     "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
        run = quiet_run(self.cap.url, config=ds_config, params={"lr": 2e-5}, tags=["a", "b"], sweep_id="sw1")
        run.update_meta(model="bert-large-uncased", params=335141890, gpu="Tesla T4")
        run.log_step(1, loss=0.69, lr=2e-5, samples=16, tokens=4096, grad_norm=1.5, step_ms=100.0, epoch=0.1,
                     forward_ms=30, backward_ms=50, optimizer_ms=10, data_ms=3, loss_scale=65536.0, skipped=False,
                     my_metric=3)
        run.log_step(2, loss=float("nan"), grad_norm=float("inf"))
        run.log_eval(2, loss=0.5, accuracy=0.9, f1=0.88, auc=0.95)
        run.event("checkpoint", "saved step_2", step=2)
        run.log_memory()
        run.finish()

        recs = self.cap.records()
        kinds = [r["kind"] for r in recs]
        for k in ("process", "run", "step", "eval", "event", "memory", "end"):
            self.assertIn(k, kinds)
        self.assertEqual(kinds[0], "process")
        self.assertEqual(kinds[-1], "end")
        self.assertTrue(all(r["run_id"] == run.run_id for r in recs))

        if os.path.exists(RECORDS_GO):
            fields = go_json_fields()
            for r in recs:
                unknown = set(r) - fields[STRUCT_OF_KIND[r["kind"]]]
                self.assertFalse(unknown, "%s record has fields api/records.go lacks: %s" % (r["kind"], unknown))
            for r in self.cap.records("run"):
                self.assertFalse(set(r["meta"]) - fields["RunMeta"], r["meta"])

        p = self.cap.records("process")[0]
        self.assertEqual(p["pid"], os.getpid())
        self.assertEqual((p["rank"], p["local_rank"]), (0, 0))

        runrec = self.cap.records("run")[-1]
        self.assertEqual(runrec["config"], ds_config)
        self.assertEqual(runrec["params"], {"lr": 2e-5})
        self.assertEqual(runrec["tags"], ["a", "b"])
        m = runrec["meta"]
        self.assertEqual((m["zero_stage"], m["precision"], m["micro_batch"], m["grad_accum"], m["effective_batch"],
                          m["offload_optimizer"], m["world_size"], m["params"]), (2, "fp16", 4, 4, 16, "cpu", 1,
                                                                                   335141890))
        self.assertIn("python", m["versions"])
        self.assertEqual(m["command"], env.command())

        steps = self.cap.records("step")
        self.assertEqual([s["step"] for s in steps], [1, 2])
        s1 = steps[0]
        self.assertEqual(s1["samples"], 16)
        self.assertAlmostEqual(s1["throughput_sps"], 160.0)
        self.assertAlmostEqual(s1["throughput_tps"], 40960.0)
        self.assertEqual(s1["metrics"], {"my_metric": 3.0})
        self.assertIs(s1["skipped"], False)
        self.assertTrue(math.isnan(steps[1]["loss"]))
        self.assertEqual(steps[1]["grad_norm"], float("inf"))
        raw = b"".join(req[2] for req in self.cap.requests)
        self.assertIn(b'"loss":NaN', raw)
        self.assertIn(b'"grad_norm":Infinity', raw)

        ev = self.cap.records("eval")[0]
        self.assertEqual((ev["loss"], ev["accuracy"], ev["f1"], ev["split"]), (0.5, 0.9, 0.88, "val"))
        self.assertEqual(ev["metrics"], {"auc": 0.95})
        end = self.cap.records("end")[0]
        self.assertEqual(end["status"], "finished")
        self.assertEqual(end["summary"]["steps"], 2)

        path, headers = self.cap.requests[0][0], self.cap.requests[0][1]
        self.assertEqual(path, "/api/v1/ingest")
        # The capture server listens on loopback, as a node's collector
        # does: nothing to gain from compressing there.
        self.assertIsNone(headers.get("Content-Encoding"))
        self.assertEqual(headers.get("Content-Type"), "application/x-ndjson")
        self.assertNotIn("torch", sys.modules, "the core must not import torch")

    def test_server_mode_sends_token(self):
        run = deepseed.init(project="t", server_url=self.cap.url, token="s3cret", flush_interval=0.05,
                            handle_signals=False)
        run.log_step(0, loss=1.0)
        run.finish()
        self.assertEqual(self.cap.requests[0][1].get("Authorization"), "Bearer s3cret")
        self.assertEqual([r["step"] for r in self.cap.records("step")], [0])

    def test_gzip_where_bytes_cross_a_network(self):
        from deepseed.sender import sender_for

        def gz(url, env="", **kw):
            saved = os.environ.pop("DEEPSEED_GZIP", None)
            if env:
                os.environ["DEEPSEED_GZIP"] = env
            s = sender_for("r", 0, 1, collector_url=url, **kw)
            try:
                return s.compress
            finally:
                s.close(timeout=0.1)
                os.environ.pop("DEEPSEED_GZIP", None)
                if saved is not None:
                    os.environ["DEEPSEED_GZIP"] = saved
        self.assertFalse(gz("http://127.0.0.1:7411"))
        self.assertFalse(gz("http://localhost:7411"))
        self.assertFalse(gz("http://[::1]:7411"))
        self.assertTrue(gz("https://telemetry.example.org"))
        self.assertTrue(gz("http://10.0.0.7:7411"))
        self.assertTrue(gz("http://127.0.0.1:7411", "1"))
        self.assertFalse(gz("https://telemetry.example.org", "0"))
        self.assertTrue(gz("http://127.0.0.1:7411", compress=True))

    def test_steps_numbered_when_not_given(self):
        run = quiet_run(self.cap.url)
        run.log_step(loss=1.0)
        run.log_step(10, loss=1.0)
        run.log_step(loss=1.0)
        run.finish()
        self.assertEqual([r["step"] for r in self.cap.records("step")], [1, 10, 11])

    def test_step_time_from_wall_clock_without_watch(self):
        run = quiet_run(self.cap.url)
        # Clock readings around each call bracket what the run measures.
        before, after = {}, {}

        def log(step, **kw):
            before[step] = time.perf_counter()
            run.log_step(step, **kw)
            after[step] = time.perf_counter()

        log(1, loss=1.0, samples=8, tokens=1024)
        time.sleep(0.05)
        log(2, loss=1.0, samples=8, tokens=1024)
        time.sleep(0.09)
        log(5, loss=1.0, samples=8)  # three steps since step 2: a third of the time each
        log(6, loss=1.0, step_ms=7.0, samples=7)  # given: kept
        run.finish()
        steps = {r["step"]: r for r in self.cap.records("step")}
        self.assertNotIn("step_ms", steps[1])
        self.assertNotIn("throughput_sps", steps[1])
        s2 = steps[2]
        self.assertGreaterEqual(s2["step_ms"], 50.0)
        self.assertGreaterEqual(s2["step_ms"], (before[2] - after[1]) * 1000 - 1e-3)
        self.assertLessEqual(s2["step_ms"], (after[2] - before[1]) * 1000 + 1e-3)
        self.assertAlmostEqual(s2["throughput_sps"], 8 * 1000.0 / s2["step_ms"], places=3)
        self.assertAlmostEqual(s2["throughput_tps"], 1024 * 1000.0 / s2["step_ms"], places=1)
        s5 = steps[5]
        self.assertGreaterEqual(s5["step_ms"], 30.0)
        self.assertGreaterEqual(s5["step_ms"], (before[5] - after[2]) * 1000 / 3 - 1e-3)
        self.assertLessEqual(s5["step_ms"], (after[5] - before[2]) * 1000 / 3 + 1e-3)
        self.assertEqual(steps[6]["step_ms"], 7.0)
        self.assertAlmostEqual(steps[6]["throughput_sps"], 1000.0)

    def test_end_summary_counts_what_was_delivered(self):
        # A long flush interval: nothing leaves before finish(), so a count
        # read before the queue drains would say 0.
        run = quiet_run(self.cap.url, flush_interval=30, batch_size=10000)
        for i in range(50):
            run.log_step(i, loss=1.0)
        run.finish()
        recs = self.cap.records()
        end = self.cap.records("end")[0]
        before_end = len(recs) - 1
        self.assertEqual(end["summary"]["records_sent"], before_end)
        self.assertEqual(end["summary"]["records_pending"], 0)
        self.assertEqual(run.sender.sent, len(recs))

    def test_context_manager_marks_failure(self):
        with self.assertRaises(ValueError):
            with quiet_run(self.cap.url) as run:
                run.log_step(1, loss=1.0)
                raise ValueError("boom")
        end = self.cap.records("end")[-1]
        self.assertEqual(end["status"], "failed")
        self.assertIn("ValueError: boom", end["summary"]["error"])

    def test_bad_values_never_raise(self):
        run = quiet_run(self.cap.url)
        run.log_step(-5, loss=1.0)
        run.log_step("x")
        run.log_step(3, loss="not a number", samples=2.0)
        run.finish()
        steps = self.cap.records("step")
        self.assertEqual([s["step"] for s in steps], [3])
        self.assertNotIn("loss", steps[0])
        self.assertEqual(steps[0]["samples"], 2)


    def test_timings_rounded_to_what_events_resolve(self):
        run = quiet_run(self.cap.url)
        # What float32 CUDA event times look like once summed in Python.
        run.log_step(1, loss=0.9484409437125855, forward_ms=1.8432000875473022, backward_ms=3.4522999999999997,
                     step_ms=float("nan"), grad_norm=0.6170000000000001)
        run.finish()
        raw = self.cap.raw_lines("step")[0]
        self.assertIn('"forward_ms":1.8432,', raw)
        self.assertIn('"backward_ms":3.4523,', raw)
        self.assertIn('"step_ms":NaN', raw)
        # Only durations are rounded: a loss keeps every digit.
        self.assertIn('"loss":0.9484409437125855', raw)
        self.assertIn('"grad_norm":0.6170000000000001', raw)


class SenderTest(unittest.TestCase):
    def test_full_queue_drops_oldest_and_never_blocks(self):
        cap = Capture(hold=True)
        try:
            s = Sender(cap.url + "/api/v1/ingest", max_queue=50, batch_size=10, flush_interval=0.01)
            s.put({"kind": "event", "i": 0})
            self.assertTrue(cap.got_request.wait(10), "first batch never posted")
            # The server now holds the first request and answers nothing: every
            # put below must return while it hangs.
            for i in range(1, 1000):
                s.put({"kind": "event", "i": i})
            self.assertFalse(cap.release_event.is_set())
            self.assertEqual(s.dropped, 949)
            self.assertEqual(s.pending, 51)
            cap.release()
            self.assertTrue(s.flush(20))
            got = [r["i"] for r in cap.records()]
            self.assertEqual(got, [0] + list(range(950, 1000)))
            self.assertTrue(s.close(5))
        finally:
            cap.close()

    def test_retries_5xx_then_delivers_once(self):
        cap = Capture(statuses=[503, 500])
        try:
            s = Sender(cap.url, max_queue=100, batch_size=100, flush_interval=0.01)
            s.max_backoff = 0.05
            for i in range(5):
                s.put({"kind": "event", "i": i})
            self.assertTrue(s.flush(20))
            self.assertEqual([r["i"] for r in cap.records()], [0, 1, 2, 3, 4])
            self.assertEqual(s.failures, 2)
            self.assertEqual(s.rejected, 0)
            s.close(1)
        finally:
            cap.close()

    def test_batches_share_one_kept_alive_connection(self):
        cap = Capture(keep_alive=True)
        try:
            s = Sender(cap.url, max_queue=100, batch_size=100, flush_interval=0.01)
            for i in range(3):
                s.put({"kind": "event", "i": i})
                self.assertTrue(s.flush(20))
            self.assertEqual([r["i"] for r in cap.records()], [0, 1, 2])
            self.assertEqual(len(set(cap.peers)), 1, "each batch opened a new connection: %s" % cap.peers)
            s.close(1)
        finally:
            cap.close()

    def test_idle_connection_closed_by_server_is_reopened(self):
        cap = Capture(keep_alive=True, drop_idle=True)
        try:
            s = Sender(cap.url, max_queue=100, batch_size=100, flush_interval=0.01)
            for i in range(3):
                s.put({"kind": "event", "i": i})
                self.assertTrue(s.flush(20))
                time.sleep(0.05)  # let the server's close arrive
            self.assertEqual([r["i"] for r in cap.records()], [0, 1, 2])
            self.assertEqual(s.failures, 0)
            self.assertEqual(len(set(cap.peers)), 3)
            s.close(1)
        finally:
            cap.close()

    def test_retries_when_unreachable(self):
        cap = Capture()
        url = cap.url
        cap.close()  # nothing listens there now
        s = Sender(url, flush_interval=0.01, max_backoff=0.05)
        with self.assertLogs("deepseed", level="WARNING") as cm:
            s.put({"kind": "event"})
            deadline = time.monotonic() + 20
            while s.failures < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        self.assertGreaterEqual(s.failures, 3)
        self.assertEqual(len(cm.output), 1, "one warning, not one per retry")
        self.assertFalse(s.close(0.2))

    def test_4xx_dropped_with_one_warning(self):
        cap = Capture(statuses=[400, 400, 400])
        try:
            s = Sender(cap.url, batch_size=2, flush_interval=0.01)
            with self.assertLogs("deepseed", level="WARNING") as cm:
                for i in range(6):
                    s.put({"kind": "event", "i": i})
                self.assertTrue(s.flush(20))
            self.assertEqual(len(cap.requests), 3, "a refused batch is not retried")
            self.assertEqual(s.rejected, 6)
            self.assertEqual(len(cm.output), 1)
            self.assertIn("400", cm.output[0])
            s.close(1)
        finally:
            cap.close()

    def test_close_is_bounded_when_server_hangs(self):
        cap = Capture(hold=True)
        try:
            # The request would wait 120 s, the server answers after 60 s.
            s = Sender(cap.url, flush_interval=0.01, timeout=120)
            s.put({"kind": "event"})
            self.assertTrue(cap.got_request.wait(10))
            s.put({"kind": "event"})
            ok = s.close(0.5)
            self.assertFalse(ok)
            # close() returned while the server still held the request
            # (it answers only once released): it did not wait for it.
            self.assertEqual(cap.requests, [])
        finally:
            cap.close()


SCRIPT = """
import sys, time
sys.path.insert(0, %(hook)r)
import deepseed
run = deepseed.init(project="t", name="sub", collector_url=%(url)r, flush_timeout=%(flush)s, flush_interval=0.05)
run.log_step(1, loss=float("nan"))
%(body)s
"""


class ProcessTest(unittest.TestCase):
    def script(self, url, body, flush=5):
        code = textwrap.dedent(SCRIPT % {"hook": HOOK, "url": url, "flush": flush, "body": body})
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    def test_uncaught_exception_marks_run_failed(self):
        cap = Capture()
        try:
            p = self.script(cap.url, "raise RuntimeError('CUDA out of memory')")
            self.assertEqual(p.returncode, 1)
            self.assertIn("RuntimeError: CUDA out of memory", p.stderr)
            ends = cap.records("end")
            self.assertEqual(len(ends), 1)
            self.assertEqual(ends[0]["status"], "failed")
            self.assertIn("CUDA out of memory", ends[0]["summary"]["error"])
            self.assertTrue(math.isnan(cap.records("step")[0]["loss"]))
        finally:
            cap.close()

    def test_normal_exit_finishes_run(self):
        cap = Capture()
        try:
            p = self.script(cap.url, "pass")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual([e["status"] for e in cap.records("end")], ["finished"])
        finally:
            cap.close()

    def test_exit_flush_bounded_when_server_hangs(self):
        cap = Capture(hold=True)
        try:
            p = self.script(cap.url, "time.sleep(0.3)", flush=1)
            self.assertEqual(p.returncode, 0, p.stderr)
            # The process ended while the server still held its request.
            self.assertEqual(cap.requests, [])
        finally:
            cap.close()

    def test_sigterm_marks_run_killed(self):
        cap = Capture()
        try:
            code = textwrap.dedent(SCRIPT % {"hook": HOOK, "url": cap.url, "flush": 5,
                                             "body": "print('ready', flush=True)\ntime.sleep(60)"})
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            self.assertEqual(p.stdout.readline().strip(), "ready")
            p.terminate()
            p.wait(30)
            p.stdout.close()
            self.assertEqual([e["status"] for e in cap.records("end")], ["killed"])
        finally:
            cap.close()


class MemoryTest(unittest.TestCase):
    BERT_LARGE = 335141890

    def test_seed_zero2_fp16_offload(self):
        m = deepseed.predict_memory(self.BERT_LARGE, zero_stage=2, precision="fp16", world_size=1,
                                    offload_optimizer="cpu")
        self.assertEqual(round(m["parameters_bytes"] / 1e9, 3), 0.670)
        self.assertEqual(round(m["gradients_bytes"] / 1e9, 3), 0.670)
        self.assertEqual(round(m["optimizer_bytes"] / 1e9, 3), 4.022)
        self.assertEqual(m["optimizer_device"], "cpu")
        self.assertEqual(m["parameters_device"], "gpu")

    def test_stages_shard_over_world_size(self):
        n, ws = self.BERT_LARGE, 4
        cases = [  # stage: (params, grads, optimizer) divided by world size?
            (0, (1, 1, 1)), (1, (1, 1, ws)), (2, (1, ws, ws)), (3, (ws, ws, ws))]
        for stage, (dp, dg, do) in cases:
            m = deepseed.predict_memory(n, zero_stage=stage, precision="bf16", world_size=ws)
            self.assertAlmostEqual(m["parameters_bytes"], n * 2 / dp)
            self.assertAlmostEqual(m["gradients_bytes"], n * 2 / dg)
            self.assertAlmostEqual(m["optimizer_bytes"], n * 12 / do)
            self.assertEqual(m["optimizer_device"], "gpu")

    def test_fp32_and_param_offload(self):
        m = deepseed.predict_memory(1000, zero_stage=3, precision="fp32", world_size=2, offload_params="cpu",
                                    offload_optimizer="nvme")
        self.assertEqual((m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]), (2000, 2000, 4000))
        self.assertEqual((m["parameters_device"], m["optimizer_device"]), ("cpu", "nvme"))

    def test_meta_from_seed_ds_config(self):
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
               "fp16": {"enabled": True, "loss_scale": 0},
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
        m = env.meta_from_ds_config(cfg, world_size=2)
        self.assertEqual(m, {"zero_stage": 2, "offload_optimizer": "cpu", "offload_params": "none",
                             "precision": "fp16", "micro_batch": 4, "grad_accum": 4, "effective_batch": 32,
                             "framework": "deepspeed"})
        self.assertEqual(env.meta_from_ds_config({"bf16": {"enabled": True}})["precision"], "bf16")


class EnvTest(unittest.TestCase):
    def test_ranks_from_launcher_environment(self):
        keep = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        try:
            os.environ.update(RANK="5", LOCAL_RANK="1", WORLD_SIZE="8")
            self.assertEqual(env.dist_info(), (5, 1, 8))
        finally:
            for k, v in keep.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class JobEnvTest(unittest.TestCase):
    """A process a DeepSeed agent started names its job, sweep and run
    through the environment; the run record carries them."""

    VARS = ("DEEPSEED_JOB_ID", "DEEPSEED_SWEEP_ID", "DEEPSEED_RUN_ID", "DEEPSEED_PARAMS")

    def setUp(self):
        self.cap = Capture()
        self.keep = {k: os.environ.get(k) for k in self.VARS}

    def tearDown(self):
        self.cap.close()
        for k, v in self.keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_job_ids_and_params_from_environment(self):
        os.environ.update(DEEPSEED_JOB_ID="42", DEEPSEED_SWEEP_ID="sw-abc", DEEPSEED_RUN_ID="job-42",
                          DEEPSEED_PARAMS='{"lr": "2e-5", "batch": "16"}')
        run = quiet_run(self.cap.url)
        run.finish()
        rec = self.cap.records("run")[0]
        self.assertEqual(rec["run_id"], "job-42")
        self.assertEqual(rec["sweep_id"], "sw-abc")
        self.assertEqual(rec["meta"]["job_id"], "42")
        self.assertNotIn("sweep_id", rec["meta"])
        self.assertEqual(rec["params"], {"lr": "2e-5", "batch": "16"})
        if os.path.exists(RECORDS_GO):
            self.assertIn("job_id", go_json_fields()["RunMeta"])

    def test_no_job_environment_no_job_meta(self):
        for k in self.VARS:
            os.environ.pop(k, None)
        os.environ["DEEPSEED_PARAMS"] = "not json"
        run = quiet_run(self.cap.url)
        run.finish()
        rec = self.cap.records("run")[0]
        self.assertNotIn("job_id", rec["meta"])
        self.assertNotIn("params", rec)


@unittest.skipUnless(os.environ.get("DEEPSEED_TEST_SERVER_URL"), "DEEPSEED_TEST_SERVER_URL not set")
class RealServerTest(unittest.TestCase):
    def test_run_reads_back(self):
        url = os.environ["DEEPSEED_TEST_SERVER_URL"].rstrip("/")
        token = os.environ.get("DEEPSEED_TEST_TOKEN")
        run = deepseed.init(project="hook-test", name="real-server", server_url=url, token=token,
                            params={"lr": 1e-4}, flush_interval=0.05, handle_signals=False,
                            meta={"model": "tiny", "params": 1000, "zero_stage": 2, "precision": "bf16"})
        for i in range(1, 6):
            run.log_step(i, loss=1.0 / i if i != 3 else float("nan"), lr=1e-4, samples=8, step_ms=10.0)
        run.log_eval(5, loss=0.3, accuracy=0.9, f1=0.8)
        run.event("checkpoint", "saved", step=5)
        run.log_memory()
        run.finish()
        self.assertEqual(run.sender.rejected, 0)
        self.assertEqual(run.sender.dropped, 0)
        req = urllib.request.Request("%s/api/v1/runs/%s" % (url, run.run_id))
        if token:
            req.add_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.assertEqual(resp.status, 200)
            body = json.loads(resp.read())
        self.assertIn(run.run_id, json.dumps(body))
        self.assertIn("hook-test", json.dumps(body))


if __name__ == "__main__":
    logging.basicConfig()
    unittest.main()


class SyncFieldsTest(unittest.TestCase):
    """The synchronisation fields of a step record (docs/ranks.md)."""

    def setUp(self):
        self.cap = Capture()

    def tearDown(self):
        self.cap.close()

    def test_arrival_and_waits_travel_as_the_server_reads_them(self):
        run = quiet_run(self.cap.url)
        arrival = time.time_ns()
        # As the watcher passes them: the arrival an exact integer, the
        # waits float32 event times.
        run._emit_watched_step(1, {"step_ms": 100.0, "sync_ns": arrival, "sync_wait_ms": 27.000001907348633,
                                   "input_wait_ms": 3.2499999, "data_ms": 1.5}, None)
        run.log_step(2, sync_ns=float(arrival + 10**8), sync_wait_ms=2.0)
        run.finish()
        steps = self.cap.records("step")
        self.assertEqual(len(steps), 2)
        first, second = steps
        self.assertIsInstance(first["sync_ns"], int)
        self.assertEqual(first["sync_ns"], arrival)
        self.assertEqual(first["sync_wait_ms"], 27.0)
        self.assertEqual(first["input_wait_ms"], 3.25)
        self.assertEqual(first["data_ms"], 1.5)
        self.assertNotIn("metrics", first)
        # A float arrival (from a user) becomes an integer of nanoseconds.
        self.assertIsInstance(second["sync_ns"], int)
        self.assertLess(abs(second["sync_ns"] - (arrival + 10**8)), 1024)
        fields = go_json_fields()["Step"]
        for k in ("sync_ns", "sync_wait_ms", "input_wait_ms"):
            self.assertIn(k, fields)
