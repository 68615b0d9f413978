"""The hook under torch.compile: graph breaks, recompilations and cost.

A small GPT-NeoX (6 blocks of 512, random init from its config, bf16
autocast, batch 8 x 256) trains under each way people compile it: the
whole model (watched after and before compiling), each block compiled in
place (block.compile(), as torchtitan does), fullgraph=True,
mode="max-autotune" and mode="reduce-overhead" (CUDA graphs). For each:

1. dynamo's counts (graph breaks, graphs, recompilations from
   TORCH_LOGS=recompiles) on the model without the hook and then, after
   torch._dynamo.reset(), on a fresh copy watched with layers and phases
   sampled every few steps: the hook's share is the difference, and must be
   zero (fullgraph=True must not raise);
2. the step time of an unwatched and a watched copy, their steps
   alternating (A B B A ...), each step timed with a synchronize at both
   ends in this harness, medians; with --block N, also blocks of N steps
   synchronized only at their ends, as a training loop runs (the host
   ahead of the device), blocks alternating, medians;
3. the watched copy's records, read back from its file: one step per
   optimizer step, phases within their step, layer times where they can be
   taken and the run's layer_times saying why where they cannot.

    python3 hook/gpu_check/compile_check.py [--variants whole,blocks,...] --out compile.json
"""

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

import recheck
from common import HOOK

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402

VARIANTS = ("whole", "blocks", "fullgraph", "reduce_overhead", "whole_after_watch", "max_autotune")


class Recompiles(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, record):
        msg = record.getMessage()
        if "Recompiling function" in msg or "recompil" in msg.lower():
            self.msgs.append(msg[:400])


# The models: the small GPT-NeoX (6 x 512, batch 8 x 256) and a
# real-sized one (24 x 1024, about 400M parameters, batch 8 x 512).
SIZES = {"small": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
                       vocab_size=8192, seq=256),
         "400m": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      vocab_size=50304, seq=512)}
SIZE = dict(SIZES["small"])


def model_cfg():
    from transformers import GPTNeoXConfig
    kw = dict(SIZE)
    seq = kw.pop("seq")
    return GPTNeoXConfig(max_position_embeddings=seq, use_cache=False, **kw)


def build(seed=0):
    from transformers import GPTNeoXForCausalLM
    torch.manual_seed(seed)
    m = GPTNeoXForCausalLM(model_cfg()).cuda().train()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)


def compile_model(m, variant):
    """What the user trains: the module to call, compiled as variant says."""
    if variant == "blocks":
        for blk in m.gpt_neox.layers:
            blk.compile()
        return m
    kw = {}
    if variant == "fullgraph":
        kw["fullgraph"] = True
    elif variant == "reduce_overhead":
        kw["mode"] = "reduce-overhead"
    elif variant == "max_autotune":
        kw["mode"] = "max-autotune"
    return torch.compile(m, **kw)


def make_step(variant):
    ids = torch.randint(0, SIZE["vocab_size"], (8, SIZE["seq"]), device="cuda")

    def step(call, opt):
        if variant in ("reduce_overhead", "max_autotune"):
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = call(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss
    return step


def counts():
    from torch._dynamo.utils import counters
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "break_reasons": sorted(counters["graph_break"])[:10],
            "unique_graphs": counters["stats"].get("unique_graphs", 0)}


def dynamo_run(variant, watched, steps, path, rec):
    """Counts of one fresh copy, compiled as variant says (watched or not)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    rec.msgs.clear()
    m, opt = build()
    run = None
    # Layers, phases and the norm sampled at their periods (every 5th and
    # 10th step) however short the step, so that 25 steps arm them often.
    os.environ["DEEPSEED_SAMPLE_MIN_MS"] = "0"
    err = None
    if watched and variant == "whole_after_watch":
        run = deepseed.init(project="compile-check", name=variant, file=path, handle_signals=False)
        run.watch(m, optimizer=opt, layer_every=5)
    call = compile_model(m, "whole" if variant == "whole_after_watch" else variant)
    if watched and run is None:
        run = deepseed.init(project="compile-check", name=variant, file=path, handle_signals=False)
        run.watch(call, optimizer=opt, layer_every=5)
    step = make_step(variant)
    losses = []
    try:
        for i in range(steps):
            loss = step(call, opt)
            if i % 5 == 0:
                losses.append(loss.detach().clone())
        torch.cuda.synchronize()
    except Exception as e:  # fullgraph=True raises on any break
        err = "%s: %s" % (type(e).__name__, str(e)[:600])
    out = dict(counts(), recompiles=len(rec.msgs), recompile_msgs=rec.msgs[:6], error=err,
               loss_first_last=[float(losses[0]), float(losses[-1])] if losses else None)
    os.environ.pop("DEEPSEED_SAMPLE_MIN_MS", None)
    if run is not None:
        run.finish(timeout=10)
    return out, (m, call, opt)


def expand(path, steps_run):
    """What the watched copy's file says: steps, phase checks, layers."""
    got = recheck.read(path)
    out = recheck.invariants(got)
    out.update(steps_run=steps_run, layers_records=len(got["layers"]), layer_times=got["meta"].get("layer_times"),
               median_forward_ms=recheck.median(got["steps"], "forward_ms"), losses=[s.get("loss") for s in got["steps"][:3]])
    return out


def timing(variant, pairs, path, block=0):
    """Unwatched A and watched B, alternating steps, medians (ms)."""
    torch._dynamo.reset()
    ma, oa = build(1)
    mb, ob = build(1)
    ca = compile_model(ma, "whole" if variant == "whole_after_watch" else variant)
    run = deepseed.init(project="compile-check", name=variant + "-timed", file=path, handle_signals=False)
    if variant == "whole_after_watch":
        run.watch(mb, optimizer=ob)
        cb = compile_model(mb, "whole")
    else:
        cb = compile_model(mb, variant)
        run.watch(cb, optimizer=ob)
    step = make_step(variant)
    for _ in range(8):
        step(ca, oa)
        step(cb, ob)
    torch.cuda.synchronize()
    ta, tb = [], []
    pc = time.perf_counter
    for i in range(pairs):
        order = ((ca, oa, ta), (cb, ob, tb)) if i % 2 == 0 else ((cb, ob, tb), (ca, oa, ta))
        for call, opt, out in order:
            torch.cuda.synchronize()
            t0 = pc()
            step(call, opt)
            torch.cuda.synchronize()
            out.append((pc() - t0) * 1e3)
    a, b = statistics.median(ta), statistics.median(tb)
    out = {"pairs": pairs, "median_ms_unwatched": round(a, 4), "median_ms_watched": round(b, 4),
           "overhead_pct": round((b - a) / a * 100, 3),
           "median_pair_diff_ms": round(statistics.median([y - x for x, y in zip(ta, tb)]), 4)}
    if block:
        out["pipelined"] = pipelined(step, (ca, oa), (cb, ob), block, max(10, pairs // block))
    run.finish(timeout=10)
    return out


def pipelined(step, a, b, block, rounds):
    """Blocks of `block` steps as a training loop runs them, the host ahead
    of the device and a synchronize only at each block's ends, watched and
    unwatched blocks alternating (A B, then B A): median ms a step."""
    ta, tb = [], []
    pc = time.perf_counter
    for i in range(rounds):
        order = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        for (call, opt), out in order:
            torch.cuda.synchronize()
            t0 = pc()
            for _ in range(block):
                step(call, opt)
            torch.cuda.synchronize()
            out.append((pc() - t0) * 1e3 / block)
    ma, mb = statistics.median(ta), statistics.median(tb)
    return {"block_steps": block, "blocks": rounds, "median_ms_unwatched": round(ma, 4),
            "median_ms_watched": round(mb, 4), "overhead_pct": round((mb - ma) / ma * 100, 3),
            "median_block_diff_pct": round(statistics.median([(y - x) / x * 100 for x, y in zip(ta, tb)]), 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--pairs", type=int, default=150)
    ap.add_argument("--out", default="compile.json")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--no-counts", action="store_true", help="timing only")
    ap.add_argument("--block", type=int, default=0,
                    help="also time blocks of this many steps, synchronized only at their ends (as training runs)")
    a = ap.parse_args()
    SIZE.clear()
    SIZE.update(SIZES[a.size])
    rec = Recompiles()
    torch._logging.set_logs(recompiles=True, graph_breaks=True)
    for name in ("torch._dynamo", "torch._dynamo.guards", "torch._dynamo.convert_frame"):
        logging.getLogger(name).addHandler(rec)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "size": a.size, "variants": {}}
    tmp = tempfile.mkdtemp(prefix="compile-check-")
    for v in a.variants.split(","):
        t0 = time.time()
        r = {}
        try:
            if not a.no_counts:
                r["unwatched"], _ = dynamo_run(v, False, a.steps, None, rec)
                path = os.path.join(tmp, v + ".ndjson")
                r["watched"], _ = dynamo_run(v, True, a.steps, path, rec)
                r["records"] = expand(path, a.steps)
                r["hook_graph_breaks"] = r["watched"]["graph_breaks"] - r["unwatched"]["graph_breaks"]
                r["hook_recompiles"] = r["watched"]["recompiles"] - r["unwatched"]["recompiles"]
            timed = os.path.join(tmp, v + "-timed.ndjson")
            r["timing"] = timing(v, a.pairs, timed, a.block)
            if a.no_counts:
                extra = max(10, a.pairs // a.block) * a.block if a.block else 0
                r["records"] = expand(timed, a.pairs + 8 + extra)
        except Exception as e:
            r["error"] = "%s: %s" % (type(e).__name__, str(e)[:800])
        r["seconds"] = round(time.time() - t0, 1)
        res["variants"][v] = r
        print(v, json.dumps(r)[:1500], flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    ok = all(r.get("hook_graph_breaks") == 0 and r.get("hook_recompiles", 1) <= 0 and not r["watched"]["error"]
             and not r["records"]["violations"] for r in res["variants"].values() if "watched" in r)
    print("ALL OK" if ok else "FAILED")


if __name__ == "__main__":
    main()
