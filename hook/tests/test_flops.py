"""TFLOP/s and MFU: the FLOPs estimate, the peak table, and the step
records that carry both."""

import os
import sys
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed import flops  # noqa: E402

from .capture import Capture  # noqa: E402


class Cfg:
    """Attributes as a Hugging Face config has them."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class FlopsTest(unittest.TestCase):
    def test_parameters_and_attention_terms(self):
        # GPT-2 small: 124M parameters, 12 layers, width 768, 1024 tokens.
        gpt2 = Cfg(n_layer=12, n_embd=768)
        self.assertEqual(flops.flops_per_token(124_000_000), 6 * 124_000_000)
        self.assertEqual(flops.flops_per_token(124_000_000, gpt2, 1024), 6 * 124_000_000 + 12 * 12 * 768 * 1024)
        # BERT spellings as a dict; no sequence length: parameters only.
        bert = {"num_hidden_layers": 24, "hidden_size": 1024}
        self.assertEqual(flops.transformer_shape(bert), (24, 1024))
        self.assertEqual(flops.flops_per_token(335_000_000, bert, None), 6 * 335_000_000)
        self.assertIsNone(flops.transformer_shape(Cfg(hidden_size=8)))
        self.assertIsNone(flops.flops_per_token(0))

    def test_peak_table_by_device_name(self):
        cases = {
            ("NVIDIA H100 80GB HBM3", "bf16"): 989.4,
            ("NVIDIA H100 PCIe", "fp16"): 756.5,
            ("NVIDIA H100 NVL", "bf16"): 835.5,
            ("NVIDIA H200", "bf16"): 989.4,
            ("NVIDIA A100-SXM4-80GB", "bf16"): 312.0,
            ("NVIDIA A100 80GB PCIe", "tf32"): 156.0,
            ("NVIDIA L40S", "fp16"): 362.05,
            ("NVIDIA A10", "bf16"): 125.0,
            ("Tesla T4", "fp16"): 65.0,
            ("Tesla T4", "fp32"): 8.1,
            ("NVIDIA H100 80GB HBM3", None): 66.9,
        }
        for (name, prec), want in cases.items():
            self.assertEqual(flops.peak_tflops(name, prec), want, (name, prec))
        self.assertIsNone(flops.peak_tflops("Tesla T4", "bf16"))  # no bf16 tensor cores
        self.assertIsNone(flops.peak_tflops("NVIDIA A10G", "bf16"))  # not the A10
        self.assertIsNone(flops.peak_tflops("Radeon", "bf16"))

    def test_achieved(self):
        tf, mfu = flops.achieved(6e9, 8192, 100.0, 989.4)
        self.assertAlmostEqual(tf, 6e9 * 8192 / 0.1 / 1e12)
        self.assertAlmostEqual(mfu, tf / 989.4)
        self.assertEqual(flops.achieved(6e9, 8192, 100.0, None)[1], None)
        self.assertEqual(flops.achieved(6e9, None, 100.0, 1.0), (None, None))
        # 6e9 FLOPs x 8192 tokens in 100 ms is 491.5 TFLOP/s: over a peak of
        # 300 it is impossible, and neither number is reported.
        self.assertEqual(flops.achieved(6e9, 8192, 100.0, 300.0), (None, None))
        tf, mfu = flops.achieved(6e9, 8192, 100.0, 491.6)
        self.assertLessEqual(mfu, 1.0)


class StepFlopsTest(unittest.TestCase):
    def setUp(self):
        self.cap = Capture()

    def tearDown(self):
        self.cap.close()

    def test_steps_carry_tflops_and_mfu(self):
        run = deepseed.init(project="t", collector_url=self.cap.url, flush_interval=0.05, handle_signals=False)
        run.log_step(1, loss=1.0, tokens=4096, step_ms=50.0)  # nothing known yet: no tflops
        run._link.flops_cfg = {"num_hidden_layers": 24, "hidden_size": 1024}
        run.update_meta(params=335_000_000, seq_len=512, gpu="NVIDIA H100 80GB HBM3", precision="bf16")
        run.log_step(2, loss=1.0, tokens=4096, step_ms=50.0)
        run.set_flops(peak_tflops=500)
        run.log_step(3, loss=1.0, tokens=4096, step_ms=50.0)
        run.set_flops(flops_per_token=1e9)
        run.log_step(4, loss=1.0, tokens=4096, step_ms=50.0)
        run.log_step(5, loss=1.0, step_ms=50.0)  # no tokens: no tflops
        run.finish()
        steps = {r["step"]: r for r in self.cap.records("step")}
        self.assertNotIn("tflops", steps[1])
        fpt = 6 * 335_000_000 + 12 * 24 * 1024 * 512
        tf = fpt * 4096 / 0.05 / 1e12
        self.assertAlmostEqual(steps[2]["tflops"], tf)
        self.assertAlmostEqual(steps[2]["mfu"], tf / 989.4)
        self.assertAlmostEqual(steps[3]["mfu"], tf / 500)
        self.assertAlmostEqual(steps[4]["tflops"], 1e9 * 4096 / 0.05 / 1e12)
        self.assertNotIn("tflops", steps[5])
        meta = self.cap.records("run")[-1]["meta"]
        self.assertEqual(meta["flops_per_token"], 1e9)
        self.assertEqual(meta["peak_tflops"], 500.0)

    def test_init_overrides(self):
        run = deepseed.init(project="t", collector_url=self.cap.url, flush_interval=0.05, handle_signals=False,
                            flops_per_token=2e9, peak_tflops=400)
        run.log_step(1, tokens=1000, step_ms=10.0)
        # 200 TFLOP/s on a GPU of 400 is possible; 2,000 is not, and the step
        # then carries neither number.
        run.log_step(2, tokens=10000, step_ms=10.0)
        run.finish()
        s, impossible = self.cap.records("step")[:2]
        self.assertAlmostEqual(s["tflops"], 2e9 * 1000 / 0.01 / 1e12)
        self.assertAlmostEqual(s["mfu"], s["tflops"] / 400)
        self.assertNotIn("mfu", impossible)
        self.assertNotIn("tflops", impossible)


if __name__ == "__main__":
    unittest.main()
