"""Runs every integration on a GPU with the hook writing its offline NDJSON
file (no server) and asserts the fields each step record carries:

- plain PyTorch (run.watch(model, optimizer=opt)), bf16 autocast, gradient
  accumulation 2;
- Hugging Face Trainer (DeepSeedCallback), bf16, accumulation 2;
- a DeepSpeed engine (run.watch(engine)), ZeRO-2, fp16 with dynamic loss
  scaling, accumulation 2: needs DeepSpeed importable (its source on
  PYTHONPATH will do; --only skips it);
- Lightning (DeepSeedCallback) under bf16-mixed with accumulation 2, and
  16-mixed (a GradScaler) without, validation every 10 batches.

A small BERT from its config (random weights, synthetic tokens). The
default periods apply: layers and gradient norm every 10 steps.

    python3 hook/gpu_check/integrations_check.py --out integrations.json
"""

import argparse
import json
import math
import os
import sys
import tempfile

from common import HOOK

# The check is of each integration's wiring at the default periods; the
# time floor that spaces sampled steps in one process (SAMPLE_MIN_MS) is
# tested on the CPU machine, and would skip steps of this small model.
os.environ.setdefault("DEEPSEED_SAMPLE_MIN_MS", "0")

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402
from deepseed.records import expand_steps  # noqa: E402

STEPS = 20
SEQ = 128
BATCH = 8
TIMINGS = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")
PHASES = TIMINGS[1:]
EVERY_STEP = ("step_ms", "loss", "lr", "samples", "tokens", "throughput_sps", "throughput_tps", "gpu_mem_peak_gb")
# A single process with the model's and optimizer's hooks times the phases
# every 10th step (PHASE_EVERY), half way between the layer steps (10, 20):
# 5 and 15; a framework that marks them (Lightning) or the DeepSpeed
# engine's adapter, every step.
SAMPLED = ("plain", "hf")
LAYERS = ["embeddings"] + ["encoder.%d" % i for i in range(4)] + ["classifier"]


def small_bert():
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=512, num_labels=2)
    return BertForSequenceClassification(cfg)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 30522, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


def read(path):
    with open(path) as f:
        return expand_steps(json.loads(line) for line in f if line.strip())


def run_plain(path):
    model = small_bert().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = deepseed.init(project="integrations", name="plain", file=path, handle_signals=False)
    run.watch(model, optimizer=opt)
    data = torch.utils.data.DataLoader(Tokens(STEPS * 2 * BATCH), batch_size=BATCH)
    raw = {}
    for i, b in enumerate(data):
        b = {k: v.cuda(non_blocking=True) for k, v in b.items()}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**b)
        (out.loss / 2).backward()
        raw.setdefault(i // 2 + 1, []).append(out.loss.detach())
        if i % 2 == 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
    run.finish()
    return {s: sum(float(x) for x in v) / len(v) for s, v in raw.items()}, {"accum": 2}


def run_hf(path):
    from transformers import Trainer, TrainingArguments
    from deepseed.integrations.hf import DeepSeedCallback
    model = small_bert()
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=STEPS, per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=2, bf16=True, logging_steps=5, report_to=[],
                             save_strategy="no", learning_rate=1e-4, dataloader_num_workers=0, disable_tqdm=True)
    cb = DeepSeedCallback(project="integrations", name="hf", file=path, handle_signals=False)
    Trainer(model=model, args=args, train_dataset=Tokens(STEPS * 2 * BATCH), callbacks=[cb]).train()
    return None, {"accum": 2}


def run_deepspeed(path):
    """A DeepSpeed engine (ZeRO-2, fp16 with dynamic loss scaling, torch's
    AdamW, accumulation 2) in one process: the user's loop calls
    engine.backward() and engine.step() for every micro-batch."""
    import deepspeed
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29531")):
        os.environ.setdefault(k, v)
    model = small_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": 2}, "fp16": {"enabled": True, "initial_scale_power": 12},
           "steps_per_print": 10 ** 9,
           "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-4,
                                                             "warmup_num_steps": 5, "total_num_steps": STEPS}}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    run = deepseed.init(project="integrations", name="deepspeed", file=path, handle_signals=False, config=cfg)
    run.watch(engine)
    data = torch.utils.data.DataLoader(Tokens(STEPS * 2 * BATCH), batch_size=BATCH)
    raw = {}
    for i, b in enumerate(data):
        b = {k: v.cuda(non_blocking=True) for k, v in b.items()}
        out = engine(**b)
        engine.backward(out.loss)
        engine.step()
        raw.setdefault(i // 2 + 1, []).append(out.loss.detach())
    run.finish()
    return {s: sum(float(x) for x in v) / len(v) for s, v in raw.items()}, {"accum": 2}


def run_lightning(path, precision, accum):
    import lightning as L
    from deepseed.integrations.lightning import DeepSeedCallback

    raw = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = small_bert()

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            raw.setdefault(self.trainer.global_step + 1, []).append(loss.detach())
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.model(**batch).loss)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    cb = DeepSeedCallback(project="integrations", name="lightning-%s-accum%d" % (precision, accum), file=path,
                          handle_signals=False)
    trainer = L.Trainer(accelerator="gpu", devices=1, precision=precision, max_steps=STEPS,
                        accumulate_grad_batches=accum, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, val_check_interval=10,
                        limit_val_batches=2, num_sanity_val_steps=0, callbacks=[cb])
    data = torch.utils.data.DataLoader(Tokens(STEPS * accum * BATCH), batch_size=BATCH)
    val = torch.utils.data.DataLoader(Tokens(4 * BATCH, seed=2), batch_size=BATCH)
    trainer.fit(Module(), data, val)
    return {s: sum(float(x) for x in v) / len(v) for s, v in raw.items()}, {"accum": accum}


def check(name, recs, raw, accum, want_meta):
    problems = []
    steps = sorted((r for r in recs if r.get("kind") == "step"), key=lambda r: r["step"])
    layers = {r["step"]: r for r in recs if r.get("kind") == "layers"}
    runs = [r for r in recs if r.get("kind") == "run"]
    meta = runs[-1]["meta"] if runs else {}
    nums = [r["step"] for r in steps]
    if nums != list(range(1, STEPS + 1)):
        problems.append("steps %s" % nums)
    for r in steps:
        miss = [k for k in EVERY_STEP if not isinstance(r.get(k), (int, float)) or not math.isfinite(r[k])]
        if miss:
            problems.append("step %d lacks %s" % (r["step"], miss))
            continue
        timed = not any(name.startswith(n) for n in SAMPLED) or r["step"] % 10 == 5
        if timed != all(k in r for k in PHASES) or any(k in r for k in PHASES) != timed:
            problems.append("step %d phases %s, expected %s" % (r["step"], [k for k in PHASES if k in r],
                                                                "all" if timed else "none"))
            continue
        if any(r[k] <= 0 for k in (TIMINGS if timed else TIMINGS[:1])):
            problems.append("step %d timing not positive: %s" % (r["step"], {k: r.get(k) for k in TIMINGS}))
        if timed and r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"] > r["step_ms"] + 1e-3:
            problems.append("step %d phases exceed the step" % r["step"])
        if r["samples"] != BATCH * accum or r["tokens"] != BATCH * accum * SEQ:
            problems.append("step %d samples %s tokens %s" % (r["step"], r["samples"], r["tokens"]))
        if r["step"] > 1 and "data_ms" not in r:
            problems.append("step %d lacks data_ms" % r["step"])
        if name == "deepspeed":
            # The engine's own global norm and loss scale come free with every step.
            if not isinstance(r.get("grad_norm"), (int, float)) or not isinstance(r.get("loss_scale"), float):
                problems.append("step %d grad_norm %s loss_scale %s" % (r["step"], r.get("grad_norm"),
                                                                        r.get("loss_scale")))
        elif (r["step"] % 10 == 0) != ("grad_norm" in r) and name != "hf":
            problems.append("step %d grad_norm %s" % (r["step"], r.get("grad_norm")))
        if raw and r["step"] in raw and abs(r["loss"] - raw[r["step"]]) > 2e-3 * max(1.0, abs(raw[r["step"]])):
            problems.append("step %d loss %s, the model's %s" % (r["step"], r["loss"], raw[r["step"]]))
    if sorted(layers) != [10, 20]:
        problems.append("layer records at %s" % sorted(layers))
    for s, L in layers.items():
        if L["names"] != LAYERS or not all(isinstance(v, float) and v > 0 for v in L["forward_ms"] + L["backward_ms"]):
            problems.append("layers of step %d: %s %s %s" % (s, L["names"], L["forward_ms"], L["backward_ms"]))
    for k, v in want_meta.items():
        if meta.get(k) != v:
            problems.append("meta %s = %r, want %r" % (k, meta.get(k), v))
    ends = [r for r in recs if r.get("kind") == "end"]
    if not ends or ends[-1]["status"] != "finished":
        problems.append("no end record")
    print(("PASS " if not problems else "FAIL ") + name + (": " + "; ".join(problems[:8]) if problems else ""),
          flush=True)
    return {"ok": not problems, "problems": problems, "meta": {k: meta.get(k) for k in (
        "framework", "precision", "lightning_precision", "strategy", "grad_accum", "model", "params", "seq_len",
        "zero_stage", "total_steps")},
        "step_example": steps[9] if len(steps) > 9 else None, "layers_example": layers.get(10)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="integrations.json")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    cases = {
        "plain": (lambda p: run_plain(p), {"framework": "torch", "precision": "bf16"}),
        "hf": (lambda p: run_hf(p), {"framework": "hf", "precision": "bf16", "grad_accum": 2}),
        "deepspeed": (lambda p: run_deepspeed(p), {"framework": "deepspeed", "precision": "fp16", "zero_stage": 2,
                                                   "grad_accum": 2, "total_steps": STEPS}),
        "lightning-bf16-mixed-accum2": (lambda p: run_lightning(p, "bf16-mixed", 2),
                                        {"framework": "lightning", "precision": "bf16", "grad_accum": 2,
                                         "strategy": "SingleDeviceStrategy", "lightning_precision": "bf16-mixed"}),
        "lightning-16-mixed": (lambda p: run_lightning(p, "16-mixed", 1),
                               {"framework": "lightning", "precision": "fp16", "grad_accum": 1,
                                "strategy": "SingleDeviceStrategy", "lightning_precision": "16-mixed"}),
    }
    res = {}
    for name, (fn, want) in cases.items():
        if a.only and name not in a.only.split(","):
            continue
        path = os.path.join(d, name + ".ndjson")
        try:
            raw, info = fn(path)
            res[name] = check(name, read(path), raw, info["accum"], want)
            if name.startswith("lightning-16"):
                scales = [r.get("loss_scale") for r in read(path) if r.get("kind") == "step"]
                res[name]["loss_scale_sample"] = scales[:3]
        except Exception as e:
            import traceback
            traceback.print_exc()
            res[name] = {"ok": False, "problems": ["raised %s: %s" % (type(e).__name__, e)]}
            print("FAIL %s raised %s" % (name, e), flush=True)
        torch.cuda.empty_cache()
    res["all_ok"] = all(v["ok"] for v in res.values())
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if res["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
