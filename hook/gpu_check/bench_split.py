"""The hook's cost per step where the host's own step time drifts by more
than that cost (hundreds of µs between rounds of bench.py on a shared
host): two copies of the tiny MLP of bench.py in one loop, one watched and
one not, their steps alternating (A B, then B A), each step timed on its
own. Drift and whatever the host does to both land on both; what remains
is the hook's cost on the training thread, its rare sampled steps
included (a mean, not a median). The hook's threads (read-back, sender)
run beside both copies' steps, so their cost is added as the CPU time
they took per watched step.

    python3 hook/gpu_check/bench_split.py [--old DIR] [--pairs 2000] [--rounds 2] --out split.json

Variants are bench.py's (default, layer_every_0, periods_only, …, and
old_… with --old) and the floors under them (floor_empty, floor_events, …:
see Floor), each a block of pairs, blocks interleaved over rounds.
"""

import argparse
import json
import math
import statistics
import threading
import time

import bench
from bench import TinyMLP
from common import CaptureProcess

import torch  # noqa: E402


def thread_cpu_s(th):
    """CPU seconds a live thread has used."""
    return time.clock_gettime(time.pthread_getcpuclockid(th.ident))


def tiny(seed=0):
    torch.manual_seed(seed)
    model = TinyMLP().cuda().train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


class Floor:
    """The hooks the watcher registers (the model's forward pre-hook with
    keyword arguments, the optimizer's pre- and post-hooks) with empty
    bodies or with the least a step could do in them, the floor under the
    hook's own work:

    floor_empty       nothing
    floor_events      a reused CUDA event recorded at the step's open and
                      at its close (Event.record(), its stream looked up)
    floor_one_event   the stream looked up at the open, one event recorded
                      on it at the close, as the hook does
    floor_stream      the stream looked up at the open, nothing recorded
    floor_record      one event recorded at the close on the stream looked
                      up once
    floor_untimed     as floor_record, an event without timing
    floor_kernel      one one-element kernel at the close instead
    floor_every4      as floor_record, every fourth step
    floor_open_record as floor_record, at the open instead of the close
    """

    steps_logged = 0

    def __init__(self, model, opt, kind):
        timing = kind != "floor_untimed"
        pool = [torch.cuda.Event(enable_timing=timing) for _ in range(8)]
        n = [0]
        stream = [torch.cuda.current_stream()]
        record_on = torch._C._CudaEventBase.record
        flag = torch.zeros((), device="cuda")

        def rec_plain():
            pool[n[0] % 8].record()
            n[0] += 1

        def rec_cached():
            record_on(pool[n[0] % 8], stream[0])
            n[0] += 1

        def look_up():
            stream[0] = torch.cuda.current_stream()

        def every4():
            if n[0] % 4 == 0:
                record_on(pool[n[0] % 8], stream[0])
            n[0] += 1

        def nothing():
            pass

        opening, closing = {
            "floor_empty": (nothing, nothing),
            "floor_events": (rec_plain, rec_plain),
            "floor_one_event": (look_up, rec_cached),
            "floor_stream": (look_up, nothing),
            "floor_record": (nothing, rec_cached),
            "floor_untimed": (nothing, rec_cached),
            "floor_kernel": (nothing, lambda: flag.add_(1.0)),
            "floor_every4": (nothing, every4),
            "floor_open_record": (rec_cached, nothing),
        }[kind]
        self.handles = [model.register_forward_pre_hook(lambda m, a, k: opening(), with_kwargs=True),
                        opt.register_step_pre_hook(lambda o, a, k: None),
                        opt.register_step_post_hook(lambda o, a, k: closing())]

    def finish(self):
        for h in self.handles:
            h.remove()


def block(variant, pairs, url, xs, ys):
    (ma, oa), (mb, ob) = tiny(), tiny()
    mse = torch.nn.functional.mse_loss

    def step(m, o, i):
        loss = mse(m(xs[i % 4]), ys[i % 4])
        loss.backward()
        o.step()
        o.zero_grad(set_to_none=True)

    if variant.startswith("floor_"):
        run = Floor(ma, oa, variant)
    else:
        run = bench.start_hook(variant, ma, oa, url)
    for i in range(60):
        step(ma, oa, i)
        step(mb, ob, i)
    torch.cuda.synchronize()
    threads = [t for t in threading.enumerate() if t.name.startswith("deepseed-") and t.is_alive()]
    cpu0 = {t.ident: thread_cpu_s(t) for t in threads}
    pc = time.perf_counter
    diffs = []
    t_start = pc()
    for i in range(pairs):
        if i % 2 == 0:
            t0 = pc()
            step(ma, oa, i)
            t1 = pc()
            step(mb, ob, i)
            t2 = pc()
            diffs.append((t1 - t0) - (t2 - t1))
        else:
            t0 = pc()
            step(mb, ob, i)
            t1 = pc()
            step(ma, oa, i)
            t2 = pc()
            diffs.append((t2 - t1) - (t1 - t0))
    torch.cuda.synchronize()
    wall = pc() - t_start
    bg = 0.0
    for t in threads:
        if t.is_alive():
            bg += thread_cpu_s(t) - cpu0[t.ident]
    run.finish()
    us = [d * 1e6 for d in diffs]
    mean = statistics.fmean(us)
    se = statistics.stdev(us) / math.sqrt(len(us))
    return {"variant": variant, "pairs": pairs, "train_thread_us_mean": mean, "train_thread_us_se": se,
            "train_thread_us_median": statistics.median(us), "background_cpu_us": bg / pairs * 1e6,
            "added_us": mean + bg / pairs * 1e6, "pair_ms": wall / pairs * 1e3,
            "threads": sorted(t.name for t in threads), "steps_logged": run.steps_logged}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="split.json")
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="default,layer_every_0,periods_only")
    ap.add_argument("--old", help="another deepseed package directory to compare with")
    a = ap.parse_args()
    if a.old:
        bench.load_old(a.old)
    variants = a.variants.split(",")
    cap = CaptureProcess()
    xs = [torch.randn(32, 256, device="cuda") for _ in range(4)]
    ys = [torch.randn(32, 1, device="cuda") for _ in range(4)]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "pairs": a.pairs, "blocks": []}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            try:
                res = block(v, a.pairs, cap.url, xs, ys)
            except Exception as e:  # one broken variant must not lose the others
                res = {"variant": v, "error": repr(e)}
            res["round"] = r
            out["blocks"].append(res)
            print(json.dumps(res), flush=True)
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
    out["records_received"] = cap.close()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("\ntiny MLP, watched and unwatched copies alternating step by step, %d pairs a block, %d rounds"
          % (a.pairs, a.rounds))
    print("| variant | training thread µs/step (mean ± s.e.) | its median | hook threads' CPU µs/step | added µs/step |")
    print("|---|---|---|---|---|")
    for v in variants:
        bs = [b for b in out["blocks"] if b["variant"] == v and "error" not in b]
        if not bs:
            print("| %s | error | | | |" % v)
            continue
        m = statistics.fmean(b["train_thread_us_mean"] for b in bs)
        se = math.sqrt(sum(b["train_thread_us_se"] ** 2 for b in bs)) / len(bs)
        med = statistics.median(b["train_thread_us_median"] for b in bs)
        bg = statistics.fmean(b["background_cpu_us"] for b in bs)
        print("| %s | %+.1f ± %.1f | %+.1f | %.1f | %+.1f |" % (v, m, se, med, bg, m + bg))


if __name__ == "__main__":
    main()
