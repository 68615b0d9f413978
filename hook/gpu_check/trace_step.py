"""What the hook adds to a compiled step, from torch.profiler: the device
kernels a step runs and their time, the runtime calls that wait for the
device (synchronizes, blocking copies, pinned allocations), and the host
ops whose time grows, for an unwatched and a watched copy of compile_check.py's
GPT (compiled whole or by block), traced over the same number of steps as
a training loop runs them (no synchronize between steps).

    python3 hook/gpu_check/trace_step.py --size 400m --variant whole --out trace.json
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import compile_check as cc
from common import HOOK

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402

WAITS = ("Synchronize", "Memcpy", "HostAlloc", "MallocHost", "EventQuery", "EventElapsed", "EventRecord")


def trace(call, opt, step, n):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(6):
        step(call, opt)
    torch.cuda.synchronize()
    c0 = time.thread_time()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step(call, opt)
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n * 1e3
    cpu = (time.thread_time() - c0) / n * 1e3
    kernels, kernel_us = 0, 0.0
    waits = collections.Counter()
    wait_us = collections.Counter()
    host = collections.Counter()
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is not None and dev.name == "CUDA":
            kernels += 1
            kernel_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            continue
        name = e.name
        if any(w in name for w in WAITS):
            waits[name] += 1
            wait_us[name] += e.cpu_time_total
        host[name] += e.self_cpu_time_total
    return {"steps": n, "wall_ms_per_step_profiled": round(wall, 3), "train_thread_cpu_ms_per_step": round(cpu, 3),
            "kernels_per_step": round(kernels / n, 2), "kernel_ms_per_step": round(kernel_us / n / 1e3, 3),
            "waits_per_step": {k: [round(v / n, 2), round(wait_us[k] / n, 1)] for k, v in waits.items()},
            "_host": host}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=sorted(cc.SIZES))
    ap.add_argument("--variant", default="whole")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--watch", default="{}", help="watch() keyword arguments, JSON")
    ap.add_argument("--out", default="trace.json")
    a = ap.parse_args()
    cc.SIZE.clear()
    cc.SIZE.update(cc.SIZES[a.size])
    res = {"size": a.size, "variant": a.variant, "watch": json.loads(a.watch)}
    step = cc.make_step(a.variant)
    ma, oa = cc.build(1)
    ca = cc.compile_model(ma, a.variant)
    res["unwatched"] = trace(ca, oa, step, a.steps)
    mb, ob = cc.build(1)
    cb = cc.compile_model(mb, a.variant)
    path = os.path.join(tempfile.mkdtemp(prefix="trace-step-"), "run.ndjson")
    run = deepseed.init(project="trace-step", name=a.variant, file=path, handle_signals=False)
    run.watch(cb, optimizer=ob, **res["watch"])
    res["watched"] = trace(cb, ob, step, a.steps)
    run.finish(timeout=10)
    ha, hb = res["unwatched"].pop("_host"), res["watched"].pop("_host")
    grown = {k: round((hb.get(k, 0) - ha.get(k, 0)) / a.steps, 1) for k in set(ha) | set(hb)}
    res["host_us_per_step_grown"] = dict(sorted(grown.items(), key=lambda kv: -abs(kv[1]))[:25])
    print(json.dumps(res, indent=1))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
