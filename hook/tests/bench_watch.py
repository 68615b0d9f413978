"""The watcher's own Python per step, on the torch stand-in of faketorch:
a guard against regressions of the hook's cost that runs without a GPU.
Its figures are the hook's Python alone (no CUDA events, no launches), so
they are lower than what a GPU step pays; gpu_check/bench.py measures that.

    python3 hook/tests/bench_watch.py [--old DIR [--same-process]] [--rounds 9] [--steps 5000] [--max-ratio 1.1]
                                      [--manual]

Each round times a loop without the hook and one with it (defaults with
layers off, read-back inline, records to a file; with --manual, the phase
marks a framework calls with manual=True and a log_step), in turn, for this
package and, with --old, another copy of it (say, the previous release):
the median over rounds of (with - without) / steps is printed. With
--old and --max-ratio, the exit status is 1 when this package's median is
more than that many times the other's: a regression guard that compares
two copies measured in the same rounds, not a time limit.

Each measurement runs in a process of its own, with --same-process all of
them in one (the other copy imported as deepseed_old), round after round:
on a busy machine the two copies then share every slow spell, and the
median of their difference round by round is the figure to read.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What both ways of running share: the torch stand-in, a watched model and
# its loop for one copy of the package (pkg), and a bare loop beside it.
PRELUDE = r"""
import importlib, inspect, json, os, sys, time
from tests import faketorch
faketorch.install()
torch = sys.modules["torch"]
x = torch.Tensor(0.0, (32, 256))


def loop(m, o, n):
    t0 = time.perf_counter()
    for _ in range(n):
        loss = m(x)
        loss.backward_reached()
        o.step()
    return time.perf_counter() - t0


def watched(pkg, path, manual):
    # A run of pkg writing to path, its watched model and the loop that
    # trains it: the model's hooks, or what a framework's callback calls
    # around the same step (manual=True).
    run = pkg.init(project="bench", run_id="bench", file=path, handle_signals=False, layer_every=0)
    model = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
    opt = torch.optim.Optimizer(model.parameters(), lr=0.1)
    watch = importlib.import_module(pkg.__name__ + ".watch")
    kw = {"grad_norm_every": 0}
    if "background_read" in inspect.signature(watch.Watcher.__init__).parameters:
        kw["background_read"] = False  # a package without the option reads inline anyway
    w = run.watch(model, manual=True, **kw) if manual else run.watch(model, optimizer=opt, **kw)
    if w is None:
        sys.exit("watch() failed")

    def marked(n):
        t0 = time.perf_counter()
        for _ in range(n):
            w.step_begin(x)
            loss = model(x)
            w.backward_begin()
            loss.backward_reached()
            w.backward_end()
            w.optimizer_begin()
            opt.step()
            w.step_end(extra={"epoch": 0})
            run.log_step(loss=1.0)
        return time.perf_counter() - t0

    return run, (marked if manual else lambda n: loop(model, opt, n))


bare = torch.nn.Module(forward=lambda x: torch.Tensor(2.0, requires_grad=True))
bare_opt = torch.optim.Optimizer(bare.parameters(), lr=0.1)
"""

# One copy, imported as deepseed from the first path: one round.
CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
""" + PRELUDE + r"""
import deepseed
steps, path, manual = int(sys.argv[3]), sys.argv[4], sys.argv[5] == "manual"
run, hooked_loop = watched(deepseed, path, manual)
hooked_loop(1000)
loop(bare, bare_opt, 1000)
base = loop(bare, bare_opt, steps)
hooked = hooked_loop(steps)
run.finish()
print(json.dumps({"us": (hooked - base) / steps * 1e6}))
"""

# This copy and the other (imported as deepseed_old) in one process, every
# round timing each beside a bare loop of its own, in alternating order.
SAME = r"""
import importlib.util, sys
sys.path.insert(0, sys.argv[1])
""" + PRELUDE + r"""
import deepseed
old_dir, steps, rounds, tmp = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
manual = sys.argv[6] == "manual"
spec = importlib.util.spec_from_file_location("deepseed_old", os.path.join(old_dir, "__init__.py"),
                                              submodule_search_locations=[old_dir])
old = importlib.util.module_from_spec(spec)
sys.modules["deepseed_old"] = old
spec.loader.exec_module(old)
variants = {k: watched(pkg, os.path.join(tmp, k + ".ndjson"), manual)
            for k, pkg in (("this", deepseed), ("old", old))}
for _, hooked_loop in variants.values():
    hooked_loop(1000)
loop(bare, bare_opt, 1000)
res = {k: [] for k in variants}
for r in range(rounds):
    for k in (list(variants) if r % 2 == 0 else list(reversed(list(variants)))):
        base = loop(bare, bare_opt, steps)
        res[k].append((variants[k][1](steps) - base) / steps * 1e6)
for run, _ in variants.values():
    run.finish()
print(json.dumps(res))
"""


def measure(pkg_root, steps, path, manual=False):
    out = subprocess.run([sys.executable, "-c", CHILD, pkg_root, HOOK, str(steps), path,
                          "manual" if manual else "hooks"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["us"]


def measure_together(old, rounds, steps, tmp, manual=False):
    """Every round of this copy and old in one process (SAME)."""
    out = subprocess.run([sys.executable, "-c", SAME, HOOK, os.path.abspath(old), str(steps), str(rounds), tmp,
                          "manual" if manual else "hooks"], capture_output=True, text=True, timeout=60 + 60 * rounds)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="a directory holding another deepseed package (the package itself)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--max-ratio", type=float, help="with --old: fail when this costs more than RATIO x the old")
    ap.add_argument("--manual", action="store_true", help="time the phase marks of manual=True instead of the hooks")
    ap.add_argument("--same-process", action="store_true",
                    help="with --old: time both copies in one process, round by round")
    a = ap.parse_args()
    if a.same_process and not a.old:
        ap.error("--same-process needs --old")
    variants = {"this": HOOK}
    tmp = tempfile.TemporaryDirectory(prefix="deepseed-bench-")
    if a.old:
        # The child imports "deepseed" from the first path: give the old
        # copy a directory of its own under that name.
        root = os.path.join(tmp.name, "old")
        os.makedirs(root)
        os.symlink(os.path.abspath(a.old), os.path.join(root, "deepseed"))
        variants["old"] = root
    if a.same_process:
        res = measure_together(a.old, a.rounds, a.steps, tmp.name, a.manual)
        for r in range(a.rounds):
            print("round %d: %s" % (r, {k: round(v[r], 2) for k, v in res.items()}))
    else:
        res = {k: [] for k in variants}
        for r in range(a.rounds):
            names = list(variants)
            if r % 2:
                names.reverse()
            for k in names:
                res[k].append(measure(variants[k], a.steps, os.path.join(tmp.name, "%s-%d.ndjson" % (k, r)),
                                      a.manual))
            print("round %d: %s" % (r, {k: round(v[-1], 2) for k, v in res.items()}), flush=True)
    print("\nthe watcher's Python per step on the torch stand-in, median of %d rounds of %d steps%s:" % (
        a.rounds, a.steps, " in one process" if a.same_process else ""))
    for k, v in res.items():
        print("  %-5s %6.2f µs (min %.2f, max %.2f)" % (k, statistics.median(v), min(v), max(v)))
    if a.old:
        d = [x - y for x, y in zip(res["this"], res["old"])]
        print("  this - old, round by round: median %+.2f µs" % statistics.median(d))
    tmp.cleanup()
    if a.old and a.max_ratio:
        ratio = statistics.median(res["this"]) / max(1e-9, statistics.median(res["old"]))
        print("this / old: %.2f (allowed %.2f)" % (ratio, a.max_ratio))
        if ratio > a.max_ratio:
            sys.exit(1)


if __name__ == "__main__":
    main()
