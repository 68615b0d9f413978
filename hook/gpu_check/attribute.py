"""Where the hook's cost per step goes on the tiny MLP of bench.py, by
function: the hook's methods timed one by one (a perf_counter_ns pair
around each, ~0.2 µs a call of its own), beside the floors they stand on:
hooks with empty bodies (what PyTorch's hook dispatch costs) and the same
hooks recording one CUDA event each. Blocks of steps, synchronized at
their ends only; variants interleaved over rounds, medians of each block's
difference to the unwatched block of its round.

    python3 hook/gpu_check/attribute.py [--rounds 11] [--steps 400] --out attribute.json

A diagnostic for the hook's developers; bench.py and bench_split.py give
the figures a user pays.
"""

import argparse
import collections
import functools
import json
import statistics
import threading
import time

import bench
from bench_split import thread_cpu_s
from common import CaptureProcess

import torch  # noqa: E402

from deepseed import readback, sender, steps, torch_utils  # noqa: E402

TIMED = [
    (steps.StepState, ("open_forward", "open_step", "count_batch", "close_forward", "optimizer_pre",
                       "take_grad_norm", "optimizer_post", "read_lr", "close_step", "wrapped_graphs")),
    (torch_utils.EventPool, ("record", "use_current_stream")),
    (torch_utils.Fetcher, ("add", "flush")),
    (readback.StepReader, ("_take_batch", "_build", "_sync_fields", "read_waiting", "_deliver_outbox", "send_steps")),
    (sender.Sender, ("_post", "put")),
]

CALLS = collections.Counter()
NS = collections.Counter()


def instrument():
    """Wraps every TIMED method with a timer; returns the undo."""
    saved = []
    pc = time.perf_counter_ns
    for cls, names in TIMED:
        for name in names:
            fn = getattr(cls, name, None)
            if fn is None:
                continue
            key = "%s.%s" % (cls.__name__, name)

            def wrap(fn=fn, key=key):
                @functools.wraps(fn)
                def timed(*a, **kw):
                    t0 = pc()
                    try:
                        return fn(*a, **kw)
                    finally:
                        NS[key] += pc() - t0
                        CALLS[key] += 1
                return timed

            saved.append((cls, name, fn))
            setattr(cls, name, wrap())

    def undo():
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return undo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", default="attribute.json")
    a = ap.parse_args()
    cap = CaptureProcess()
    model, opt, step = bench.tiny_setup()
    empty = lambda *args, **kw: None  # noqa: E731

    def hooks(record):
        evs = []

        def pre(m, args, kwargs):
            if record:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                evs.append(e)

        def post(o, args, kwargs):
            if record:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                evs.append(e)
                if len(evs) > 64:
                    del evs[:32]
        return [model.register_forward_pre_hook(pre, with_kwargs=True), opt.register_step_pre_hook(empty),
                opt.register_step_post_hook(post)]

    names = ["no_hook", "empty_hooks", "event_hooks", "default", "default_timed", "layer_every_0"]

    def measure(name):
        run, handles, undo = None, [], None
        if name in ("empty_hooks", "event_hooks"):
            handles = hooks(name == "event_hooks")
        elif name != "no_hook":
            if name == "default_timed":
                undo = instrument()
            kw = {"layer_every": 0} if name == "layer_every_0" else {}
            run = bench.deepseed.init(project="attr", name=name, collector_url=cap.url, handle_signals=False, **kw)
            run.watch(model, optimizer=opt)
        for i in range(40):
            step(i)
        torch.cuda.synchronize()
        ths = [t for t in threading.enumerate() if t.name.startswith("deepseed-") and t.is_alive()]
        cpu0 = {t.ident: thread_cpu_s(t) for t in ths}
        if name == "default_timed":
            NS.clear()
            CALLS.clear()
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps * 1e6
        bg = sum(thread_cpu_s(t) - cpu0[t.ident] for t in ths if t.is_alive()) / a.steps * 1e6
        funcs = {k: (NS[k] / a.steps / 1e3, CALLS[k] / a.steps) for k in NS} if name == "default_timed" else None
        if run is not None:
            run.finish()
        for h in handles:
            h.remove()
        if undo is not None:
            undo()
        return dt, bg, funcs

    for i in range(60):
        step(i)
    res = {n: [] for n in names}
    added = {n: [] for n in names}
    bgs = {n: [] for n in names}
    per_fn = collections.defaultdict(list)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for n in order:
            dt, bg, funcs = measure(n)
            got[n] = dt
            bgs[n].append(bg)
            for k, v in (funcs or {}).items():
                per_fn[k].append(v)
        for n in names:
            res[n].append(got[n])
            added[n].append(got[n] - got["no_hook"])
        print("round %d: %s" % (r, {n: round(got[n], 1) for n in names}), flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": a.rounds, "steps": a.steps,
           "variants": {n: {"us_per_step_median": statistics.median(res[n]),
                            "added_us_median": statistics.median(added[n]),
                            "hook_threads_cpu_us_median": statistics.median(bgs[n])} for n in names},
           "functions_us_per_step": {k: {"us_median": statistics.median(x[0] for x in v),
                                         "calls_per_step": statistics.median(x[1] for x in v)}
                                     for k, v in per_fn.items()}}
    print("\n%-16s %10s %10s %14s" % ("variant", "µs/step", "added µs", "threads' CPU"))
    for n in names:
        v = out["variants"][n]
        print("%-16s %10.1f %10.1f %14.1f" % (n, v["us_per_step_median"], v["added_us_median"],
                                              v["hook_threads_cpu_us_median"]))
    print("\n%-36s %10s %8s" % ("function (default_timed)", "µs/step", "calls"))
    for k, v in sorted(out["functions_us_per_step"].items(), key=lambda kv: -kv[1]["us_median"]):
        print("%-36s %10.2f %8.2f" % (k, v["us_median"], v["calls_per_step"]))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    cap.close()


if __name__ == "__main__":
    main()
