"""The in-tree build backend writes a wheel pip can verify and an sdist
that rebuilds, with the standard library alone."""

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HOOK, "_build"))

import backend  # noqa: E402


class BuildBackendTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_wheel_record_matches_every_file(self):
        name = backend.build_wheel(self.tmp)
        self.assertEqual(name, "deepseed-0.1.0-py3-none-any.whl")
        with zipfile.ZipFile(os.path.join(self.tmp, name)) as zf:
            names = zf.namelist()
            self.assertIn("deepseed/__init__.py", names)
            self.assertIn("deepseed/integrations/hf.py", names)
            self.assertFalse([n for n in names if n.endswith(".pyc")])
            record = zf.read("deepseed-0.1.0.dist-info/RECORD").decode()
            rows = list(csv.reader(io.StringIO(record)))
            self.assertEqual(sorted(r[0] for r in rows), sorted(names))
            for path, digest, size in rows:
                if path.endswith("RECORD"):
                    self.assertEqual((digest, size), ("", ""))
                    continue
                data = zf.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual(digest, "sha256=" + want, path)
                self.assertEqual(int(size), len(data), path)
            meta = zf.read("deepseed-0.1.0.dist-info/METADATA").decode()
            self.assertIn("Name: deepseed\n", meta)
            self.assertIn('Requires-Dist: torch>=2.1; extra == "torch"', meta)
            self.assertIn("Root-Is-Purelib: true", zf.read("deepseed-0.1.0.dist-info/WHEEL").decode())

    def test_editable_wheel_points_at_the_tree(self):
        name = backend.build_editable(self.tmp)
        with zipfile.ZipFile(os.path.join(self.tmp, name)) as zf:
            pth = [n for n in zf.namelist() if n.endswith(".pth")]
            self.assertEqual(len(pth), 1)
            self.assertEqual(zf.read(pth[0]).decode().strip(), HOOK)

    def test_sdist_rebuilds_a_wheel(self):
        name = backend.build_sdist(self.tmp)
        with tarfile.open(os.path.join(self.tmp, name)) as tf:
            tf.extractall(self.tmp)
        src = os.path.join(self.tmp, "deepseed-0.1.0")
        for must in ("PKG-INFO", "pyproject.toml", "_build/backend.py", "deepseed/run.py"):
            self.assertTrue(os.path.exists(os.path.join(src, must)), must)
        out = os.path.join(self.tmp, "out")
        os.mkdir(out)
        code = "import sys; sys.path.insert(0, '_build'); import backend; print(backend.build_wheel(sys.argv[1]))"
        got = subprocess.run([sys.executable, "-c", code, out], cwd=src, capture_output=True, text=True, check=True)
        self.assertEqual(got.stdout.strip(), "deepseed-0.1.0-py3-none-any.whl")

    def test_parser_without_tomllib_reads_the_project(self):
        with open(os.path.join(HOOK, "pyproject.toml"), encoding="utf-8") as f:
            p = backend._parse_project(f.read())
        self.assertEqual(p["name"], "deepseed")
        self.assertEqual(p["version"], "0.1.0")
        self.assertEqual(p["dependencies"], [])
        self.assertEqual(p["optional-dependencies"], {"torch": ["torch>=2.1"]})
        self.assertEqual(p["license"], {"text": "Apache-2.0"})


if __name__ == "__main__":
    unittest.main()
