"""The pieces that keep the hook's cost off the training thread: chunked
encoding in the sender thread, batched writes of the offline file, and
the Lightning names the callback puts in meta."""

import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

from deepseed import sender  # noqa: E402
from deepseed.env import lightning_precision, strategy_parallelism  # noqa: E402
from deepseed.localfile import FileSender, encode  # noqa: E402


def records(n):
    return [{"kind": "step", "run_id": "r", "rank": 0, "step": i, "loss": float("nan") if i == 3 else i / 7.0,
             "metrics": {"x": i}} for i in range(n)]


class EncodeTest(unittest.TestCase):
    def test_chunked_encoding_is_the_same_bytes(self):
        for n in (0, 1, 15, 16, 17, 100):
            recs = records(n)
            if not recs:
                continue
            self.assertEqual(encode(recs, yield_every=16), encode(recs), n)

    def test_chunked_encoding_lets_another_thread_run(self):
        # A thread that counts while the encoder works: with a yield every
        # record it gets the interpreter between records, not only after.
        recs = records(2000)
        seen = []
        stop = threading.Event()

        def count():
            while not stop.is_set():
                seen.append(time.perf_counter())
                time.sleep(0)

        t = threading.Thread(target=count)
        t.start()
        time.sleep(0.01)
        start = time.perf_counter()
        encode(recs, yield_every=1)
        end = time.perf_counter()
        stop.set()
        t.join()
        inside = [s for s in seen if start < s < end]
        self.assertGreater(len(inside), 10)

    def test_nan_survives(self):
        line = encode(records(4), yield_every=2).decode().splitlines()[3]
        self.assertTrue(math.isnan(json.loads(line)["loss"]))

    def test_sender_posts_in_chunks(self):
        self.assertGreater(sender.ENCODE_CHUNK, 0)


class FileSenderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "run.ndjson")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def lines(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(x) for x in f if x.strip()]

    def test_records_are_written_in_batches(self):
        fs = FileSender(self.path)
        fs.BUFFER = 5
        for r in records(4):
            fs.put(r)
        self.assertEqual(fs.saved, 0)
        self.assertEqual(fs.pending, 4)
        fs.put(records(5)[4])
        self.assertEqual(fs.saved, 5)
        self.assertEqual(fs.pending, 0)
        for r in records(2):
            fs.put(r)
        fs.flush()
        self.assertEqual([r["step"] for r in self.lines()], [0, 1, 2, 3, 4, 0, 1])
        fs.close()

    def test_old_records_leave_after_the_interval(self):
        fs = FileSender(self.path)
        fs.FLUSH_S = 0.05
        fs.put(records(1)[0])
        self.assertEqual(fs.saved, 0)
        time.sleep(0.06)
        fs.put(records(2)[1])
        self.assertEqual(fs.saved, 2)
        fs.close()

    def test_close_writes_what_is_buffered(self):
        fs = FileSender(self.path)
        for r in records(7):
            fs.put(r)
        self.assertTrue(fs.close())
        self.assertEqual(len(self.lines()), 7)
        self.assertEqual(fs.saved, 7)

    def test_run_summary_counts_buffered_records_as_saved_locally(self):
        import deepseed
        run = deepseed.init(project="p", mode="offline", file=self.path, handle_signals=False)
        for i in range(1, 4):
            run.log_step(i, loss=0.5)
        run.finish()
        recs = self.lines()
        end = [r for r in recs if r["kind"] == "end"][0]
        self.assertEqual(end["summary"]["records_saved_locally"], len(recs) - 1)
        self.assertEqual((end["summary"]["records_sent"], end["summary"]["records_pending"]), (0, 0))
        self.assertEqual(end["summary"]["steps"], 3)


class LightningNamesTest(unittest.TestCase):
    def test_precision(self):
        cases = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16", "16-mixed": "fp16", "16": "fp16",
                 16: "fp16", "16-true": "fp16", "32-true": "fp32", 32: "fp32", "64-true": "fp32",
                 "transformer-engine": None, None: None, "": None}
        for given, want in cases.items():
            self.assertEqual(lightning_precision(given), want, given)

    def test_strategy(self):
        cases = {"SingleDeviceStrategy": None, "DDPStrategy": "ddp", "FSDPStrategy": "fsdp",
                 "ModelParallelStrategy": None, "DeepSpeedStrategy": "deepspeed", "DataParallelStrategy": "ddp",
                 None: None}
        for given, want in cases.items():
            self.assertEqual(strategy_parallelism(given), want, given)


if __name__ == "__main__":
    unittest.main()
