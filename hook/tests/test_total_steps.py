"""A run's total steps in its meta (the server's estimated time to
finish counts the steps left): from init(), a DeepSpeed config's
scheduler, and the Hugging Face and Lightning callbacks, whose framework
objects are faked with the attributes the callbacks read."""

import json
import os
import sys
import types
import unittest
from unittest import mock

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed import env  # noqa: E402

from .cases import quiet_tempdir  # noqa: E402


class Callback:
    """The framework's callback base class: the callbacks only subclass it."""

    def __init__(self, *a, **kw):
        pass


def fake_modules():
    """transformers and lightning.pytorch.callbacks, as far as the
    integrations import them."""
    tf = types.ModuleType("transformers")
    tf.TrainerCallback = Callback
    cbs = types.ModuleType("lightning.pytorch.callbacks")
    cbs.Callback = Callback
    pt = types.ModuleType("lightning.pytorch")
    pt.callbacks = cbs
    lt = types.ModuleType("lightning")
    lt.pytorch = pt
    return {"transformers": tf, "lightning": lt, "lightning.pytorch": pt, "lightning.pytorch.callbacks": cbs}


class TotalStepsTest(unittest.TestCase):
    def setUp(self):
        self.dir = quiet_tempdir(self)
        self.n = 0

    def run_file(self):
        self.n += 1
        return os.path.join(self.dir, "r%d.ndjson" % self.n)

    def meta(self, path):
        m = {}
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["kind"] == "run":
                    m.update(r["meta"])
        return m

    def init(self, **kw):
        path = self.run_file()
        with mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1"}):
            run = deepseed.init(project="t", file=path, handle_signals=False, **kw)
        return run, path

    def test_values(self):
        self.assertEqual(env.total_steps(1000), 1000)
        self.assertEqual(env.total_steps(1000.0), 1000)
        for bad in (None, -1, 0, 0.5, 12.5, float("inf"), float("nan"), "auto", True, 2 ** 60):
            self.assertIsNone(env.total_steps(bad), bad)

    def test_init_and_set(self):
        run, path = self.init(total_steps=1200)
        run.set_total_steps(50)  # what a framework says: the user's value stands
        run.finish()
        self.assertEqual(self.meta(path)["total_steps"], 1200)

        run, path = self.init(total_steps="auto")
        run.set_total_steps(float("inf"))
        run.finish()
        self.assertNotIn("total_steps", self.meta(path))

        run, path = self.init()
        run.set_total_steps(800)
        run.finish()
        self.assertEqual(self.meta(path)["total_steps"], 800)

    def test_deepspeed_config_scheduler(self):
        cfg = {"train_micro_batch_size_per_gpu": 8, "scheduler": {"type": "WarmupDecayLR",
               "params": {"warmup_num_steps": 10, "total_num_steps": 3000}}}
        run, path = self.init(config=cfg)
        run.finish()
        self.assertEqual(self.meta(path)["total_steps"], 3000)
        # "auto" (filled in by the HF integration) is not a number.
        cfg["scheduler"]["params"]["total_num_steps"] = "auto"
        self.assertNotIn("total_steps", env.meta_from_ds_config(cfg))

    def test_hf_callback_reads_max_steps(self):
        with mock.patch.dict(sys.modules, fake_modules()):
            sys.modules.pop("deepseed.integrations.hf", None)
            from deepseed.integrations.hf import DeepSeedCallback
            args = types.SimpleNamespace(bf16=True, fp16=False, per_device_train_batch_size=4,
                                         gradient_accumulation_steps=2, world_size=1, max_steps=-1,
                                         run_name="hf", hf_deepspeed_config=None)
            for state_steps, want in ((2400, 2400), (0, None)):
                run, path = self.init()
                state = types.SimpleNamespace(is_world_process_zero=True, max_steps=state_steps, global_step=0)
                DeepSeedCallback(run=run, watch=False).on_train_begin(args, state, None)
                run.finish()
                self.assertEqual(self.meta(path).get("total_steps"), want)
            # A fit resumed from checkpoint-300 says so, once, at that step.
            run, path = self.init()
            state = types.SimpleNamespace(is_world_process_zero=True, max_steps=2400, global_step=300)
            DeepSeedCallback(run=run, watch=False).on_train_begin(args, state, None)
            run.finish()
            with open(path) as f:
                events = [r for r in map(json.loads, f) if r["kind"] == "event"]
            self.assertEqual([(e["type"], e["step"]) for e in events], [("resume", 300)])
            sys.modules.pop("deepseed.integrations.hf", None)

    def test_lightning_callback_reads_max_steps_or_estimate(self):
        with mock.patch.dict(sys.modules, fake_modules()):
            sys.modules.pop("deepseed.integrations.lightning", None)
            from deepseed.integrations.lightning import DeepSeedCallback

            class Trainer:
                precision = "bf16-mixed"
                world_size = 1
                accumulate_grad_batches = 1
                strategy = object()
                optimizers = []

                def __init__(self, max_steps, estimate):
                    self.max_steps, self._estimate = max_steps, estimate

                @property
                def estimated_stepping_batches(self):
                    if isinstance(self._estimate, Exception):
                        raise self._estimate
                    return self._estimate

            for max_steps, estimate, want in ((300, 999, 300), (-1, 640, 640), (-1, float("inf"), None),
                                              (-1, RuntimeError("no dataloader yet"), None)):
                run, path = self.init()
                cb = DeepSeedCallback(run=run, watch=False)
                tr = Trainer(max_steps, estimate)
                cb.on_fit_start(tr, None)
                cb.on_train_start(tr, None)
                run.finish()
                self.assertEqual(self.meta(path).get("total_steps"), want, (max_steps, estimate))
            sys.modules.pop("deepseed.integrations.lightning", None)


if __name__ == "__main__":
    unittest.main()
