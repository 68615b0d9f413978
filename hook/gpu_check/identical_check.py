"""The hook does not change what the model computes: the same training from
the same seed, once unwatched and once watched with every part of the hook
on every step (layers, phases, gradient norm, the sampling floor off),
must end with bit-identical weights and losses. Deterministic algorithms
are on, and each configuration also runs unwatched twice: where that
control differs, the training itself is not reproducible there and the
watched run is compared within the control's own difference instead.

Configurations: the tiny MLP in fp32 (AdamW), the tiny MLP in fp16 with a
GradScaler (the hook reads the loss scale and closes skipped steps), and
the small GPT-NeoX of compile_check.py in bf16 autocast, eager, compiled
whole and compiled block by block.

    python3 hook/gpu_check/identical_check.py --steps 30 --out identical.json
"""

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import compile_check  # noqa: E402
from bench import TinyMLP  # noqa: E402
from common import HOOK  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, HOOK)
import deepseed  # noqa: E402

CONFIGS = ("mlp_fp32", "mlp_fp16_scaler", "neox_eager", "neox_whole", "neox_blocks")


def train(config, watched, steps, path):
    """Losses and final weights (on the host) of one training run."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    scaler = None
    if config.startswith("mlp"):
        model = TinyMLP().cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator(device="cuda").manual_seed(1)
        data = [(torch.randn(32, 256, device="cuda", generator=g), torch.randn(32, 1, device="cuda", generator=g))
                for _ in range(4)]
        if config == "mlp_fp16_scaler":
            scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 20)
        call = model
    else:
        model, opt = compile_check.build()
        call = compile_check.compile_model(model, config.split("_")[1]) if config != "neox_eager" else model
        g = torch.Generator(device="cuda").manual_seed(1)
        data = [torch.randint(0, compile_check.SIZE["vocab_size"], (8, compile_check.SIZE["seq"]), device="cuda",
                              generator=g) for _ in range(4)]
    run = None
    if watched:
        run = deepseed.init(project="identical", name=config, file=path, handle_signals=False)
        run.watch(call, optimizer=opt, layer_every=1, phase_every=1, grad_norm_every=1, sample_min_ms=0,
                  scaler=scaler)
    losses = []
    for i in range(steps):
        if config.startswith("mlp"):
            x, y = data[i % 4]
            with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
                loss = torch.nn.functional.mse_loss(call(x).float(), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        else:
            ids = data[i % 4]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = call(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())
    torch.cuda.synchronize()
    if run is not None:
        run.finish(timeout=10)
    weights = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    return [float(x) for x in losses], weights


def difference(a, b):
    """Largest absolute difference of losses and weights between two runs."""
    (la, wa), (lb, wb) = a, b
    d = max((abs(x - y) for x, y in zip(la, lb)), default=0.0)
    for k in wa:
        d = max(d, float((wa[k] - wb[k]).abs().max()))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="identical.json")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": a.steps, "configs": {}}
    tmp = tempfile.mkdtemp(prefix="identical-")
    for config in a.configs.split(","):
        try:
            base = train(config, False, a.steps, None)
            control = train(config, False, a.steps, None)
            watched = train(config, True, a.steps, os.path.join(tmp, config + ".ndjson"))
            res = {"control_difference": difference(base, control), "watched_difference": difference(base, watched),
                   "final_loss": base[0][-1]}
            res["reproducible"] = res["control_difference"] == 0.0
            # Identical where the training is reproducible; else no further
            # from it than a second unwatched run is.
            res["ok"] = res["watched_difference"] <= res["control_difference"]
        except Exception as e:  # one broken configuration must not lose the others
            res = {"error": "%s: %s" % (type(e).__name__, str(e)[:600]), "ok": False}
        out["configs"][config] = res
        print(config, json.dumps(res), flush=True)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    ok = all(r.get("ok") for r in out["configs"].values())
    print("%d of %d configurations unchanged by the hook" % (sum(bool(r.get("ok")) for r in out["configs"].values()),
                                                             len(out["configs"])))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
