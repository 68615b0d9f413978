"""What the hook costs a training step, every variant measured side by side.

Two benchmarks, each in interleaved rounds (A B C A B C …, the order
rotated each round, medians reported) so that clock and thermal drift hit
every variant alike; each measurement is timed with a synchronize at both
ends (in this harness, not in the hook):

- ``--tiny``: a small MLP whose step is pure launch time, in µs per step:
  no hook, defaults, ``layer_every=0``, layers every step.
- ``--configs``: BERT-large (random init from its config, bf16 autocast,
  fused AdamW, synthetic tokens) at each batch x sequence length, in steps
  per second: no hook, defaults, layers every step, and the seed's logger
  (CUDA events read after torch.cuda.synchronize() every 5 steps, gradient
  norm by one .item() per parameter).

``--old DIR`` adds the same variants with another copy of the ``deepseed``
package (say, the previous release) so that one run compares both.

    python3 hook/gpu_check/bench.py --tiny --configs 4x256,32x256,64x512 --out bench.json
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

from common import HOOK, CaptureProcess, batches, bert_large, train_step

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402

PACKAGES = {"": deepseed}


def load_old(path):
    """Imports the package in path under the name deepseed_old."""
    path = os.path.abspath(path)
    spec = importlib.util.spec_from_file_location("deepseed_old", os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["deepseed_old"] = mod
    spec.loader.exec_module(mod)
    PACKAGES["old_"] = mod


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


# variant suffix -> (init kwargs, watch kwargs)
HOOK_VARIANTS = {
    "default": ({}, {}),
    "layer_every_0": ({"layer_every": 0}, {}),
    "layers_every_step": ({"layer_every": 1}, {}),
}
# Options the previous package may not have.
NEW_ONLY = {"norm_every_step": ({}, {"grad_norm_every": 1}), "phases_every_step": ({}, {"phase_every": 1}),
            "inline_read": ({}, {"background_read": False}),
            # Layers, phases and norm every 10 steps however short the step.
            "periods_only": ({}, {"sample_min_ms": 0})}


def start_hook(variant, model, opt, url):
    for prefix, pkg in PACKAGES.items():
        if prefix and not variant.startswith(prefix):
            continue
        name = variant[len(prefix):]
        table = dict(HOOK_VARIANTS, **NEW_ONLY) if not prefix else HOOK_VARIANTS
        if name in table:
            ikw, wkw = table[name]
            run = pkg.init(project="bench", name=variant, collector_url=url, handle_signals=False, **ikw)
            run.watch(model, optimizer=opt, **wkw)
            return run
    return None


def timed(variant, model, opt, steps, warmup, url, step_fn):
    run = start_hook(variant, model, opt, url)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            c0 = time.process_time()
        step_fn(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    # CPU time of every thread (the hook's reader and sender included):
    # what a launch-bound step pays, without the wall clock's scheduling noise.
    info = {"cpu_s": time.process_time() - c0}
    if run is not None:
        run.finish()
        info.update(steps_logged=run.steps_logged, dropped=run.sender.dropped)
    return dt, info


def rounds(variants, repeats, measure, label):
    results = {v: [] for v in variants}
    infos = {}
    for rep in range(repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for v in order:
            val, info = measure(v)
            results[v].append(val)
            infos[v] = info
        print("%s round %d: %s" % (label, rep, {v: round(results[v][-1], 3) for v in variants}), flush=True)
    return results, infos


class TinyMLP(torch.nn.Module):
    def __init__(self, width=256, depth=8):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def tiny_setup():
    """The tiny MLP, its AdamW and a step function of the step's index."""
    torch.manual_seed(0)
    model = TinyMLP().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs = [torch.randn(32, 256, device="cuda") for _ in range(4)]
    ys = [torch.randn(32, 1, device="cuda") for _ in range(4)]

    def step(i):
        out = model(xs[i % 4])
        loss = torch.nn.functional.mse_loss(out, ys[i % 4])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


def bench_tiny(a, url):
    model, opt, step = tiny_setup()
    variants = ["no_hook"] + [p + v for p in PACKAGES for v in HOOK_VARIANTS] + list(NEW_ONLY)
    if a.tiny_variants:
        variants = ["no_hook"] + [v for v in variants if v in a.tiny_variants.split(",") and v != "no_hook"]
    for i in range(50):
        step(i)

    cpu = {v: [] for v in variants}

    def measure(v):
        dt, info = timed(v, model, opt, a.tiny_steps, a.warmup * 5, url, step)
        cpu[v].append(info.pop("cpu_s") / a.tiny_steps * 1e6)
        return dt / a.tiny_steps * 1e6, info

    res, infos = rounds(variants, a.tiny_repeats, measure, "tiny")
    base = statistics.median(res["no_hook"])
    table = []
    for v in variants:
        med = statistics.median(res[v])
        # The difference to the no-hook measurement of the same round, whose
        # median drifts less with the machine than a difference of medians.
        paired = statistics.median(x - b for x, b in zip(res[v], res["no_hook"]))
        cpu_paired = statistics.median(x - b for x, b in zip(cpu[v], cpu["no_hook"]))
        table.append({"variant": v, "us_per_step_median": med, "all": res[v], "added_us": paired,
                      "added_us_of_medians": med - base, "cpu_us_per_step_median": statistics.median(cpu[v]),
                      "added_cpu_us": cpu_paired, "info": infos.get(v)})
    return table


def bench_config(a, batch, seq, url):
    model, opt = bert_large()
    data = batches(8, batch, seq)
    variants = ["no_hook", "default", "layers_every_step", "norm_every_step", "phases_every_step"]
    if "old_" in PACKAGES:
        variants += ["old_default"]
    if a.seed_logger:
        variants.append("seed_logger")
    if a.variants:
        variants = ["no_hook"] + [v for v in variants if v in a.variants.split(",") and v != "no_hook"]
    for _ in range(8):  # warm the GPU, allocator and kernels once
        train_step(model, opt, data[0])
    torch.cuda.synchronize()

    def measure(v):
        if v == "seed_logger":
            seed = SeedLogger(model)
            fn = lambda i: seed.run_step(model, opt, data[i % len(data)], i)  # noqa: E731
        else:
            fn = lambda i: train_step(model, opt, data[i % len(data)])  # noqa: E731
        dt, info = timed(v, model, opt, a.steps, a.warmup, url, fn)
        info.pop("cpu_s", None)
        return a.steps / dt, info

    res, infos = rounds(variants, a.repeats, measure, "%dx%d" % (batch, seq))
    base = statistics.median(res["no_hook"])
    table = []
    for v in variants:
        med = statistics.median(res[v])
        paired = statistics.median((b - x) / b * 100.0 for x, b in zip(res[v], res["no_hook"]))
        table.append({"variant": v, "steps_per_s_median": med, "all": res[v], "slowdown_pct": paired,
                      "slowdown_pct_of_medians": (base - med) / base * 100.0, "info": infos.get(v)})
    del model, opt, data
    torch.cuda.empty_cache()
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--configs", default="4x256,32x256,64x512",
                    help="BERT-large batch x sequence length, comma separated (empty: none)")
    ap.add_argument("--tiny", action="store_true", help="also the tiny-MLP µs-per-step benchmark")
    ap.add_argument("--tiny-steps", type=int, default=300)
    ap.add_argument("--tiny-repeats", type=int, default=9)
    ap.add_argument("--tiny-variants", default="", help="tiny-MLP variants to run beside no_hook (default: all)")
    ap.add_argument("--seed-logger", action="store_true", help="also the seed's logger on BERT-large")
    ap.add_argument("--old", help="another deepseed package directory to compare with")
    ap.add_argument("--variants", default="", help="BERT-large variants to run beside no_hook (default: all)")
    a = ap.parse_args()
    if a.old:
        load_old(a.old)
    cap = CaptureProcess()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": a.steps,
           "warmup": a.warmup, "repeats": a.repeats, "configs": {}}

    def save():
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)

    if a.tiny:
        out["tiny"] = bench_tiny(a, cap.url)
        save()
    for cfg in filter(None, a.configs.split(",")):
        batch, seq = (int(x) for x in cfg.split("x"))
        out["configs"][cfg] = bench_config(a, batch, seq, cap.url)
        save()
    out["records_received"] = cap.close()
    save()
    if a.tiny:
        print("\ntiny MLP (8 x Linear 256, batch 32, AdamW), %d steps per measurement, median of %d interleaved "
              "rounds" % (a.tiny_steps, a.tiny_repeats))
        print("| variant | µs/step | added µs/step | added CPU µs/step (all threads) | spread (min-max) |")
        print("|---|---|---|---|---|")
        for r in out["tiny"]:
            print("| %s | %.0f | %+.0f | %+.0f | %.0f-%.0f |" % (r["variant"], r["us_per_step_median"], r["added_us"],
                                                                r["added_cpu_us"], min(r["all"]), max(r["all"])))
    for cfg, table in out["configs"].items():
        print("\nBERT-large batch x seq %s, %d steps per measurement, median of %d interleaved rounds"
              % (cfg, a.steps, a.repeats))
        print("| variant | steps/s | slower than no hook | spread (min-max steps/s) |")
        print("|---|---|---|---|")
        for r in table:
            print("| %s | %.3f | %+.2f %% | %.2f-%.2f |" % (r["variant"], r["steps_per_s_median"], r["slowdown_pct"],
                                                          min(r["all"]), max(r["all"])))


if __name__ == "__main__":
    main()
