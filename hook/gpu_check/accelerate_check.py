"""The hook under HF Accelerate, watched as a user watches it: whatever
accelerator.prepare() returned, run.watch(model, optimizer=opt), and
run.log_step at each accelerator.sync_gradients.

A 35M-parameter BERT (random init from its config, masked-LM loss on
synthetic tokens), AdamW with a linear schedule and warm-up, micro batch 16
x 128, mixed precision and gradient accumulation as --precision and
--accum say, --steps optimizer steps. The records, read back from the
hook's file, must say: one step an optimizer step, the precision
Accelerate trained in (and its peak), MFU in (0, 1], the scheduler's lr,
a timed optimizer, micro batch / accumulation / effective batch.

One process:   python3 hook/gpu_check/accelerate_check.py --accum 4 --out acc.json
Two ranks (one GPU, gloo): torchrun --nproc_per_node 2 hook/gpu_check/accelerate_check.py --gloo ...
"""

import argparse
import json
import os
import sys
import tempfile

import recheck
from common import HOOK

if "--gloo" in sys.argv:
    # Two ranks on one GPU: both use cuda:0, over gloo.
    os.environ["LOCAL_RANK"] = "0"

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "no"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--gloo", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default="accelerate.json")
    a = ap.parse_args()
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

    handlers = [InitProcessGroupKwargs(backend="gloo")] if a.gloo else []
    acc = Accelerator(mixed_precision=a.precision, gradient_accumulation_steps=a.accum, kwargs_handlers=handlers)
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                     vocab_size=30522, max_position_embeddings=128)
    model = BertForMaskedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=8, num_training_steps=a.steps)
    ids = torch.randint(0, 30522, (a.steps * a.accum * 16 * acc.num_processes, 128))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=16)
    model, opt, data, sched = acc.prepare(model, opt, data, sched)

    d = a.dir or tempfile.mkdtemp(prefix="acc-check-")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "rank%d.ndjson" % acc.process_index)
    run = deepseed.init(project="accelerate-check", name="acc-%s-accum%d%s" % (a.precision, a.accum,
                                                                              "-gloo" if a.gloo else ""),
                        file=path, handle_signals=False)
    run.watch(model, optimizer=opt)
    model.train()
    opt_steps = 0
    for (batch,) in data:
        with acc.accumulate(model):
            out = model(input_ids=batch, labels=batch)
            acc.backward(out.loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        if acc.sync_gradients:
            opt_steps += 1
            run.log_step(loss=out.loss.detach())
    run.finish(timeout=10)
    acc.wait_for_everyone()
    if acc.process_index != 0:
        return
    files = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".ndjson")]
    got = recheck.read(*files)
    res = recheck.invariants(got)
    want_prec = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}[a.precision]
    world = acc.num_processes
    checks = {
        "steps are optimizer steps": all(n == opt_steps for n in res["steps_recorded"].values()),
        "precision": res["precision"] == want_prec,
        "mfu in (0, 1]": res["violation_count"] == 0 and res["median_mfu"] is not None,
        "lr from the scheduler": res["lr_first_last"] is not None and res["lr_first_last"][0] < 5e-5,
        "optimizer timed": (res["median_optimizer_ms"] or 0) > 0,
        "micro batch": res["micro_batch"] == 16,
        "grad accum": res["grad_accum"] == a.accum,
        "effective batch": res["effective_batch"] == 16 * a.accum * world,
        "tokens per step": res["tokens_per_step"] == [16 * 128 * a.accum],
    }
    res.update(config={"precision": a.precision, "accum": a.accum, "world": world, "gloo": a.gloo,
                       "optimizer_steps": opt_steps}, checks=checks, ok=all(checks.values()))
    print(json.dumps(res, indent=1))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("ALL OK" if res["ok"] else "FAILED")


if __name__ == "__main__":
    main()
