"""Steps per second of the same BERT-large bf16 training step with no hook,
the hook at default settings, the layer profiler on every step, and the
seed's logger (CUDA events read after torch.cuda.synchronize() every 5
steps, gradient norm by one .item() per parameter).

Variants are interleaved in every repeat so that clock and thermal drift
hit them alike; each measurement is timed with a synchronize at both ends
(in this harness, not in the hook).

    python3 hook/gpu_check/bench.py --out bench.json
"""

import argparse
import json
import statistics
import sys
import time

from common import HOOK, batches, bert_large, train_step

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402
from tests.capture import Capture  # noqa: E402


class SeedLogger:
    """The seed's MetricsLogger and gradient norm, as its notebook runs them."""

    def __init__(self, model):
        self.model = model
        self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        self.steps = []

    def run_step(self, model, opt, b, i):
        ids, mask, labels = b
        self.ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = out.loss
        self.ev[1].record()
        loss.backward()
        self.ev[2].record()
        opt.step()
        self.ev[3].record()
        if i % 5 == 0:
            torch.cuda.synchronize()
            fwd = self.ev[0].elapsed_time(self.ev[1])
            bwd = self.ev[1].elapsed_time(self.ev[2])
            optm = self.ev[2].elapsed_time(self.ev[3])
            gn = 0.0
            for p in model.parameters():
                if p.grad is not None:
                    gn += p.grad.data.float().norm(2).item() ** 2
            self.steps.append({"loss": loss.item(), "grad_norm": gn ** 0.5, "fwd": fwd, "bwd": bwd, "opt": optm})
        opt.zero_grad(set_to_none=True)


def measure(variant, model, opt, data, steps, warmup, url):
    run = None
    seed = None
    if variant == "hook_default":
        run = deepseed.init(project="bench", name=variant, collector_url=url, handle_signals=False)
        run.watch(model, optimizer=opt)
    elif variant == "hook_no_grad_norm":
        run = deepseed.init(project="bench", name=variant, collector_url=url, handle_signals=False)
        run.watch(model, optimizer=opt, grad_norm="off")
    elif variant == "hook_layers_every_step":
        run = deepseed.init(project="bench", name=variant, collector_url=url, handle_signals=False, layer_every=1)
        run.watch(model, optimizer=opt)
    elif variant == "seed_logger":
        seed = SeedLogger(model)
    n = 0
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        b = data[i % len(data)]
        if seed is not None:
            seed.run_step(model, opt, b, i)
        else:
            train_step(model, opt, b)
        n += 1
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    info = {}
    if run is not None:
        run.finish()
        info = {"steps_logged": run.steps_logged, "dropped": run.sender.dropped}
    return steps / dt, info


def bench_config(a, batch, seq, url):
    model, opt = bert_large()
    data = batches(8, batch, seq)
    variants = ["no_hook", "hook_default", "hook_no_grad_norm", "hook_layers_every_step", "seed_logger"]
    for _ in range(8):  # warm the GPU, allocator and kernels once
        train_step(model, opt, data[0])
    torch.cuda.synchronize()
    results = {v: [] for v in variants}
    infos = {}
    for rep in range(a.repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for v in order:
            sps, info = measure(v, model, opt, data, a.steps, a.warmup, url)
            results[v].append(sps)
            infos[v] = info
        print("%dx%d repeat %d: %s" % (batch, seq, rep, {v: round(results[v][-1], 3) for v in variants}),
              flush=True)
    base = statistics.median(results["no_hook"])
    table = []
    for v in variants:
        med = statistics.median(results[v])
        table.append({"variant": v, "steps_per_s_median": med, "all": results[v],
                      "slowdown_pct": (base - med) / base * 100.0, "info": infos.get(v)})
    del model, opt, data
    torch.cuda.empty_cache()
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--configs", default="64x512,32x256", help="batch x sequence length, comma separated")
    a = ap.parse_args()
    cap = Capture()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": a.steps,
           "warmup": a.warmup, "repeats": a.repeats, "configs": {}}
    for cfg in a.configs.split(","):
        batch, seq = (int(x) for x in cfg.split("x"))
        out["configs"][cfg] = bench_config(a, batch, seq, cap.url)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    out["records_received"] = len(cap.records())
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for cfg, table in out["configs"].items():
        print("\nbatch x seq %s, %d steps per measurement, median of %d interleaved repeats" % (cfg, a.steps,
                                                                                               a.repeats))
        print("| variant | steps/s | slower than no hook | spread (min-max steps/s) |")
        print("|---|---|---|---|")
        for r in table:
            print("| %s | %.3f | %+.2f %% | %.2f-%.2f |" % (r["variant"], r["steps_per_s_median"], r["slowdown_pct"],
                                                          min(r["all"]), max(r["all"])))
    cap.close()


if __name__ == "__main__":
    main()
