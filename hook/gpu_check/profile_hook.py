"""Where the hook's time per step goes: cProfile of a tiny-MLP loop with
the hook at defaults (the hook's own Python, sorted by own time), on the
training thread (with --variant inline_read the read-back runs there too,
where cProfile sees it: on Python 3.12 one profiler serves the process, so
the hook's own threads cannot be profiled apart), and the cost of each torch
primitive the hook uses, timed alone.

    python3 hook/gpu_check/profile_hook.py [--old DIR] > profile.txt
"""

import argparse
import cProfile
import io
import json
import pstats
import time

import bench
from bench import TinyMLP

import torch  # noqa: E402


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def primitives():
    dev = torch.device("cuda", 0)
    ev = torch.cuda.Event(enable_timing=True)
    ev2 = torch.cuda.Event(enable_timing=True)
    ev.record()
    ev2.record()
    torch.cuda.synchronize()
    s = torch.cuda.current_stream()
    a = torch.ones((), device="cuda")
    b = torch.ones((), device="cuda")
    host = torch.empty(2, pin_memory=True)
    pair = torch.stack([a, b])
    big = [torch.randn(1024, 1024, device="cuda") for _ in range(390)]
    small = [torch.randn(256, 256, device="cuda") for _ in range(18)]
    out390 = torch.empty(390, device="cuda")
    x = torch.randn(8, requires_grad=True, device="cuda")
    y = x * 2
    m = torch.nn.Linear(4, 4)
    rec = {"kind": "step", "run_id": "0123456789abcdef", "rank": 0, "step": 1234, "time": time.time(),
           "forward_ms": 1.2345, "backward_ms": 2.3456, "optimizer_ms": 0.3456, "step_ms": 4.5678,
           "data_ms": 0.0123, "gpu_mem_peak_gb": 1.234, "gpu_mem_reserved_gb": 2.345, "samples": 32,
           "tokens": 8192, "loss": 0.6931, "grad_norm": 1.2345, "lr": 2e-5, "throughput_sps": 1234.5,
           "throughput_tps": 123456.7, "tflops": 123.4, "mfu": 0.3}
    out = {}
    cases = {
        "max_memory_allocated": lambda: torch.cuda.max_memory_allocated(dev),
        "memory_stats": lambda: torch.cuda.memory_stats(dev),
        "Event(enable_timing)": lambda: torch.cuda.Event(enable_timing=True),
        "event.record()": lambda: ev.record(),
        "event.record(cached stream)": lambda: ev.record(s),
        "current_stream()": lambda: torch.cuda.current_stream(),
        "event.query()": lambda: ev.query(),
        "elapsed_time": lambda: ev.elapsed_time(ev2),
        "empty(2, pin_memory)": lambda: torch.empty(2, pin_memory=True),
        "pinned copy_ non_blocking": lambda: host.copy_(pair, non_blocking=True),
        "stack 2 scalars": lambda: torch.stack([a, b]),
        "_foreach_norm 18 small": lambda: torch._foreach_norm(small),
        "_foreach_norm 390 x 1M": lambda: torch._foreach_norm(big),
        "stack 390 norms out=": lambda: torch.stack(torch._foreach_norm(big), out=out390),
        "tensor.register_hook": lambda: y.register_hook(lambda g: None).remove(),
        "module fwd hook reg+remove": lambda: m.register_forward_hook(lambda *a: None).remove(),
        "json.dumps step record": lambda: json.dumps(rec, separators=(",", ":")),
        "is_grad_enabled": torch.is_grad_enabled,
        "_current_graph_task_id": torch._C._current_graph_task_id,
    }
    for k, fn in cases.items():
        try:
            out[k] = round(per_call_us(fn, 300 if "390" in k or "memory" in k else 2000), 2)
        except Exception as e:
            out[k] = "error: %s" % e
    return out


def profile_loop(pkg_prefix, url, steps=500, layer_every=None, variant="default"):
    torch.manual_seed(0)
    model = TinyMLP().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256, device="cuda")
    y = torch.randn(32, 1, device="cuda")
    if layer_every is None:
        run = bench.start_hook(pkg_prefix + variant, model, opt, url)
    else:
        run = bench.PACKAGES[pkg_prefix].init(project="bench", name="profile", collector_url=url,
                                              handle_signals=False, layer_every=layer_every)
        run.watch(model, optimizer=opt)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    pr.disable()
    run.finish()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats("deepseed", 45)
    return s.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old")
    ap.add_argument("--layer-every", type=int, help="profile with this layer period instead of the default")
    ap.add_argument("--no-primitives", action="store_true")
    ap.add_argument("--variant", default="default", help="a bench.py variant (inline_read: read-back on this thread)")
    ap.add_argument("--steps", type=int, default=500)
    a = ap.parse_args()
    if a.old:
        bench.load_old(a.old)
    from common import CaptureProcess
    cap = CaptureProcess()
    if not a.no_primitives:
        print("primitive costs, µs per call (host time, launch included):")
        for k, v in primitives().items():
            print("  %-32s %s" % (k, v))
    for prefix in bench.PACKAGES:
        print("\n==== cProfile, %shook at defaults, %d tiny-MLP steps ====" % (prefix or "this ", a.steps))
        print(profile_loop(prefix, cap.url, steps=a.steps, layer_every=a.layer_every,
                           variant=a.variant if not prefix else "default"))
    cap.close()


if __name__ == "__main__":
    main()
