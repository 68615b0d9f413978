"""Which of the hook's parts a compiled step pays for: two copies of
compile_check.py's GPT, compiled once each, their blocks of steps
alternating as a training loop runs them (synchronized only at a block's
ends); the second copy watched with one sampled part turned off at a time
(gradient norm, phase timing, layer timing), and not watched at all for the
copies' own difference.

    python3 hook/gpu_check/compile_costs.py --size small --variant whole --out costs.json
"""

import argparse
import json
import os
import sys
import tempfile

import compile_check as cc
from common import HOOK

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402

CONFIGS = {"unwatched": None, "default": {}, "no_norm": {"grad_norm_every": 0},
           "no_phases": {"phase_every": 1000000}, "no_layers": {"layer_every": 0},
           "steps_only": {"grad_norm_every": 0, "phase_every": 1000000, "layer_every": 0},
           # and read back on the training thread, or not built at all
           "steps_inline": {"grad_norm_every": 0, "phase_every": 1000000, "layer_every": 0, "background_read": False},
           "steps_lean_reader": {"grad_norm_every": 0, "phase_every": 1000000, "layer_every": 0}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=sorted(cc.SIZES))
    ap.add_argument("--variant", default="whole")
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="compile_costs.json")
    a = ap.parse_args()
    cc.SIZE.clear()
    cc.SIZE.update(cc.SIZES[a.size])
    step = cc.make_step(a.variant)
    ma, oa = cc.build(1)
    mb, ob = cc.build(1)
    ca, cb = cc.compile_model(ma, a.variant), cc.compile_model(mb, a.variant)
    for _ in range(10):
        step(ca, oa)
        step(cb, ob)
    torch.cuda.synchronize()
    d = tempfile.mkdtemp(prefix="compile-costs-")
    res = {"size": a.size, "variant": a.variant, "configs": {}}
    for name in a.configs.split(","):
        kw = CONFIGS[name]
        run = None
        saved = None
        if name == "steps_lean_reader":
            import hook_costs
            from deepseed import readback
            saved = readback.StepReader.__dict__["_read_loop"]
            readback.StepReader._read_loop = hook_costs._lean_loop
        if kw is not None:
            run = deepseed.init(project="compile-costs", name=name, file=os.path.join(d, name + ".ndjson"),
                                handle_signals=False)
            run.watch(cb, optimizer=ob, **kw)
            for _ in range(10):
                step(cb, ob)
        r = cc.pipelined(step, (ca, oa), (cb, ob), a.block, a.rounds)
        if run is not None:
            run.finish(timeout=10)
        if saved is not None:
            from deepseed import readback
            readback.StepReader._read_loop = saved
        r["watch"] = kw
        res["configs"][name] = r
        print(name, json.dumps(r), flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
