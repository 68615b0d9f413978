"""The watcher's own Python per step, on the torch stand-in of faketorch:
a guard against regressions of the hook's cost that runs without a GPU.
Its figures are the hook's Python alone (no CUDA events, no launches), so
they are lower than what a GPU step pays; gpu_check/bench.py measures that.

    python3 hook/tests/bench_watch.py [--old DIR] [--rounds 9] [--steps 5000] [--max-ratio 1.1] [--manual]

Each round times a loop without the hook and one with it (defaults with
layers off, read-back inline, records to a file; with --manual, the phase
marks a framework calls with manual=True and a log_step), in turn, for this
package and, with --old, another copy of it (say, the previous release):
the median over rounds of (with - without) / steps is printed. With
--old and --max-ratio, the exit status is 1 when this package's median is
more than that many times the other's: a regression guard that compares
two copies measured in the same rounds, not a time limit.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
from tests import faketorch
faketorch.install()
import deepseed
torch = sys.modules["torch"]
steps, path, manual = int(sys.argv[3]), sys.argv[4], sys.argv[5] == "manual"
run = deepseed.init(project="bench", run_id="bench", file=path, handle_signals=False, layer_every=0)
model = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
opt = torch.optim.Optimizer(model.parameters(), lr=0.1)
import inspect
import importlib
watch = importlib.import_module("deepseed.watch")
kw = {"grad_norm_every": 0}
if "background_read" in inspect.signature(watch.Watcher.__init__).parameters:
    kw["background_read"] = False  # a package without the option reads inline anyway
w = run.watch(model, manual=True, **kw) if manual else run.watch(model, optimizer=opt, **kw)
if w is None:
    sys.exit("watch() failed")
bare = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
bare_opt = torch.optim.Optimizer(bare.parameters(), lr=0.1)
x = torch.Tensor(0.0, (32, 256))

def loop(m, o, n):
    t0 = time.perf_counter()
    for _ in range(n):
        loss = m(x)
        loss.backward_reached()
        o.step()
    return time.perf_counter() - t0

def marked(m, o, n):
    # What a framework's callback calls around the same step (manual=True).
    t0 = time.perf_counter()
    for _ in range(n):
        w.step_begin(x)
        loss = m(x)
        w.backward_begin()
        loss.backward_reached()
        w.backward_end()
        w.optimizer_begin()
        o.step()
        w.step_end(extra={"epoch": 0})
        run.log_step(loss=1.0)
    return time.perf_counter() - t0

hooked_loop = marked if manual else loop
hooked_loop(model, opt, 1000)
loop(bare, bare_opt, 1000)
base = loop(bare, bare_opt, steps)
hooked = hooked_loop(model, opt, steps)
run.finish()
print(json.dumps({"us": (hooked - base) / steps * 1e6}))
"""


def measure(pkg_root, steps, path, manual=False):
    out = subprocess.run([sys.executable, "-c", CHILD, pkg_root, HOOK, str(steps), path,
                          "manual" if manual else "hooks"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])["us"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="a directory holding another deepseed package (the package itself)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--max-ratio", type=float, help="with --old: fail when this costs more than RATIO x the old")
    ap.add_argument("--manual", action="store_true", help="time the phase marks of manual=True instead of the hooks")
    a = ap.parse_args()
    variants = {"this": HOOK}
    tmp = tempfile.TemporaryDirectory(prefix="deepseed-bench-")
    if a.old:
        # The child imports "deepseed" from the first path: give the old
        # copy a directory of its own under that name.
        root = os.path.join(tmp.name, "old")
        os.makedirs(root)
        os.symlink(os.path.abspath(a.old), os.path.join(root, "deepseed"))
        variants["old"] = root
    res = {k: [] for k in variants}
    for r in range(a.rounds):
        names = list(variants)
        if r % 2:
            names.reverse()
        for k in names:
            res[k].append(measure(variants[k], a.steps, os.path.join(tmp.name, "%s-%d.ndjson" % (k, r)), a.manual))
        print("round %d: %s" % (r, {k: round(v[-1], 2) for k, v in res.items()}), flush=True)
    print("\nthe watcher's Python per step on the torch stand-in, median of %d rounds of %d steps:" % (a.rounds,
                                                                                                   a.steps))
    for k, v in res.items():
        print("  %-5s %6.2f µs (min %.2f, max %.2f)" % (k, statistics.median(v), min(v), max(v)))
    tmp.cleanup()
    if a.old and a.max_ratio:
        ratio = statistics.median(res["this"]) / max(1e-9, statistics.median(res["old"]))
        print("this / old: %.2f (allowed %.2f)" % (ratio, a.max_ratio))
        if ratio > a.max_ratio:
            sys.exit(1)


if __name__ == "__main__":
    main()
