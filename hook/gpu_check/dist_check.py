"""Two-GPU check of the hook under torch.distributed: GPT-2 small (random
weights, synthetic tokens, bf16 autocast) trained three ways in sequence,
each a run of its own with the hook watching:

    ddp    DistributedDataParallel + AdamW                      ZeRO stage 0
    fsdp   FullyShardedDataParallel FULL_SHARD, blocks wrapped    ZeRO stage 3
    zero1  DistributedDataParallel + ZeroRedundancyOptimizer    ZeRO stage 1

Run without torchrun's environment, the script is its own launcher: it
starts a capture server on 127.0.0.1 (what a DeepSeed server would receive),
the node collector in front of it when its binary is given (the hook then
posts to the collector, which forwards everything with its GPU samples),
then

    torchrun --standalone --nproc_per_node 2 dist_check.py --worker ...

and checks what arrived: both ranks' records for every step, the run meta
(world size, ZeRO stage, framework, parallelism), timings, layer records,
the memory record against each stage, gradient norms against
clip_grad_norm_, bounded exit, and the collector's GPU samples attributed
to the right run and rank by PID.

    python3 hook/gpu_check/dist_check.py --collector .device/deepseed --out dist_check.json
"""

import argparse
import functools
import gc
import glob
import gzip
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.dirname(HERE)
REPO = os.path.dirname(HOOK)
sys.path.insert(0, HOOK)

MODES = ("ddp", "fsdp", "zero1")
WANT = {  # mode: (zero_stage, framework, parallelism)
    "ddp": (0, "torch", "ddp"),
    "fsdp": (3, "fsdp", "fsdp"),
    "zero1": (1, "torch", "ddp"),
}
GPT2_LAYERS = ["wte", "wpe"] + ["h.%d" % i for i in range(12)] + ["lm_head"]
# GPT-2 small with its tied input and output embeddings, counted once.
GPT2_PARAMS = 124439808
# NVLink multicast stays off on shared machines; children inherit these.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run as a torchrun worker (set by the launcher)")
    ap.add_argument("--out", default="dist_check.json", help="results JSON")
    add_capture_args(ap, "", "also write every captured record here (.ndjson.gz)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layer-every", type=int, default=5)
    ap.add_argument("--ref-step", type=int, default=10, help="step whose gradient norm is checked")
    ap.add_argument("--timeout", type=float, default=300, help="seconds torchrun may take")
    ap.add_argument("--side", default="", help="(worker) folder for per-rank facts")
    return ap


# ---------------------------------------------------------------- worker


def build(mode, dev, local, a):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=a.seq, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    cfg._name_or_path = "gpt2 (random init)"
    model = GPT2LMHeadModel(cfg).to(dev)
    model.train()
    api = "ddp"
    if mode == "fsdp":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block})
            model = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                             auto_wrap_policy=policy, device_id=dev)
            api = "FullyShardedDataParallel"
        except ImportError:  # a torch without FSDP1: fully_shard (FSDP2)
            from torch.distributed.fsdp import fully_shard
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            api = "fully_shard"
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    else:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[local], gradient_as_bucket_view=True)
        if mode == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=a.lr,
                                          weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    return model, opt, api


def train_one(mode, dev, local, rank, a):
    import torch
    import deepseed
    from deepseed.torch_utils import fused_grad_norm

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    model, opt, api = build(mode, dev, local, a)
    run = deepseed.init(project="dist-check", name="gpt2-%s" % mode, layer_every=a.layer_every,
                        params={"lr": a.lr, "batch_per_rank": a.batch, "seq": a.seq, "mode": mode},
                        flush_interval=0.2)
    run.watch(model, optimizer=opt)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    data = [torch.randint(0, 50257, (a.batch, a.seq), device=dev, generator=g) for _ in range(4)]
    state_bytes = ref = local_norm = None
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        ids = data[step % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if step == a.ref_step:
            # A global norm computed the framework's way; max_norm this large
            # leaves the gradients as they are.
            local_norm = fused_grad_norm([p for p in model.parameters() if p.requires_grad])
            if api == "FullyShardedDataParallel":
                ref = model.clip_grad_norm_(1e9)
            else:
                ref = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        if step == 3:
            torch.cuda.synchronize(dev)
            state_bytes = torch.cuda.memory_allocated(dev) - base
        opt.zero_grad(set_to_none=True)
        run.log_step(step, loss=loss, lr=opt.param_groups[0]["lr"])
    torch.cuda.synchronize(dev)
    train_s = time.perf_counter() - t0
    tf = time.perf_counter()
    run.finish()
    finish_s = time.perf_counter() - tf
    facts = {
        "mode": mode, "api": api, "rank": rank, "run_id": run.run_id, "pid": os.getpid(), "device": str(dev),
        "train_s": train_s, "finish_s": finish_s, "flush_timeout_s": run.flush_timeout,
        "sender": {"sent": run.sender.sent, "dropped": run.sender.dropped, "rejected": run.sender.rejected},
        "baseline_allocated_bytes": base, "state_bytes_step3": state_bytes,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
        "ref_grad_norm": float(ref.full_tensor() if hasattr(ref, "full_tensor") else ref) if ref is not None else None,
        "local_grad_norm": float(local_norm) if local_norm is not None else None,
        "naive_param_numel": sum(p.numel() for p in model.parameters()),
    }
    del model, opt, run, data, loss, ref, local_norm
    return facts


def worker(a):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    for mode in a.modes.split(","):
        try:
            facts = train_one(mode, dev, local, rank, a)
        except Exception as e:
            import traceback
            traceback.print_exc()
            facts = {"mode": mode, "rank": rank, "error": "%s: %s" % (type(e).__name__, e)}
        with open(os.path.join(a.side, "rank%d_%s.json" % (rank, mode)), "w") as f:
            json.dump(facts, f)
        print("rank %d %s: %s" % (rank, mode, json.dumps(facts)[:300]), flush=True)
        dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(a.side, "rank%d_done.json" % rank), "w") as f:
        json.dump({"time": time.time()}, f)
    return 0


# ---------------------------------------------------------------- launcher


def wait_port(port, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def nvml_lib():
    for pat in ("/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/usr/lib64/libnvidia-ml.so.1", "/usr/local/cuda/lib64/stubs/../libnvidia-ml.so.1"):
        for p in glob.glob(pat):
            return p
    return ""


def start_collector(a, server_url, log_path):
    """Starts `deepseed collect` forwarding to server_url; returns (process,
    argv) or (None, reason)."""
    if not a.collector:
        return None, "no --collector given"
    if not os.access(a.collector, os.X_OK):
        return None, "collector binary %s is not executable" % a.collector
    spool = tempfile.mkdtemp(prefix="deepseed-spool-")
    argv = [a.collector, "collect", "--server", server_url, "--hook-listen", "127.0.0.1:%d" % a.hook_port,
            "--metrics-listen", "127.0.0.1:%d" % a.metrics_port, "--interval", "1s", "--spool-dir", spool]
    lib = nvml_lib()
    if lib:
        argv += ["--nvml-lib", lib]
    log = open(log_path, "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if not wait_port(a.hook_port, 15):
        p.terminate()
        return None, "collector did not listen on %d within 15 s (see its log)" % a.hook_port
    return p, argv


def add_capture_args(ap, records, records_help):
    """The options capture_front() and drain_capture() read: where the
    captured records go, and the collector to run in front of the capture."""
    ap.add_argument("--records", default=records, help=records_help)
    ap.add_argument("--collector", default="", help="deepseed binary: run `collect` in front of the capture server")
    ap.add_argument("--collector-log", default="", help="collector's log file (default: beside --out)")
    ap.add_argument("--hook-port", type=int, default=9464)
    ap.add_argument("--metrics-port", type=int, default=9400)


def capture_front(a, log_name):
    """A capture server (what a DeepSeed server would receive) with the
    collector in front of it when a.collector names its binary. Returns the
    capture, the collector's process (None when not run), its argv (or why
    it did not run) and the URL the hook posts to."""
    from tests.capture import Capture

    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    cap = Capture()
    a.collector_log = a.collector_log or os.path.join(out_dir, log_name)
    col, col_argv = start_collector(a, cap.url, a.collector_log)
    hook_url = "http://127.0.0.1:%d" % a.hook_port if col is not None else cap.url
    return cap, col, col_argv, hook_url


def torchrun_prefix():
    torchrun = shutil.which("torchrun")
    return [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]


def worker_env(hook_url, **extra):
    """The workers' environment: the hook posts to hook_url, never to a
    server named in this shell; NVLink multicast stays off."""
    env = dict(os.environ, DEEPSEED_COLLECTOR_URL=hook_url, PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "4"), **SAFE_ENV)
    env.update(extra)
    env.pop("DEEPSEED_SERVER_URL", None)
    return env


def drain_capture(cap, col, path):
    """Stops the collector once its last records are through, closes the
    capture and returns what it received (also written to path, .ndjson.gz,
    when given) with the collector's exit."""
    # The collector batches for up to a second and samples every second:
    # let the last records and samples through, then stop it (it flushes).
    time.sleep(3.0)
    exit_ = stop(col)
    time.sleep(0.5)
    records = cap.records()
    cap.close()
    if path:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return records, exit_


def stop(p, sig=signal.SIGTERM, wait=15):
    if p is None or p.poll() is not None:
        return p.returncode if p is not None else None
    try:
        os.killpg(p.pid, sig)
    except OSError:
        p.send_signal(sig)
    try:
        return p.wait(wait)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(5)
        return "killed"


def launcher(a):
    from tests.capture import Capture

    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    cap = Capture()
    res = {"config": {k: v for k, v in vars(a).items() if k not in ("worker", "side")}, "checks": {}}
    col_log = a.collector_log or os.path.join(out_dir, "collector.log")
    col, col_argv = start_collector(a, cap.url, col_log)
    if col is not None:
        hook_url = "http://127.0.0.1:%d" % a.hook_port
        res["collector"] = {"argv": col_argv, "log": os.path.basename(col_log)}
    else:
        hook_url = cap.url
        res["collector"] = {"not_run": col_argv}
    print("hook posts to %s; capture server %s; collector: %s" % (hook_url, cap.url, res["collector"]), flush=True)

    side = tempfile.mkdtemp(prefix="dist-check-")
    torchrun = shutil.which("torchrun")
    launch = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmd = launch + ["--standalone", "--nproc_per_node", str(a.nproc), os.path.abspath(__file__), "--worker",
                    "--side", side, "--modes", a.modes, "--steps", str(a.steps), "--batch", str(a.batch),
                    "--seq", str(a.seq), "--layer-every", str(a.layer_every), "--ref-step", str(a.ref_step)]
    env = dict(os.environ, DEEPSEED_COLLECTOR_URL=hook_url, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "4"), **SAFE_ENV)
    env.pop("DEEPSEED_SERVER_URL", None)
    res["torchrun"] = " ".join(cmd)
    print("$ " + res["torchrun"], flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = p.wait(a.timeout)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        stop(p, signal.SIGTERM, 20)
    t_end = time.time()
    res["torchrun_rc"] = rc
    res["torchrun_s"] = round(t_end - t0, 2)
    records, res["collector_exit"] = drain_capture(cap, col, a.records)
    facts = {}
    for path in glob.glob(os.path.join(side, "rank*_*.json")):
        name = os.path.basename(path)[:-5]
        with open(path) as f:
            facts[name] = json.load(f)
    res["worker_facts"] = facts
    analyse(a, res, records, facts, t_end, collector=col is not None)
    res["all_ok"] = all(c["ok"] for c in res["checks"].values())
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if res["all_ok"] else 1


# ---------------------------------------------------------------- checks


def analyse(a, res, records, facts, t_end, collector):
    checks = res["checks"]

    def check(name, ok, detail):
        checks[name] = {"ok": bool(ok), "detail": detail}
        print(("PASS " if ok else "FAIL ") + name + ": " + json.dumps(detail, default=str)[:600], flush=True)

    modes = a.modes.split(",")
    ranks = list(range(a.nproc))
    by_kind = {}
    for r in records:
        by_kind.setdefault(r.get("kind"), []).append(r)

    check("torchrun exited 0 within its time", res["torchrun_rc"] == 0,
          {"rc": res["torchrun_rc"], "seconds": res["torchrun_s"]})
    errors = {k: v["error"] for k, v in facts.items() if "error" in v}
    check("every mode trained on every rank", not errors and all("rank%d_%s" % (r, m) in facts
                                                                  for r in ranks for m in modes), errors)

    run_ids = {}
    summary = res.setdefault("modes", {})
    for m in modes:
        f = [facts.get("rank%d_%s" % (r, m), {}) for r in ranks]
        ids = {x.get("run_id") for x in f}
        run_ids[m] = f[0].get("run_id")
        s = summary.setdefault(m, {})
        check("%s: one run id shared by all ranks" % m, len(ids) == 1 and None not in ids, sorted(map(str, ids)))
        rid = run_ids[m]
        steps = [r for r in by_kind.get("step", []) if r.get("run_id") == rid]
        per_rank = {r: sorted(x["step"] for x in steps if x.get("rank") == r) for r in ranks}
        check("%s: step records from every rank for every step" % m,
              all(per_rank[r] == list(range(1, a.steps + 1)) for r in ranks),
              {r: {"n": len(v), "first": v[:2], "last": v[-2:]} for r, v in per_rank.items()})

        meta = {}
        for r in by_kind.get("run", []):
            if r.get("run_id") == rid:
                meta.update(r.get("meta") or {})
        want = WANT.get(m)
        got = (meta.get("zero_stage"), meta.get("framework"), meta.get("parallelism"))
        check("%s: run meta world_size %d, zero_stage/framework/parallelism %s" % (m, a.nproc, want),
              meta.get("world_size") == a.nproc and got == want and meta.get("params") == GPT2_PARAMS
              and meta.get("precision") == "bf16" and meta.get("seq_len") == a.seq,
              {k: meta.get(k) for k in ("world_size", "zero_stage", "framework", "parallelism", "params", "precision",
                                        "seq_len", "model", "gpu", "offload_optimizer", "offload_params")})

        keys = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")
        bad = [(x["rank"], x["step"]) for x in steps
               if not all(isinstance(x.get(k), (int, float)) and x[k] > 0 for k in keys)]
        check("%s: timings positive on every rank" % m, steps and not bad, {"bad": bad[:10]})
        over = [(x["rank"], x["step"], round(x["forward_ms"] + x["backward_ms"] + x["optimizer_ms"], 3),
                 round(x["step_ms"], 3)) for x in steps if all(k in x for k in keys)
                and x["forward_ms"] + x["backward_ms"] + x["optimizer_ms"] > x["step_ms"] + 1e-3]
        check("%s: forward+backward+optimizer <= step on every rank" % m, steps and not over, {"violations": over[:5]})
        s["median_ms"] = {}
        for r in ranks:
            xs = [x for x in steps if x.get("rank") == r and x["step"] > 5]
            if xs:
                s["median_ms"][r] = {k: round(statistics.median(x[k] for x in xs if k in x), 3)
                                     for k in keys + ("data_ms",) if any(k in x for x in xs)}
                s["median_ms"][r]["throughput_tps"] = round(statistics.median(
                    x.get("throughput_tps", 0) for x in xs), 1)
                s["median_ms"][r]["gpu_mem_peak_gb"] = max(x.get("gpu_mem_peak_gb", 0) for x in xs)
        losses = [x.get("loss") for x in steps]
        check("%s: loss, lr, samples, tokens on every step" % m,
              steps and all(isinstance(v, float) and math.isfinite(v) for v in losses)
              and all(x.get("lr") == 1e-4 and x.get("samples") == a.batch and x.get("tokens") == a.batch * a.seq
                      for x in steps),
              {"last": {k: steps[-1].get(k) for k in ("loss", "lr", "samples", "tokens", "grad_norm", "metrics")}
               if steps else None})

        # Gradient norm at the reference step against clip_grad_norm_.
        ref = [facts.get("rank%d_%s" % (r, m), {}).get("ref_grad_norm") for r in ranks]
        at = {x["rank"]: x for x in steps if x["step"] == a.ref_step}
        gn = [at.get(r, {}).get("grad_norm") for r in ranks]
        shard = [(at.get(r, {}).get("metrics") or {}).get("grad_norm_shard") for r in ranks]
        detail = {"clip_grad_norm_": ref, "hook_grad_norm": gn, "hook_grad_norm_shard": shard,
                  "naive_local_norm": [facts.get("rank%d_%s" % (r, m), {}).get("local_grad_norm") for r in ranks]}
        if m == "fsdp":
            ok = (all(v is None for v in gn) and all(isinstance(v, float) for v in shard) and ref[0]
                  and abs(math.sqrt(sum(v * v for v in shard)) - ref[0]) <= 1e-3 * ref[0])
            detail["sqrt_sum_shard_sq"] = math.sqrt(sum(v * v for v in shard)) if all(
                isinstance(v, float) for v in shard) else None
            name = "%s: no rank-local grad_norm sent; grad_norm_shard combine to clip_grad_norm_" % m
        else:
            ok = all(isinstance(v, float) and r_ and abs(v - r_) <= 1e-3 * r_ for v, r_ in zip(gn, ref))
            name = "%s: grad_norm equals clip_grad_norm_ on every rank" % m
        check(name, ok, detail)

        # Layers.
        layers = [r for r in by_kind.get("layers", []) if r.get("run_id") == rid]
        want_steps = [i for i in range(1, a.steps + 1) if a.layer_every and i % a.layer_every == 0]
        lr_steps = {r: sorted(x["step"] for x in layers if x.get("rank") == r) for r in ranks}
        names_ok = all(x.get("names") == GPT2_LAYERS for x in layers)
        check("%s: layer records every %d steps on every rank, in model order" % (m, a.layer_every),
              all(lr_steps[r] == want_steps for r in ranks) and names_ok,
              {"steps": lr_steps, "names": layers[0]["names"] if layers else None})
        nonpos = {}
        ratios = []
        by_step = {(x["rank"], x["step"]): x for x in steps}
        for x in layers:
            for kind in ("forward_ms", "backward_ms"):
                for name_, v in zip(x["names"], x[kind]):
                    if not (isinstance(v, float) and v > 0):
                        nonpos.setdefault("%s %s" % (name_, kind), []).append((x["rank"], x["step"]))
            st = by_step.get((x["rank"], x["step"]))
            if st and st.get("forward_ms"):
                ratios.append(round(sum(x["forward_ms"]) / st["forward_ms"], 4))
        check("%s: layer forward and backward times positive" % m, layers and not nonpos,
              {k: v[:4] for k, v in nonpos.items()})
        s["layer_forward_sum_over_forward"] = ratios
        if layers:
            x = [y for y in layers if y["rank"] == 0][-1]
            s["layers_rank0_last"] = {"step": x["step"], "forward_ms": [round(v, 3) for v in x["forward_ms"]],
                                      "backward_ms": [round(v, 3) for v in x["backward_ms"]]}

        mem = [r for r in by_kind.get("memory", []) if r.get("run_id") == rid]
        s["memory_record"] = mem[-1] if mem else None
        s["measured_state_bytes_step3"] = [facts.get("rank%d_%s" % (r, m), {}).get("state_bytes_step3")
                                           for r in ranks]
        s["finish_s"] = [facts.get("rank%d_%s" % (r, m), {}).get("finish_s") for r in ranks]
        s["sender"] = [facts.get("rank%d_%s" % (r, m), {}).get("sender") for r in ranks]
        ends = [r for r in by_kind.get("end", []) if r.get("run_id") == rid]
        check("%s: end record finished, nothing dropped or rejected" % m,
              [e.get("status") for e in ends] == ["finished"]
              and all(x and x["dropped"] == 0 and x["rejected"] == 0 for x in s["sender"]),
              {"ends": [e.get("summary") for e in ends], "sender": s["sender"]})

    # Memory records against one another and against what was allocated.
    def total(rec):
        return sum(rec.get(k, 0) for k in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"))

    mem = {m: summary.get(m, {}).get("memory_record") for m in modes}
    if all(mem.values()) and "ddp" in mem:
        d = mem["ddp"]
        n4 = GPT2_PARAMS * 4.0
        expect = {  # fp32 weights under autocast: 4 B parameters, 4 B gradients, 8 B Adam moments
            "ddp": (n4, n4, 2 * n4), "fsdp": (n4 / 2, n4 / 2, n4), "zero1": (n4, n4, n4)}
        got = {m: (r["parameters_bytes"], r["gradients_bytes"], r["optimizer_bytes"]) for m, r in mem.items()}
        ok = all(abs(g - e) <= 1e-6 * e for m in got for g, e in zip(got[m], expect[m]))
        ratio = {m: round(got[m][0] / d["parameters_bytes"], 4) for m in got}
        check("memory records follow the stage (FULL_SHARD parameters half of DDP's, ZeRO-1 optimizer half)", ok,
              {"predicted_gb": {m: [round(v / 1e9, 4) for v in got[m]] for m in got},
               "fsdp_params_over_ddp": ratio.get("fsdp")})
        meas = {}
        for m in modes:
            ms = [v for v in summary[m]["measured_state_bytes_step3"] if v]
            if ms:
                meas[m] = {"measured_gb": [round(v / 1e9, 4) for v in ms], "predicted_gb": round(total(mem[m]) / 1e9, 4),
                           "ratio": [round(v / total(mem[m]), 3) for v in ms]}
        res["memory_measured_vs_predicted"] = meas
        check("allocated model state within 15% of the memory record (info: after step 3, per rank)",
              meas and all(0.85 <= r <= 1.15 for v in meas.values() for r in v["ratio"]), meas)
    else:
        check("memory records follow the stage (FULL_SHARD parameters half of DDP's, ZeRO-1 optimizer half)", False,
              {"memory_records": mem})

    base = {m: [facts.get("rank%d_%s" % (r, m), {}).get("baseline_allocated_bytes") for r in ranks] for m in modes}
    check("a finished run frees its model (allocated before each mode < 64 MB)",
          all(v is not None and v < 64e6 for vs in base.values() for v in vs), base)

    fin = {m: summary.get(m, {}).get("finish_s") for m in modes}
    bound = max([facts.get(k, {}).get("flush_timeout_s") or 5 for k in facts] or [5]) + 1
    done = [facts.get("rank%d_done" % r, {}).get("time") for r in ranks]
    check("finish within its bound and workers exit at once",
          all(v is not None and v <= bound for vs in fin.values() for v in (vs or [None]))
          and all(done) and t_end - max(done) < 30,
          {"finish_s": fin, "bound_s": bound, "exit_after_done_s": round(t_end - max(done), 2) if all(done) else None})

    # The collector's GPU samples, attributed by PID.
    gpus = by_kind.get("gpu", [])
    pid_rank = {}
    for k, v in facts.items():
        if "pid" in v:
            pid_rank[v["pid"]] = v["rank"]
    ours = {rid: m for m, rid in run_ids.items() if rid}
    counts = {}
    wrong = []
    seen = {}
    for g in gpus:
        idx = g.get("gpu")
        procs = [p.get("pid") for p in g.get("processes") or []]
        for pid in procs:
            if pid in pid_rank:
                seen.setdefault(idx, set()).add(pid_rank[pid])
        rid = g.get("run_id")
        if rid in ours:
            counts["%s/gpu%s" % (ours[rid], idx)] = counts.get("%s/gpu%s" % (ours[rid], idx), 0) + 1
            owners = sorted({pid_rank[p] for p in procs if p in pid_rank})
            if g.get("rank") != idx or owners != [idx]:
                wrong.append({"gpu": idx, "rank": g.get("rank"), "ranks_of_processes": owners, "time": g.get("time")})
    res["collector_gpu"] = {"gpu_records": len(gpus), "attributed": counts,
                            "worker_ranks_seen_per_gpu": {str(k): sorted(v) for k, v in seen.items()},
                            "sample": gpus[len(gpus) // 2] if gpus else None}
    if collector:
        per_gpu = {i: sum(1 for g in gpus if g.get("gpu") == i) for i in ranks}
        check("collector: GPU samples of every GPU forwarded", all(per_gpu.values()), per_gpu)
        check("collector: GPU i's samples carry run_id and rank i of the process on it",
              counts and not wrong and all(any(k.endswith("/gpu%d" % i) for k in counts) for i in ranks),
              {"attributed": counts, "wrong": wrong[:5]})
        check("collector: every run attributed on every GPU",
              all(counts.get("%s/gpu%d" % (m, i), 0) > 0 for m in modes for i in ranks), counts)
        host = by_kind.get("host", [])
        hp = [p for h in host for p in h.get("processes") or [] if p.get("run_id") in ours]
        res["collector_host"] = {"host_records": len(host), "attributed_process_samples": len(hp),
                                 "sample": hp[len(hp) // 2] if hp else None}


def main():
    a = args_parser().parse_args()
    a.lr = 1e-4
    if a.worker:
        return worker(a)
    if os.environ.get("LOCAL_RANK") is not None:
        print("dist_check: started by a launcher without --worker; run it plainly, it launches torchrun itself",
              file=sys.stderr)
        return 2
    for k, v in SAFE_ENV.items():
        os.environ[k] = v
    return launcher(a)


if __name__ == "__main__":
    sys.exit(main())
