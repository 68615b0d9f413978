"""The comparison report's DeepSpeed configurations, run for real on two
GPUs with the hook watching every rank through the node collector.

The report (pythia-160m and pythia-410m under DeepSpeed) compares ZeRO
stages, precisions, pipeline against data parallelism, CPU offload, and a
larger model with ZeRO-3, offload and bf16. Each configuration below is a
run of its own, trained by `torchrun --nproc_per_node 2` with DeepSpeed's
engine, the model built from scratch in the Pythia shapes (GPT-NeoX blocks:
parallel attention and MLP, pre-norm; learned positions instead of rotary
ones, so that one module list serves the data-parallel engine and
DeepSpeed's PipelineModule alike):

    pythia-160m shape  12 layers, width 768, 12 heads, vocab 50,304 (162 M)
    pythia-410m shape  24 layers, width 1,024, 16 heads                (405 M)

Every run sees 16 sequences of 512 tokens per step: data parallel as 8 per
GPU, pipeline as 4 micro-batches of 4 through two stages. Optimizer: torch's
AdamW (with offload it runs on the CPU: `zero_force_ds_cpu_optimizer` off,
where the report's runs used DeepSpeed's compiled CPU Adam); scheduler
WarmupDecayLR over the run's steps, so the run's total steps are known.

Not every row of the report can run as written: DeepSpeed's pipeline engine
refuses ZeRO-2 and ZeRO-3 ("ZeRO-2 and ZeRO-3 are incompatible with
pipeline parallelism"), and a `pipeline` section in the config of a model
that is not a PipelineModule is ignored, so the report's "ZeRO 3 + pipeline"
rows ran as ZeRO-3 data parallel. Here the pipeline rows are real 2-stage
pipelines at ZeRO-1.

Device side (records to a file; no database needed):

    PYTHONPATH=<deepspeed source>:<pydantic 1.10>:<hjson> \\
    python3 hook/gpu_check/report_check.py --collector ./deepseed \\
        --records $OUT/report_records.ndjson.gz --out $OUT/report_check.json

Then import the records into a DeepSeed server (`deepseed import`) and ask
`GET /api/v1/compare` for the tables (docs/compare.md).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.dirname(HERE)
sys.path.insert(0, HOOK)
sys.path.insert(0, HERE)

from dist_check import add_capture_args  # noqa: E402

SHAPES = {  # name: (layers, width, heads)
    "160m": (12, 768, 12),
    "410m": (24, 1024, 16),
}
VOCAB = 50304

# name: (shape, ZeRO stage, precision, offload, pipeline stages, steps)
CONFIGS = {
    "z1-fp16": ("160m", 1, "fp16", False, 0, 80),
    "z2-fp16": ("160m", 2, "fp16", False, 0, 80),
    "z3-fp16": ("160m", 3, "fp16", False, 0, 80),
    "z1-fp32": ("160m", 1, "fp32", False, 0, 80),
    "z1-bf16": ("160m", 1, "bf16", False, 0, 80),
    "pipe2-z1-fp16": ("160m", 1, "fp16", False, 2, 80),
    "z3-fp16-offload": ("160m", 3, "fp16", True, 0, 20),
    "410m-z3-offload-bf16": ("410m", 3, "bf16", True, 0, 12),
    "410m-pipe2-z1-offload-bf16": ("410m", 1, "bf16", True, 2, 12),
}
# The report's five tables, by the configurations above.
TABLES = {
    "1 ZeRO stage (fp16)": ["z1-fp16", "z2-fp16", "z3-fp16"],
    "2 precision (ZeRO-1)": ["z1-fp32", "z1-fp16", "z1-bf16"],
    "3 pipeline vs data parallel (ZeRO-1, fp16)": ["pipe2-z1-fp16", "z1-fp16"],
    "4 CPU offload vs none (ZeRO-3, fp16)": ["z3-fp16-offload", "z3-fp16"],
    "5 pythia-410m shape, ZeRO-3 + offload + bf16": ["410m-z3-offload-bf16", "410m-pipe2-z1-offload-bf16"],
}
SEQ = 512
GLOBAL_BATCH = 16


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default="", help="(set by the launcher) the configuration this torchrun trains")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="configurations to run, in order")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="multiply every configuration's steps")
    ap.add_argument("--out", default="report_check.json", help="results JSON")
    add_capture_args(ap, "report_records.ndjson.gz", "captured records (.ndjson.gz)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180, help="seconds one configuration may take")
    ap.add_argument("--budget", type=float, default=480, help="seconds for all; later configurations are skipped")
    ap.add_argument("--steps", type=int, default=0, help="(worker) steps")
    return ap


# ---------------------------------------------------------------- model


def build_layers(shape):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    n_layer, d, h = SHAPES[shape]

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, d)
            self.pos = nn.Embedding(SEQ, d)

        def forward(self, ids):
            t = ids.shape[1]
            return self.tok(ids) + self.pos(torch.arange(t, device=ids.device))

    class Block(nn.Module):
        """GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))."""

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            return x + self.proj(a) + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.out = nn.Linear(d, VOCAB, bias=False)

        def forward(self, x):
            return self.out(self.ln(x))

    return [Embed()] + [Block() for _ in range(n_layer)] + [Head()]


def lm_loss(logits, labels):
    import torch.nn.functional as F
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def ds_config(name, steps, dp):
    shape, stage, prec, offload, pipe, _ = CONFIGS[name]
    micro = 4 if pipe else GLOBAL_BATCH // dp
    accum = GLOBAL_BATCH // (micro * dp)
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * dp,
        "gradient_clipping": 1.0,
        "steps_per_print": 10 ** 9,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-4, "warmup_num_steps": 5,
                                 "total_num_steps": steps}},
    }
    if prec == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    elif prec == "bf16":
        cfg["bf16"] = {"enabled": True}
    if pipe:
        cfg["pipeline"] = {"stages": pipe}
    return cfg


# ---------------------------------------------------------------- worker


def worker(a):
    import torch
    import deepspeed
    import deepseed

    name = a.worker
    shape, stage, prec, offload, pipe, _ = CONFIGS[name]
    deepspeed.init_distributed(dist_backend="nccl")
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    layers = build_layers(shape)
    dp = world // pipe if pipe else world
    cfg = ds_config(name, a.steps, dp)
    opt_params = None
    if pipe:
        from deepspeed.pipe import PipelineModule
        model = PipelineModule(layers=layers, loss_fn=lm_loss, num_stages=pipe, partition_method="parameters")
    else:
        model = torch.nn.Sequential(*layers)
    opt_params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(opt_params, lr=3e-4, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    run = deepseed.init(project="report-check", name=name, config=cfg,
                        params={"shape": "pythia-%s" % shape, "zero_stage": stage, "precision": prec,
                                "offload": offload, "pipeline_stages": pipe, "seq": SEQ,
                                "global_batch": GLOBAL_BATCH},
                        flush_interval=0.5)
    run.watch(engine)
    g = torch.Generator(device=dev).manual_seed(1000 + (0 if pipe else rank))
    mb = cfg["train_micro_batch_size_per_gpu"]
    data = [torch.randint(0, VOCAB, (mb, SEQ + 1), device=dev, generator=g) for _ in range(8)]
    t0 = time.perf_counter()
    losses = []
    if pipe:
        def batches():
            i = 0
            while True:
                x = data[i % len(data)]
                i += 1
                yield x[:, :-1].contiguous(), x[:, 1:].contiguous()

        it = batches()
        for _ in range(a.steps):
            losses.append(engine.train_batch(data_iter=it))
    else:
        for step in range(1, a.steps + 1):
            x = data[step % len(data)]
            logits = engine(x[:, :-1])
            loss = lm_loss(logits, x[:, 1:])
            engine.backward(loss)
            engine.step()
            run.log_step(step, loss=loss)
            losses.append(loss.detach())
    torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    vals = [float(v) for v in losses if v is not None]
    run.finish()
    print("rank %d %s: %d steps in %.1f s, loss %.3f -> %.3f, peak alloc %.0f MB, skipped %s" % (
        rank, name, a.steps, wall, vals[0] if vals else float("nan"), vals[-1] if vals else float("nan"),
        torch.cuda.max_memory_allocated(dev) / 1e6, getattr(engine, "skipped_steps", None)), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


# ---------------------------------------------------------------- launcher


def med(v):
    v = [x for x in v if isinstance(x, (int, float))]
    return round(statistics.median(v), 3) if v else None


def summarise(records):
    runs = {}
    for r in records:
        if r.get("kind") == "run":
            runs.setdefault(r["run_id"], {"name": r.get("name"), "meta": r.get("meta") or {}})
    out = {}
    for rid, info in runs.items():
        steps = [r for r in records if r.get("kind") == "step" and r.get("run_id") == rid]
        ranks = sorted({r.get("rank", 0) for r in steps})
        gpu = [r for r in records if r.get("kind") == "gpu" and r.get("run_id") == rid]
        m = info["meta"]
        # Consecutive steps of a rank should be as far apart in time as a
        # step takes: records carry their step's end, not their read-back.
        gaps = []
        for k in ranks:
            ts = sorted((s["step"], s["time"]) for s in steps if s.get("rank", 0) == k and "time" in s)
            gaps += [(b[1] - a[1]) * 1000 for a, b in zip(ts, ts[1:])]
        out[info["name"]] = {
            "median_time_gap_ms": med(gaps),
            "run_id": rid, "ranks": ranks, "steps_per_rank": {k: sum(1 for s in steps if s.get("rank", 0) == k)
                                                             for k in ranks},
            "meta": {k: m.get(k) for k in ("framework", "zero_stage", "precision", "parallelism", "pipeline_stages",
                                           "offload_optimizer", "offload_params", "micro_batch", "grad_accum",
                                           "world_size", "total_steps") if k in m},
            "median_step_ms": med([s.get("step_ms") for s in steps]),
            "loss_last": next((s.get("loss") for s in reversed(steps) if s.get("loss") is not None), None),
            "stages": sorted({(s.get("metrics") or {}).get("pipeline_stage") for s in steps} - {None}),
            "gpu_samples": len(gpu),
        }
    return out


def launcher(a):
    from dist_check import capture_front, drain_capture, stop, torchrun_prefix, worker_env

    cap, col, col_argv, hook_url = capture_front(a, "report_collector.log")
    res = {"config": {k: v for k, v in vars(a).items() if k != "worker"}, "collector": col_argv, "runs": {},
           "tables": TABLES}
    launch = torchrun_prefix()
    env = worker_env(hook_url, DS_ACCELERATOR="cuda")
    start = time.monotonic()
    for name in [c for c in a.configs.split(",") if c]:
        if name not in CONFIGS:
            res["runs"][name] = {"error": "unknown configuration"}
            continue
        left = a.budget - (time.monotonic() - start)
        if left < 30:
            res["runs"][name] = {"skipped": "budget spent"}
            continue
        steps = max(4, int(CONFIGS[name][5] * a.steps_scale))
        cmd = launch + ["--standalone", "--nproc_per_node", str(a.nproc), os.path.abspath(__file__),
                        "--worker", name, "--steps", str(steps)]
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = p.wait(min(a.timeout, left))
        except subprocess.TimeoutExpired:
            rc = "timeout"
            stop(p, signal.SIGTERM, 20)
        res["runs"][name] = {"torchrun_rc": rc, "torchrun_s": round(time.time() - t0, 2), "steps": steps}
        print("%s: rc %s in %.1f s" % (name, rc, time.time() - t0), flush=True)
        time.sleep(1.5)  # let a fast sample or two of the idle GPUs fall after the run
    records, res["collector_exit"] = drain_capture(cap, col, a.records)
    res["records"] = len(records)
    res["summary"] = summarise(records)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res["summary"], indent=1), flush=True)
    return 0 if all(r.get("torchrun_rc") == 0 for r in res["runs"].values()) else 1


def main():
    a = args_parser().parse_args()
    if a.worker:
        return worker(a)
    return launcher(a)


if __name__ == "__main__":
    sys.exit(main())
