"""Trains BERT-large (random weights, synthetic tokens, bf16 autocast,
AdamW) with the hook posting to a local HTTP capture server, then checks
the records against what a user would expect and against torch.profiler.

    python3 hook/gpu_check/train_check.py --out results.json
"""

import argparse
import json
import math
import os
import sys
import time

from common import BERT_LARGE_PARAMS, HOOK, batches, bert_large

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402
from tests.capture import Capture  # noqa: E402

EXPECTED_LAYERS = ["embeddings"] + ["encoder.%d" % i for i in range(24)] + ["classifier"]


def profiler_times(trace_path):
    """Per step, the GPU span of the kernels launched inside the fwd_N and
    bwd_N annotations: first kernel start to last kernel end, in ms."""
    with open(trace_path) as f:
        tr = json.load(f)
    evs = tr["traceEvents"] if isinstance(tr, dict) else tr
    ranges = []
    launches = {}
    kernels = []
    for e in evs:
        cat = e.get("cat", "")
        if cat == "user_annotation" and e.get("name", "").startswith(("fwd_", "bwd_")):
            ranges.append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = e["ts"]
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                kernels.append((corr, e["ts"], e["ts"] + e["dur"]))
    spans = {}
    for corr, ks, ke in kernels:
        ts = launches.get(corr)
        if ts is None:
            continue
        for a, b, name in ranges:
            if a <= ts <= b:
                lo, hi = spans.get(name, (ks, ke))
                spans[name] = (min(lo, ks), max(hi, ke))
                break
    return {name: (hi - lo) / 1000.0 for name, (lo, hi) in spans.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="train_check.json")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layer-every", type=int, default=5)
    ap.add_argument("--trace", default="/tmp/deepseed_trace.json")
    a = ap.parse_args()

    cap = Capture()
    model, opt = bert_large()
    data = batches(8, a.batch, a.seq)
    run = deepseed.init(project="gpu-check", name="bert-large-bf16", collector_url=cap.url,
                        params={"lr": 2e-5, "batch": a.batch, "seq": a.seq}, layer_every=a.layer_every,
                        flush_interval=0.2, handle_signals=False)
    # Every step's phases, as a distributed run times them: this check is of
    # their accuracy (against torch.profiler and the layers' sums on the same
    # step); integrations_check.py checks which steps a single process times.
    run.watch(model, optimizer=opt, phase_every=1)

    # The first profiled step is the profiler's warm-up (tracing starts during
    # it and slows the host), as torch.profiler.schedule(warmup=1) treats it:
    # it is traced but not compared.
    prof_steps = list(range(41, 47))
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])
    state_bytes = None
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        ids, mask, labels = data[step % len(data)]
        if step == prof_steps[0]:
            prof.__enter__()
        profiling = step in prof_steps
        with torch.profiler.record_function("fwd_%d" % step) if profiling else _null():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=ids, attention_mask=mask, labels=labels)
        with torch.profiler.record_function("bwd_%d" % step) if profiling else _null():
            out.loss.backward()
        opt.step()
        if step == 3:
            # Parameters, gradients and both Adam moments are all live here.
            torch.cuda.synchronize()
            state_bytes = torch.cuda.memory_allocated()
        opt.zero_grad(set_to_none=True)
        run.log_step(step, loss=out.loss, lr=opt.param_groups[0]["lr"], epoch=step / a.steps)
        if step == prof_steps[-1]:
            prof.__exit__(None, None, None)
        if step % 20 == 0:
            run.log_eval(step, loss=out.loss.detach(), accuracy=0.5, f1=0.5)
    run.event("checkpoint", "not really saved", step=a.steps)
    wall = time.perf_counter() - t0
    run.finish()
    prof.export_chrome_trace(a.trace)

    steps = sorted(cap.records("step"), key=lambda r: r["step"])
    layers = {r["step"]: r for r in cap.records("layers")}
    mem = cap.records("memory")
    runs = cap.records("run")
    res = {"steps_received": len(steps), "wall_s": wall, "checks": {}}
    checks = res["checks"]

    def check(name, ok, detail):
        checks[name] = {"ok": bool(ok), "detail": detail}
        print(("PASS " if ok else "FAIL ") + name + ": " + json.dumps(detail)[:400], flush=True)

    nums = [r["step"] for r in steps]
    check("every step present", nums == list(range(1, a.steps + 1)), {"first": nums[:3], "last": nums[-3:],
                                                                      "n": len(nums)})
    keys = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")
    bad = [r["step"] for r in steps if not all(isinstance(r.get(k), (int, float)) and r[k] > 0 for k in keys)]
    check("timings positive", not bad, {"bad_steps": bad[:10]})
    over = [(r["step"], r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"], r["step_ms"]) for r in steps
            if all(k in r for k in keys) and r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"] > r["step_ms"]
            + 1e-3]
    check("forward+backward+optimizer <= step", not over, {"violations": over[:5]})
    lossy = [r["step"] for r in steps if not isinstance(r.get("loss"), float) or not math.isfinite(r["loss"])]
    check("loss, lr, grad norm and throughput present",
          # The gradient norm comes every grad_norm_every steps (10 by default).
          not lossy and all(((r.get("grad_norm", 0) > 0) if r["step"] % 10 == 0 else ("grad_norm" not in r))
                            and r.get("lr") == 2e-5 and r.get("throughput_sps", 0) > 0
                            and r.get("tokens") == a.batch * a.seq and r.get("samples") == a.batch
                            for r in steps),
          {"bad_loss": lossy[:5], "sample": {k: steps[-1].get(k) for k in ("loss", "lr", "grad_norm",
                                                                          "throughput_sps", "throughput_tps",
                                                                          "samples", "tokens", "data_ms",
                                                                          "gpu_mem_peak_gb",
                                                                          "gpu_mem_reserved_gb")}})

    want_layer_steps = [s for s in range(1, a.steps + 1) if s % a.layer_every == 0]
    check("layer records every N steps", sorted(layers) == want_layer_steps, {"got": sorted(layers)})
    order_ok, sum_ratios, bwd_ratios, bad_layer = True, [], [], []
    by_step = {r["step"]: r for r in steps}
    for s, L in layers.items():
        order_ok = order_ok and L["names"] == EXPECTED_LAYERS
        if any(not (isinstance(v, float) and v > 0) for v in L["forward_ms"] + L["backward_ms"]):
            bad_layer.append(s)
        st = by_step.get(s)
        if st:
            sum_ratios.append(sum(L["forward_ms"]) / st["forward_ms"])
            bwd_ratios.append(sum(L["backward_ms"]) / st["backward_ms"])
    check("layers in model order (the seed's 26 rows)", order_ok, {"names": list(layers.values())[0]["names"]
                                                                   if layers else None})
    check("layer forward and backward times positive", not bad_layer, {"bad_steps": bad_layer})
    unrounded = [(r["step"], k) for r in list(layers.values()) + steps for k in ("forward_ms", "backward_ms", "step_ms")
                 if any(isinstance(v, float) and math.isfinite(v) and round(v, 4) != v
                        for v in (r.get(k) if isinstance(r.get(k), list) else [r.get(k)]))]
    check("durations sent to 0.1 us (four decimals of a ms)", not unrounded, {"unrounded": unrounded[:5]})
    check("layer forward times sum within 10% of forward", sum_ratios and all(0.9 <= r <= 1.0 + 1e-4
                                                                               for r in sum_ratios),
          {"ratios": [round(r, 4) for r in sum_ratios],
           "backward_ratios_info": [round(r, 4) for r in bwd_ratios]})
    if layers:
        L = layers[max(layers)]
        res["layers_example"] = {"step": L["step"], "names": L["names"],
                                 "forward_ms": [round(x, 3) for x in L["forward_ms"]],
                                 "backward_ms": [round(x, 3) for x in L["backward_ms"]]}

    prof_ms = profiler_times(a.trace)
    rows = []
    for s in prof_steps[1:]:
        st = by_step.get(s, {})
        pf, pb = prof_ms.get("fwd_%d" % s), prof_ms.get("bwd_%d" % s)
        rows.append({"step": s, "hook_fwd": st.get("forward_ms"), "prof_fwd": pf, "hook_bwd": st.get("backward_ms"),
                     "prof_bwd": pb})
    ok = all(r["prof_fwd"] and r["prof_bwd"] and r["hook_fwd"] and r["hook_bwd"]
             and abs(r["hook_fwd"] - r["prof_fwd"]) <= 0.05 * r["prof_fwd"]
             and abs(r["hook_bwd"] - r["prof_bwd"]) <= 0.05 * r["prof_bwd"] for r in rows)
    check("hook forward/backward within 5% of torch.profiler", ok, rows)

    m = mem[-1] if mem else {}
    pred = m.get("parameters_bytes", 0) + m.get("gradients_bytes", 0) + m.get("optimizer_bytes", 0)
    check("memory record: BERT-large parameter count and model state vs measured",
          runs and abs(runs[-1]["meta"].get("params", 0) - BERT_LARGE_PARAMS) <= 1e-4 * BERT_LARGE_PARAMS
          and state_bytes
          and abs(pred - state_bytes) <= 0.1 * state_bytes,
          {"meta_params": runs[-1]["meta"].get("params") if runs else None, "memory": m,
           "predicted_gb": pred / 1e9, "measured_allocated_gb": (state_bytes or 0) / 1e9})
    meta = runs[-1]["meta"] if runs else {}
    check("run meta", meta.get("precision") == "bf16" and meta.get("gpu") and meta.get("seq_len") == a.seq,
          {k: meta.get(k) for k in ("model", "params", "gpu", "gpu_memory_total_gb", "precision", "framework",
                                    "seq_len", "world_size", "versions")})
    ends = cap.records("end")
    check("eval, event and end records", len(cap.records("eval")) == a.steps // 20
          and len(cap.records("event")) == 1 and ends and ends[-1]["status"] == "finished",
          {"end": ends[-1] if ends else None, "sender": {"dropped": run.sender.dropped,
                                                         "rejected": run.sender.rejected}})
    res["steps_sample"] = steps[40:43]
    res["all_ok"] = all(c["ok"] for c in checks.values())
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    cap.close()
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if res["all_ok"] else 1


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
