"""Where the hook's cost per step goes, by taking parts away: the tiny-MLP
benchmark of bench.py with the hook's read-back or its sending switched
off, each variant in interleaved rounds (medians of the difference to the
no-hook measurement of the same round).

    python3 hook/gpu_check/ablate.py [--rounds 15] [--steps 300] [--old DIR]

A diagnostic for the hook's developers: the variants that switch a part
off lose records, so only bench.py's numbers describe the hook a user runs.
"""

import argparse
import json
import statistics
import time

import bench

import torch  # noqa: E402


def variants(pkg):
    def no_read(run, watcher):
        reader = watcher.reader
        # Stop the reader thread; the training thread's polls then drop
        # the closed steps instead of reading them.
        reader.stop(True)
        watcher.steps.read_inline = True
        reader.poll = lambda wait=False: reader.pending.clear()

    def no_send(run, watcher):
        link = getattr(watcher, "link", None)
        if link is not None:
            link.send = lambda rec: None
        else:  # a copy of the package from before the run's link (link.py)
            run._send = lambda rec: None

    def both(run, watcher):
        no_read(run, watcher)
        no_send(run, watcher)

    return {
        "default": ({}, None),
        "le0": ({"layer_every": 0}, None),
        "le0_nosend": ({"layer_every": 0}, no_send),
        "le0_noread": ({"layer_every": 0}, no_read),
        "le0_hooks_only": ({"layer_every": 0}, both),
        "le1": ({"layer_every": 1}, None),
        "le1_noread": ({"layer_every": 1}, no_read),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--old")
    ap.add_argument("--out", default="ablate.json")
    a = ap.parse_args()
    if a.old:
        bench.load_old(a.old)
    from common import CaptureProcess
    cap = CaptureProcess()
    model, opt, step = bench.tiny_setup()

    table = {}
    for prefix, pkg in bench.PACKAGES.items():
        for k, v in variants(pkg).items():
            table[prefix + k] = (pkg, v)
    names = ["no_hook"] + list(table)

    def measure(name):
        run = None
        if name != "no_hook":
            pkg, (ikw, patch) = table[name]
            run = pkg.init(project="ablate", name=name, collector_url=cap.url, handle_signals=False, **ikw)
            watcher = run.watch(model, optimizer=opt)
            if patch is not None:
                patch(run, watcher)
        for i in range(40):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps * 1e6
        if run is not None:
            run.finish()
        return dt

    for i in range(60):
        step(i)
    res = {n: [] for n in names}
    added = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {n: measure(n) for n in order}
        for n in names:
            res[n].append(got[n])
            added[n].append(got[n] - got["no_hook"])
        print("round %d: %s" % (r, {n: round(got[n], 1) for n in names}), flush=True)
    out = {n: {"us_per_step_median": statistics.median(res[n]), "added_us_median": statistics.median(added[n]),
               "all": res[n]} for n in names}
    print("\n%-24s %12s %12s" % ("variant", "µs/step", "added µs"))
    for n in names:
        print("%-24s %12.1f %12.1f" % (n, out[n]["us_per_step_median"], out[n]["added_us_median"]))
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rounds": a.rounds, "steps": a.steps, "variants": out}, f,
                  indent=1)
    cap.close()


if __name__ == "__main__":
    main()
