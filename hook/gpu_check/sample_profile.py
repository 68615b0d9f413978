"""Where the hook's time goes on every thread: a sampling profile of the
tiny-MLP loop of bench.py with the hook at defaults. A thread of this
script reads every thread's stack every --every-ms (sys._current_frames)
and counts, per thread, the innermost frame of the hook's package (own
time) and every hook function on the stack (inclusive time); the training
thread's samples outside the hook are counted as "training". cProfile
cannot do this on Python 3.12, where one profiler serves the whole process.

    python3 hook/gpu_check/sample_profile.py [--steps 3000] [--every-ms 0.5] > sample.txt
"""

import argparse
import collections
import sys
import threading
import time

import bench
from bench import TinyMLP
from common import CaptureProcess

import torch  # noqa: E402

PKG = "/deepseed/"


def where(frame):
    """(innermost hook frame, hook functions on the stack, torch leaf)"""
    own, inclusive, leaf = None, [], None
    f = frame
    depth = 0
    while f is not None and depth < 60:
        co = f.f_code
        fn = co.co_filename
        if PKG in fn and "gpu_check" not in fn:
            name = "%s:%s" % (fn.rsplit("/", 1)[-1], co.co_name)
            if own is None:
                own = name
            inclusive.append(name)
        elif leaf is None and depth == 0:
            leaf = "%s:%s" % (fn.rsplit("/", 1)[-1], co.co_name)
        f = f.f_back
        depth += 1
    return own, set(inclusive), leaf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every-ms", type=float, default=0.5)
    ap.add_argument("--variant", default="default")
    a = ap.parse_args()
    cap = CaptureProcess()
    torch.manual_seed(0)
    model = TinyMLP().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256, device="cuda")
    y = torch.randn(32, 1, device="cuda")
    run = bench.start_hook(a.variant, model, opt, cap.url)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(100):
        step()
    torch.cuda.synchronize()
    main_id = threading.get_ident()
    own = collections.defaultdict(collections.Counter)
    incl = collections.defaultdict(collections.Counter)
    leaves = collections.defaultdict(collections.Counter)
    total = collections.Counter()
    stop = threading.Event()
    me = [None]

    def sampler():
        me[0] = threading.get_ident()
        names = {}
        while not stop.is_set():
            for t in threading.enumerate():
                names[t.ident] = t.name
            for tid, frame in sys._current_frames().items():
                if tid == me[0]:
                    continue
                name = "training" if tid == main_id else names.get(tid, str(tid))
                if not (name == "training" or name.startswith("deepseed-")):
                    continue
                o, inc, leaf = where(frame)
                total[name] += 1
                own[name][o or ("(training)" if name == "training" else "(idle/other)")] += 1
                for i in inc:
                    incl[name][i] += 1
                if o:
                    leaves[name][leaf or "?"] += 1
            time.sleep(a.every_ms / 1000.0)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    run.finish()
    cap.close()
    print("torch %s, %s, %d steps in %.3f s (%.1f µs a step), variant %s" % (
        torch.__version__, torch.cuda.get_device_name(), a.steps, wall, wall / a.steps * 1e6, a.variant))
    for name in sorted(total):
        n = total[name]
        print("\n== %s: %d samples ==" % (name, n))
        print("  own (innermost hook frame):")
        for k, v in own[name].most_common(25):
            print("    %6.2f%%  %s" % (100.0 * v / n, k))
        print("  inclusive:")
        for k, v in incl[name].most_common(20):
            print("    %6.2f%%  %s" % (100.0 * v / n, k))


if __name__ == "__main__":
    main()
