"""Communication and straggler check on two GPUs: DDP, FSDP2 (fully_shard
per block) and FSDP1, with a straggler planted on rank 1 and a control,
each rank's hook posting through a real collector; the hook's comm_ms is
checked against torch.profiler's NCCL kernel spans, and a last run stops
rank 1 inside a collective for the hang forensics.

Runs, one after another in one process group (a transformer of 12 blocks,
width 1024, random weights, synthetic tokens):

    ddp-gpu       DDP, bf16 autocast; ~30 ms of extra GPU work queued on
                  rank 1 before every backward (a slow GPU)
    ddp-control   the same, nothing planted
    fsdp2-gpu     fully_shard per block and on the root, bf16 parameters,
                  fp32 reduction; ~30 ms of extra GPU work on rank 1
    fsdp2-host    the same with 30 ms of host sleep on rank 1 instead
    fsdp2-control nothing planted
    fsdp1-gpu     FullyShardedDataParallel, blocks wrapped, ~30 ms of GPU work
    zero3-gpu     (--runs, with --deepspeed-path) DeepSpeed ZeRO-3, bf16,
                  overlap_comm, ~30 ms of GPU work on rank 1
    zero3-control the same, nothing planted, with DeepSpeed's own timers on
                  (wall_clock_breakdown) to compare with
    hang          (--hang) DDP; at step 20 rank 1 enters an all-reduce of a
                  second process group that rank 0 never joins and waits
                  for its result; the launcher sends SIGTERM after
                  --hang-wait seconds

Steps 30-39 of every run are also recorded by torch.profiler on each rank;
the union of its NCCL kernels' spans is compared with the sum of the hook's
comm_ms over the same steps, and the hook's spans by collective and waits
by phase are put beside the profiler's kernels by name.

Device side (results/comm_check_h200x2.json came from the first line,
results/comm_check_gpubound_h200x2.json from the second,
results/comm_check_zero3_h200x2.json from the third, where DeepSpeed's
backend starts before any model is watched):

    python3 hook/gpu_check/comm_check.py --hang --collector .device/deepseed --out $OUT/comm_check.json \\
        --records $OUT/comm_records.ndjson.gz
    python3 hook/gpu_check/comm_check.py --runs fsdp2-control,fsdp2-gpu,zero3-control,zero3-gpu --seq 1024 \\
        --deepspeed-path .device/ds --deepspeed-deps .device/pylib --collector .device/deepseed ...
    python3 hook/gpu_check/comm_check.py --runs zero3-control,zero3-gpu,fsdp2-gpu,ddp-control --seq 1024 \\
        --deepspeed-path .device/ds --deepspeed-deps .device/pylib --collector .device/deepseed ...

After the code was restructured into tables (one metric table, detectors,
query types) and the hook's watcher into parts,
results/comm_check_restructured_h200x2.json came from

    python3 hook/gpu_check/comm_check.py --runs ddp-control,fsdp2-control,fsdp2-gpu --seq 1024 ...

and results/comm_check_restructured_seq512_h200x2.json from
--runs ddp-control,ddp-gpu,fsdp2-gpu,fsdp2-control --hang at the default
--seq 512, where FSDP2's steps are bound by the host and its control shows
rank 1 late (as the first run above showed rank 0): the builds before and
after the restructuring read the same alerts and ranks from those records.

DeepSpeed is not installed on the GPU machine: --deepspeed-path is a folder
holding the source of a release (deepspeed/, its op_builder and accelerator
copied in place of their links), --deepspeed-deps one with the pure-Python
packages it imports that the machine lacks (pydantic 1.10, py-cpuinfo, and
an hjson module giving json's load/loads: the config goes as a dict).

Server side (a running `deepseed serve`):

    python3 hook/gpu_check/comm_check.py --verify comm_records.ndjson.gz --deepseed ./deepseed \\
        --server http://127.0.0.1:8080 --out comm_verify.json
"""

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.dirname(HERE)
sys.path.insert(0, HOOK)
sys.path.insert(0, HERE)

from dist_check import add_capture_args  # noqa: E402

RUNS = ("ddp-gpu", "ddp-control", "fsdp2-gpu", "fsdp2-host", "fsdp2-control", "fsdp1-gpu")
PLANTED = {"ddp-gpu": "gpu", "fsdp2-gpu": "gpu", "fsdp2-host": "host", "fsdp1-gpu": "gpu", "zero3-gpu": "gpu"}
# DeepSpeed is not installed on the GPU machine: --deepspeed-path names a
# folder holding its source (deepspeed/), and packages it imports that the
# machine lacks go after the machine's own on sys.path.
PROFILE = (30, 40)  # steps [30, 40)


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="comm_check.json")
    add_capture_args(ap, "comm_records.ndjson.gz", "captured records (.ndjson.gz)")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--plant-ms", type=float, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hang", action="store_true", help="also run the hang scenario")
    ap.add_argument("--hang-wait", type=float, default=25, help="seconds of hang before SIGTERM")
    ap.add_argument("--facts", default="", help="(worker) folder for each rank's facts")
    ap.add_argument("--deepspeed-path", default="", help="folder with DeepSpeed's source, for the zero3 runs")
    ap.add_argument("--deepspeed-deps", default="", help="folder of packages DeepSpeed imports, searched last")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--verify", default="", help="records file to import into --server and check")
    ap.add_argument("--deepseed", default="deepseed")
    ap.add_argument("--server", default="http://127.0.0.1:8080")
    ap.add_argument("--wait", type=float, default=60)
    return ap


# ---------------------------------------------------------------- worker


def model_of(kind, dev):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32000, 1024)
            self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
                                        for _ in range(12))
            self.head = nn.Linear(1024, 32000)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return nn.functional.cross_entropy(self.head(x).flatten(0, 1).float(), ids.flatten())

    torch.manual_seed(0)
    net = Net().to(dev)
    if kind == "zero3":
        return net, False
    if kind == "ddp" or kind == "hang":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(net), True
    if kind == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in net.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(net, mp_policy=mp)
        return net, False
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return FullyShardedDataParallel(net, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}),
                                    mixed_precision=mp, device_id=dev), False


def gpu_work(dev, ms):
    """A function queueing about ms of matmuls on the current stream."""
    import torch
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for _ in range(10):  # cuBLAS's first call sets it up
        a @ a
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(50):
        a @ a
    t1.record()
    t1.synchronize()
    per = t0.elapsed_time(t1) / 50
    n = max(1, int(round(ms / per)))

    def work():
        for _ in range(n):
            a @ a
    return work, n, per


def nccl_spans(prof):
    """(union, sum) of the NCCL kernels' spans in ms, their count, and
    {kernel name: [count, ms]}."""
    iv, by = {}, {}
    for e in prof.events():
        for k in ([e] + list(getattr(e, "kernels", []) or [])):
            name = getattr(k, "name", "") or ""
            tr = getattr(k, "time_range", None)
            if "nccl" in name.lower() and tr is not None and str(getattr(k, "device_type", "")).endswith("CUDA"):
                iv[(tr.start / 1000.0, tr.end / 1000.0)] = name.split("(")[0][:60]
    for (a, b), name in iv.items():
        d = by.setdefault(name, [0, 0.0])
        d[0] += 1
        d[1] = round(d[1] + b - a, 3)
    from deepseed.comm import union_ms
    return union_ms(list(iv)), sum(b - a for a, b in iv), len(iv), by


def tally_spans(watcher, lo, hi, into):
    """Adds up, over steps lo..hi-1, the hook's timed collectives by name and
    the compute stream's waits by phase (forward, backward, other), as they
    are read back: {"coll": {name: [count, ms]}, "waits": {phase: [count, ms]}}."""
    probe = getattr(watcher, "comm", None)
    if probe is None:
        return
    fill = probe.fill

    def add(kind, key, ms):
        d = into.setdefault(kind, {}).setdefault(key, [0, 0.0])
        d[0] += 1
        d[1] = round(d[1] + ms, 3)

    def tallied(slot, rec, sync):
        s = slot.comm
        if s is not None and lo <= slot.step < hi:
            for e0, e1, name in s.coll:
                if e1.query():
                    add("coll", name, max(0.0, e0.elapsed_time(e1)))
            for ph, e0, e1 in s.waits:
                if e1.query():
                    add("waits", ph, max(0.0, e0.elapsed_time(e1)))
        return fill(slot, rec, sync)
    probe.fill = tallied


def one_run(name, dev, rank, a, facts):
    import torch
    import deepseed

    kind = name.split("-")[0]
    model, autocast = model_of(kind, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine = None
    if kind == "zero3":
        import deepspeed
        cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
               "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True},
               "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
               # The control also runs DeepSpeed's own timers, to compare.
               "wall_clock_breakdown": name.endswith("control")}
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    plant = PLANTED.get(name) if rank == 1 else None
    work, n, per = gpu_work(dev, a.plant_ms)
    run = deepseed.init(project="comm-check", name=name, layer_every=0, flush_interval=0.2,
                        params={"planted": PLANTED.get(name, "none"), "plant_ms": a.plant_ms})
    if engine is not None:
        w = run.watch(engine)
    else:
        w = run.watch(model, optimizer=opt)
    spans = {}
    tally_spans(w, PROFILE[0], PROFILE[1], spans)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    data = [torch.randint(0, 32000, (a.batch, a.seq), generator=g, device=dev) for _ in range(4)]
    prof = None
    out = {"rank": rank, "run_id": run.run_id, "plant": plant, "gpu_work_matmuls": n, "matmul_ms": round(per, 3)}
    for step in range(1, a.steps + 1):
        if step == PROFILE[0]:
            torch.cuda.synchronize(dev)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        ids = data[step % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = (engine if engine is not None else model)(ids)
        if plant == "gpu":
            work()
        elif plant == "host":
            time.sleep(a.plant_ms / 1000)
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        run.log_step(step)
        if step == PROFILE[1] - 1:
            torch.cuda.synchronize(dev)
            prof.__exit__(None, None, None)
            (out["profiler_nccl_union_ms"], out["profiler_nccl_sum_ms"], out["profiler_nccl_kernels"],
             out["profiler_nccl_by_kernel"]) = nccl_spans(prof)
    torch.cuda.synchronize(dev)
    run.finish()
    out["hook_spans_profiled"] = spans
    facts[name] = out


def hang_run(dev, rank, a, facts):
    import torch
    import torch.distributed as dist
    import deepseed

    side = dist.new_group([0, 1])
    t = torch.ones(1, device=dev)
    dist.all_reduce(t, group=side)  # the side group's communicator exists on both ranks
    torch.cuda.synchronize(dev)
    model, _ = model_of("hang", dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = deepseed.init(project="comm-check", name="hang", layer_every=0, flush_interval=0.2)
    run.watch(model, optimizer=opt)
    facts["hang"] = {"rank": rank, "run_id": run.run_id}
    ids = torch.randint(0, 32000, (a.batch, a.seq), device=dev)
    for step in range(1, 100000):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids)
        if rank == 1 and step == 20:
            x = torch.ones(1, device=dev)
            dist.all_reduce(x, group=side)  # rank 0 never joins
            x.item()  # waits for it: the host stops here
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.log_step(step)
        if step % 5 == 0:
            loss.item()  # rank 0 keeps pace with its device, as a loop logging its loss does


def worker(a):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=dev)
    rank = dist.get_rank()
    facts = {}
    path = os.path.join(a.facts, "rank%d.json" % rank)
    for name in a.runs.split(","):
        if not name:
            continue
        if name.startswith("zero3"):
            try:
                if a.deepspeed_path:
                    sys.path.insert(0, a.deepspeed_path)
                if a.deepspeed_deps:
                    sys.path.append(a.deepspeed_deps)
                os.environ.setdefault("DS_BUILD_OPS", "0")
                import deepspeed  # noqa: F401
            except Exception as e:  # the same on every rank: both skip
                facts[name] = {"rank": rank, "skipped": "import deepspeed: %r" % e}
                continue
        one_run(name, dev, rank, a, facts)
        with open(path, "w") as f:
            json.dump(facts, f)
        dist.barrier()
    if a.hang:
        with open(path, "w") as f:
            json.dump(dict(facts, hang={"rank": rank, "started": True}), f)
        hang_run(dev, rank, a, facts)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- launcher


def med(v):
    v = [x for x in v if x is not None]
    return round(statistics.median(v), 3) if v else None


def figures(records, run_id):
    """Per-rank medians over steps 11 on, the lateness by waits (the step's
    longest wait less the rank's own), and the sums over the profiled steps."""
    by_step = {}
    for r in records:
        if r.get("kind") == "step" and r.get("run_id") == run_id:
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    keys = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "comm_exposed_ms", "sync_wait_ms",
            "data_ms")
    cols = {}
    prof = {}
    for s, m in sorted(by_step.items()):
        if len(m) < 2:
            continue
        waits = [x.get("sync_wait_ms") for x in m.values()]
        top = max(w for w in waits if w is not None) if any(w is not None for w in waits) else None
        for rk, x in m.items():
            if PROFILE[0] <= s < PROFILE[1]:
                p = prof.setdefault(rk, {"comm_ms": 0.0, "steps": 0})
                p["comm_ms"] += x.get("comm_ms") or 0.0
                p["steps"] += 1
            if s <= 10:
                continue
            c = cols.setdefault(rk, {k: [] for k in keys + ("lateness_ms", "has_sync_ns")})
            for k in keys:
                c[k].append(x.get(k))
            w = x.get("sync_wait_ms")
            c["lateness_ms"].append(top - w if top is not None and w is not None else None)
            c["has_sync_ns"].append(1.0 if "sync_ns" in x else 0.0)
    out = {}
    for rk, c in sorted(cols.items()):
        out[str(rk)] = {k: med(v) for k, v in c.items()}
        out[str(rk)]["steps"] = len(c["step_ms"])
        out[str(rk)]["profiled"] = prof.get(rk)
    return out


def launcher(a):
    from dist_check import capture_front, drain_capture, stop, torchrun_prefix, worker_env

    cap, col, col_argv, hook_url = capture_front(a, "comm_collector.log")
    facts_dir = tempfile.mkdtemp(prefix="comm-facts-")
    res = {"config": {k: v for k, v in vars(a).items() if k != "worker"}, "collector": col_argv}
    cmd = torchrun_prefix() + ["--standalone", "--nproc_per_node", "2", os.path.abspath(__file__), "--worker",
                               "--runs", a.runs, "--steps", str(a.steps), "--plant-ms", str(a.plant_ms),
                               "--batch", str(a.batch), "--seq", str(a.seq), "--facts", facts_dir]
    if a.hang:
        cmd.append("--hang")
    if a.deepspeed_path:
        cmd += ["--deepspeed-path", os.path.abspath(a.deepspeed_path)]
    if a.deepspeed_deps:
        cmd += ["--deepspeed-deps", os.path.abspath(a.deepspeed_deps)]
    # The hang's watchdog fires well before NCCL's own timeout.
    env = worker_env(hook_url, DEEPSEED_HANG_S=os.environ.get("DEEPSEED_HANG_S", "8"))
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    rc = None
    if a.hang:
        # Wait for the hang run to start, let it stall, then stop it as a
        # launcher's timeout would.
        end = time.time() + a.timeout
        while time.time() < end and p.poll() is None:
            started = []
            for f in glob.glob(os.path.join(facts_dir, "rank*.json")):
                try:
                    started.append(json.load(open(f)).get("hang", {}).get("started"))
                except (OSError, ValueError):
                    pass
            if len(started) == 2 and all(started):
                break
            time.sleep(1)
        time.sleep(a.hang_wait)
        res["hang_sigterm_at_s"] = round(time.time() - t0, 1)
        rc = stop(p, signal.SIGTERM, 30)
    else:
        try:
            rc = p.wait(a.timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            stop(p, signal.SIGTERM, 20)
    res["torchrun_rc"], res["torchrun_s"] = rc, round(time.time() - t0, 2)
    records, res["collector_exit"] = drain_capture(cap, col, a.records)
    facts = {}
    for f in glob.glob(os.path.join(facts_dir, "rank*.json")):
        for name, v in json.load(open(f)).items():
            facts.setdefault(name, {})[str(v.get("rank"))] = v
    names = {}
    for r in records:
        if r.get("kind") == "run":
            names[r["run_id"]] = r.get("name")
    res["runs"] = {}
    checks = []
    for rid, name in sorted(names.items(), key=lambda x: x[1] or ""):
        fig = figures(records, rid)
        for rk, v in fig.items():
            fv = facts.get(name, {}).get(rk, {})
            v["profiler_nccl_union_ms"] = fv.get("profiler_nccl_union_ms")
            v["profiler_nccl_sum_ms"] = fv.get("profiler_nccl_sum_ms")
            v["gpu_work_matmuls"] = fv.get("gpu_work_matmuls")
            v["profiler_nccl_by_kernel"] = fv.get("profiler_nccl_by_kernel")
            v["hook_spans_profiled"] = fv.get("hook_spans_profiled")
            ds = [r.get("metrics", {}).get("deepspeed_comm_ms") for r in records if r.get("kind") == "step"
                  and r.get("run_id") == rid and str(r.get("rank")) == rk and PROFILE[0] <= r.get("step", 0) < PROFILE[1]]
            ds = [x for x in ds if x is not None]
            if ds:
                v["deepspeed_timer_comm_ms_profiled"] = round(sum(ds), 3)
        res["runs"][name] = {"run_id": rid, "ranks": fig}
        if name == "hang" or len(fig) < 2:
            continue
        planted = PLANTED.get(name)
        l0, l1 = fig["0"]["lateness_ms"], fig["1"]["lateness_ms"]
        if planted:
            checks.append(("%s: rank 1 late by > half the planted %g ms" % (name, a.plant_ms),
                           l1 is not None and l1 > a.plant_ms / 2 and (l0 or 0) < a.plant_ms / 4, (l0, l1)))
        else:
            checks.append(("%s: nobody late by > 5 ms" % name, max(l0 or 0, l1 or 0) < 5, (l0, l1)))
        for rk, v in fig.items():
            pr, un = v.get("profiled"), v.get("profiler_nccl_union_ms")
            if pr and un:
                ratio = pr["comm_ms"] / un
                checks.append(("%s rank %s: comm_ms over steps 30-39 within 10%% of the profiler's NCCL spans" % (
                    name, rk), 0.9 <= ratio <= 1.1, (round(pr["comm_ms"], 2), round(un, 2), round(ratio, 3))))
            checks.append(("%s rank %s: comm_exposed_ms <= step_ms" % (name, rk),
                           v["comm_exposed_ms"] is not None and v["comm_exposed_ms"] <= v["step_ms"],
                           (v["comm_exposed_ms"], v["step_ms"])))
    if a.hang:
        hang_events = [r for r in records if r.get("kind") == "event" and r.get("type") == "hang"]
        res["hang_events"] = hang_events
        ranks = sorted({e.get("rank") for e in hang_events})
        checks.append(("hang: a hang event from each rank", ranks == [0, 1], ranks))
        texts = []
        for e in hang_events:
            try:
                texts.append(json.loads(e.get("text") or "{}"))
            except ValueError:
                pass
        res["hang_summary"] = [{k: t.get(k) for k in ("rank", "reason", "step", "in_step", "stalled_s",
                                                       "last_collective")} for t in texts]
        stalled1 = [t for t in texts if t.get("rank") == 1 and t.get("reason") == "stalled"]
        checks.append(("hang: rank 1 reported its stall inside an uncompleted collective at step 20", bool(stalled1) and all(
            t.get("step") == 20 and (t.get("last_collective") or {}).get("completed") is False for t in stalled1),
            res["hang_summary"]))
        checks.append(("hang: both ranks reported SIGTERM", sorted(t.get("rank") for t in texts
                                                                   if t.get("reason") == "SIGTERM") == [0, 1],
                       [(t.get("rank"), t.get("reason")) for t in texts]))
        for t in texts:
            if t.get("threads"):
                res.setdefault("hang_main_stacks", {})["%s/%s" % (t.get("rank"), t.get("reason"))] = \
                    t["threads"][0]["stack"][-1500:]
    res["checks"] = [{"name": n, "ok": bool(ok), "detail": d} for n, ok, d in checks]
    res["all_ok"] = all(c["ok"] for c in res["checks"])
    for c in res["checks"]:
        print("%s %s: %s" % ("PASS" if c["ok"] else "FAIL", c["name"], c["detail"]), flush=True)
    res["records"] = len(records)
    res["skipped"] = {n: v for n, f in facts.items() for v in f.values() if v.get("skipped")}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    for name, r in res["runs"].items():
        for rk, v in r["ranks"].items():
            print("%-14s r%s step %s fwd %s bwd %s comm %s exposed %s wait %s late %s sync_ns %s prof %s" % (
                name, rk, v["step_ms"], v["forward_ms"], v["backward_ms"], v["comm_ms"], v["comm_exposed_ms"],
                v["sync_wait_ms"], v["lateness_ms"], v["has_sync_ns"], v.get("profiler_nccl_union_ms")), flush=True)
    return 0 if res["all_ok"] else 1


def main():
    a = args_parser().parse_args()
    if a.worker:
        return worker(a)
    if a.verify:
        from comm_verify import verify

        return verify(a, PLANTED, PROFILE)
    return launcher(a)


if __name__ == "__main__":
    sys.exit(main())
