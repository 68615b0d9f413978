"""Where the hook's time goes on the training thread, line by line: the
eager tiny MLP at defaults with a line tracer on the training thread over
the hook's own code (deepseed/), each line's time up to the next event in
its frame. A line that calls into the hook counts the callee too
(inclusive); the tracer's own cost per line (the cheapest line's mean) is
reported and taken off each hit.

    python3 hook/gpu_check/line_costs.py --steps 3000 --top 45 > lines.txt
"""

import argparse
import collections
import linecache
import os
import sys
import time

import bench
from bench import TinyMLP
from common import CaptureProcess

import torch  # noqa: E402

PKG = os.sep + "deepseed" + os.sep


def traced_steps(steps_n, url, xs, ys):
    torch.manual_seed(0)
    model = TinyMLP().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = bench.start_hook("default", model, opt, url)
    mse = torch.nn.functional.mse_loss

    def step(i):
        loss = mse(model(xs[i % 4]), ys[i % 4])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(100):
        step(i)
    torch.cuda.synchronize()
    pc = time.perf_counter_ns
    acc = collections.defaultdict(lambda: [0, 0])
    open_lines = {}

    def local(frame, event, arg):
        now = pc()
        last = open_lines.get(frame)
        if last is not None:
            c = acc[(frame.f_code.co_filename, last[0], frame.f_code.co_name)]
            c[0] += now - last[1]
            c[1] += 1
        if event == "return":
            open_lines.pop(frame, None)
        else:
            open_lines[frame] = (frame.f_lineno, pc())
        return local

    def glob(frame, event, arg):
        if PKG in frame.f_code.co_filename:
            return local
        return None

    sys.settrace(glob)
    try:
        for i in range(100, 100 + steps_n):
            step(i)
    finally:
        sys.settrace(None)
    torch.cuda.synchronize()
    run.finish()
    return acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    cap = CaptureProcess()
    xs = [torch.randn(32, 256, device="cuda") for _ in range(4)]
    ys = [torch.randn(32, 1, device="cuda") for _ in range(4)]
    acc = traced_steps(a.steps, cap.url, xs, ys)
    cap.close()
    floor = min(ns / n for ns, n in acc.values() if n >= a.steps // 2)
    rows = []
    for (fn, line, name), (ns, n) in acc.items():
        rows.append(((ns - n * floor) / a.steps / 1e3, n / a.steps, fn, line, name))
    rows.sort(reverse=True)
    print("tiny MLP at defaults, %d traced steps; tracer cost %.0f ns a line, taken off each hit" % (a.steps, floor))
    by_fn = collections.defaultdict(float)
    print("| µs/step (inclusive of callees) | hits/step | line | source |")
    print("|---|---|---|---|")
    for us, hits, fn, line, name in rows[:a.top]:
        src = linecache.getline(fn, line).strip()
        print("| %.2f | %.2f | %s:%d %s | `%s` |" % (us, hits, fn.split(PKG)[-1], line, name, src[:90]))
    for us, hits, fn, line, name in rows:
        by_fn["%s %s" % (fn.split(PKG)[-1], name)] += us
    print("\nper function, lines summed (callees' lines counted in their caller's too):")
    for k, v in sorted(by_fn.items(), key=lambda kv: -kv[1])[:30]:
        print("  %8.2f µs/step  %s" % (v, k))


if __name__ == "__main__":
    main()
