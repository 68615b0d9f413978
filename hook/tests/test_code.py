"""The code that produced the run: the entry script's source and the git
diff of uncommitted changes go with the first run record, capped."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

from deepseed import env  # noqa: E402

from .capture import Capture  # noqa: E402

TRAIN = """\
import sys
sys.path.insert(0, %(hook)r)
import deepseed
run = deepseed.init(project="t", collector_url=%(url)r, flush_interval=0.05, handle_signals=False)
run.update_meta(model="m")  # a second run record, without the code
run.log_step(1, loss=1.0)
run.finish()
# padding %(pad)s
"""


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@unittest.skipIf(shutil.which("git") is None, "no git")
class CodeCaptureTest(unittest.TestCase):
    def setUp(self):
        self.cap = Capture()
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)
        git(self.dir, "init", "-q")
        with open(os.path.join(self.dir, "config.yaml"), "w") as f:
            f.write("lr: 1\n")
        git(self.dir, "add", "config.yaml")
        git(self.dir, "commit", "-q", "-m", "x")
        with open(os.path.join(self.dir, "config.yaml"), "w") as f:
            f.write("lr: 2\n")  # uncommitted

    def tearDown(self):
        self.cap.close()

    def train(self, pad="", **envs):
        path = os.path.join(self.dir, "train.py")
        with open(path, "w") as f:
            f.write(TRAIN % {"hook": HOOK, "url": self.cap.url, "pad": pad})
        e = dict(os.environ, **envs)
        p = subprocess.run([sys.executable, path], cwd=self.dir, env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return path

    def test_source_and_diff_sent_once(self):
        path = self.train()
        runs = self.cap.records("run")
        self.assertEqual(len(runs), 2)
        code = runs[0]["code"]
        self.assertNotIn("code", runs[1])
        with open(path) as f:
            src = f.read()
        self.assertEqual(os.path.realpath(code["entry_path"]), os.path.realpath(path))
        self.assertEqual(code["source"], src)
        self.assertEqual(code["source_bytes"], len(src.encode()))
        self.assertIn("-lr: 1\n+lr: 2\n", code["git_diff"])
        self.assertNotIn("source_truncated", code)
        self.assertNotIn("git_diff_truncated", code)

    def test_capture_off(self):
        self.train(DEEPSEED_CAPTURE_CODE="0")
        self.assertTrue(all("code" not in r for r in self.cap.records("run")))

    def test_large_script_cut_with_a_note(self):
        self.train(pad="é" * (400 * 1024))  # 800 KiB of two-byte characters
        code = self.cap.records("run")[0]["code"]
        self.assertTrue(code["source_truncated"])
        self.assertGreater(code["source_bytes"], env.CODE_MAX_BYTES)
        self.assertLessEqual(len(code["source"].encode()), env.CODE_MAX_BYTES)
        self.assertIn("[deepseed: cut at %d of %d bytes]" % (env.CODE_MAX_BYTES, code["source_bytes"]),
                      code["source"])
        self.assertTrue(code["source"].startswith("import sys\n"))
        self.assertNotIn("\ufffd", code["source"])  # no character split by the cut


class CapTextTest(unittest.TestCase):
    def test_cap(self):
        self.assertEqual(env._cap_text(b"a\x00b", 10), ("ab", False))
        text, cut = env._cap_text(b"x" * 100, 60)
        self.assertTrue(cut)
        self.assertLessEqual(len(text.encode()), 60)
        self.assertTrue(text.endswith("[deepseed: cut at 60 of 100 bytes]\n"))


if __name__ == "__main__":
    unittest.main()
