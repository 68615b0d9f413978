"""The run's options are one object: Run and init take exactly its
fields, with its defaults, so neither can grow an option the other lacks."""

import dataclasses
import inspect
import os
import sys
import tempfile
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.options import RunOptions  # noqa: E402
from deepseed.run import Run  # noqa: E402


class OptionsTest(unittest.TestCase):
    def test_run_takes_the_options_fields_with_their_defaults(self):
        params = inspect.signature(Run.__init__).parameters
        fields = {f.name: f.default for f in dataclasses.fields(RunOptions)}
        got = {n: p.default for n, p in params.items() if n != "self"}
        self.assertEqual(got, fields)
        # Each option is described in the object's documentation.
        for name in fields:
            self.assertIn("``%s``" % name, RunOptions.__doc__, name)

    def test_a_run_keeps_what_it_was_started_with(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.ndjson")
            run = deepseed.init(project="opts", name="n", run_id="opts-1", file=path, handle_signals=False,
                                tags=["a"], layer_every=3)
            try:
                self.assertEqual(run.options.project, "opts")
                self.assertEqual(run.options.layer_every, 3)
                self.assertEqual(run.options.file, path)
                self.assertEqual((run.project, run.name, run.run_id, run.tags, run.layer_every),
                                 ("opts", "n", "opts-1", ["a"], 3))
            finally:
                run.finish()


if __name__ == "__main__":
    unittest.main()
