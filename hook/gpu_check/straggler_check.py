"""Straggler and NaN check: two ranks under torch.distributed, a straggler
planted on rank 1 and a NaN loss in a second run, through the node
collector; the records are then imported into a DeepSeed server whose
detectors must name rank 1 as the straggler and open a non-finite alert.

Two phases, each a run of its own, both watched by the hook:

    straggle  a small BERT (4 layers, width 256, random weights) under
              DistributedDataParallel; rank 1 sleeps --sleep-ms on the host
              before every backward, so rank 0 waits for it in the
              gradient all-reduce while every rank's step time stays equal
    nan       the same model with SGD at a learning rate of 1e6: the loss
              becomes non-finite within a few steps

With two GPUs or more, each rank has a GPU of its own and the collective is
NCCL's. On a machine with one GPU both ranks share it over the gloo backend
(NCCL refuses two ranks on one device): this is 2 ranks on 1 GPU over gloo,
not 2 GPUs; the collective is gloo's host all-reduce of CUDA tensors.

Device side (records to a file; no database needed):

    python3 hook/gpu_check/straggler_check.py --collector .device/deepseed \\
        --records $OUT/straggler_records.ndjson.gz --out $OUT/straggler_check.json

Server side (a running `deepseed serve` with its detectors on):

    python3 hook/gpu_check/straggler_check.py --verify straggler_records.ndjson.gz \\
        --deepseed ./deepseed --server http://127.0.0.1:8080 --out verify.json

--verify imports the records without their end records (a finished run is
not evaluated; live, the alerts open while the run trains), waits for the
alerts and checks rank 1 is the straggler and the NaN run has its alert.
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
from server_side import get, import_records  # noqa: E402


def args_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run as a torchrun worker (set by the launcher)")
    ap.add_argument("--out", default="straggler_check.json", help="results JSON")
    add_capture_args(ap, "straggler_records.ndjson.gz", "captured records (.ndjson.gz)")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--nan-steps", type=int, default=30)
    ap.add_argument("--sleep-ms", type=float, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--verify", default="", help="records file to import into --server and check")
    ap.add_argument("--deepseed", default="deepseed", help="(verify) deepseed binary for `import`")
    ap.add_argument("--server", default="http://127.0.0.1:8080", help="(verify) DeepSeed server")
    ap.add_argument("--wait", type=float, default=60, help="(verify) seconds to wait for the alerts")
    return ap


# ---------------------------------------------------------------- worker


def build(dev, lr, sgd):
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=512, num_labels=2)
    cfg._name_or_path = "bert-small (random init)"
    model = DistributedDataParallel(BertForSequenceClassification(cfg).to(dev).train())
    opt = (torch.optim.SGD(model.parameters(), lr=lr) if sgd
           else torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01))
    return model, opt


def phase(name, steps, dev, rank, a, lr, sgd, sleep_rank):
    import torch
    import deepseed

    model, opt = build(dev, lr, sgd)
    run = deepseed.init(project="straggler-check", name=name, layer_every=0,
                        params={"lr": lr, "sleep_ms": a.sleep_ms if sleep_rank is not None else 0},
                        flush_interval=0.2)
    run.watch(model, optimizer=opt)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    data = [(torch.randint(0, 30522, (a.batch, a.seq), generator=g, device=dev),
             torch.randint(0, 2, (a.batch,), generator=g, device=dev)) for _ in range(4)]
    losses = []
    for step in range(1, steps + 1):
        ids, labels = data[step % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        if rank == sleep_rank:
            time.sleep(a.sleep_ms / 1000)  # the planted straggler: host time before backward
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.log_step(step, loss=loss)
        losses.append(loss.detach())
    torch.cuda.synchronize(dev)
    vals = [float(x) for x in losses]
    run.finish()
    return {"run_id": run.run_id, "rank": rank, "first_loss": vals[0], "last_loss": vals[-1],
            "non_finite_steps": [i + 1 for i, v in enumerate(vals) if v != v or v in (float("inf"), float("-inf"))][:5]}


def worker(a):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if torch.cuda.device_count() >= 2:  # a GPU per rank, NCCL
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:  # both ranks on the one GPU
        dev = torch.device("cuda", 0)
        backend = "gloo"
    torch.cuda.set_device(dev)
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    facts = {"straggle": phase("bert-small-straggler", a.steps, dev, rank, a, 2e-5, False, 1)}
    dist.barrier()
    facts["nan"] = phase("bert-small-nan", a.nan_steps, dev, rank, a, 1e6, True, None)
    dist.barrier()
    dist.destroy_process_group()
    print("rank %d: %s" % (rank, json.dumps(facts)), flush=True)
    return 0


# ---------------------------------------------------------------- launcher


def med(v):
    v = [x for x in v if x is not None]
    return round(statistics.median(v), 3) if v else None


def rank_figures(records, run_id):
    """Per-rank medians from the records themselves: busy, wait, lateness
    (arrival after the step's first arrival, one host clock)."""
    by_step = {}
    for r in records:
        if r.get("kind") == "step" and r.get("run_id") == run_id and "sync_ns" in r:
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    late, wait, busy, data, inw, step = {}, {}, {}, {}, {}, {}
    for s, m in by_step.items():
        if len(m) < 2 or s <= 5:
            continue
        first = min(x["sync_ns"] for x in m.values())
        for rk, x in m.items():
            late.setdefault(rk, []).append((x["sync_ns"] - first) / 1e6)
            wait.setdefault(rk, []).append(x.get("sync_wait_ms"))
            if "step_ms" in x and "sync_wait_ms" in x:
                busy.setdefault(rk, []).append(x["step_ms"] - x["sync_wait_ms"])
            data.setdefault(rk, []).append(x.get("data_ms"))
            inw.setdefault(rk, []).append(x.get("input_wait_ms"))
            step.setdefault(rk, []).append(x.get("step_ms"))
    return {str(rk): {"steps": len(late[rk]), "lateness_ms": med(late[rk]), "sync_wait_ms": med(wait[rk]),
                      "busy_ms": med(busy.get(rk, [])), "step_ms": med(step[rk]), "data_ms": med(data[rk]),
                      "input_wait_ms": med(inw[rk])} for rk in sorted(late)}


def setup():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split("\n")
        gpus = [g.strip() for g in out if g.strip()]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    if len(gpus) >= 2:
        return "2 ranks on 2 GPUs (%s) over NCCL" % ", ".join(gpus[:2])
    return "2 ranks on 1 GPU over gloo (not 2 GPUs)"


def launcher(a):
    from dist_check import capture_front, drain_capture, stop, torchrun_prefix, worker_env

    cap, col, col_argv, hook_url = capture_front(a, "straggler_collector.log")
    res = {"config": {k: v for k, v in vars(a).items() if k != "worker"}, "collector": col_argv,
           "setup": setup()}
    cmd = torchrun_prefix() + ["--standalone", "--nproc_per_node", "2", os.path.abspath(__file__), "--worker",
                               "--steps", str(a.steps), "--nan-steps", str(a.nan_steps), "--sleep-ms",
                               str(a.sleep_ms), "--batch", str(a.batch), "--seq", str(a.seq)]
    env = worker_env(hook_url)
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = p.wait(a.timeout)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        stop(p, signal.SIGTERM, 20)
    res["torchrun_rc"], res["torchrun_s"] = rc, round(time.time() - t0, 2)
    records, res["collector_exit"] = drain_capture(cap, col, a.records)
    runs = sorted({r["run_id"] for r in records if r.get("kind") == "step"})
    res["runs"] = {rid: rank_figures(records, rid) for rid in runs}
    res["records"] = len(records)
    res["gpu_samples"] = sum(1 for r in records if r.get("kind") == "gpu")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res["runs"], indent=1), flush=True)
    return 0 if rc == 0 and runs else 1


# ---------------------------------------------------------------- verify


def verify(a):
    runs = import_records(a.verify, a.deepseed, a.server)
    strag, nan = runs.get("bert-small-straggler"), runs.get("bert-small-nan")
    res = {"runs": runs, "checks": {}}

    def check(name, ok, detail):
        res["checks"][name] = {"ok": bool(ok), "detail": detail}
        print("%s %s: %s" % ("ok  " if ok else "FAIL", name, detail), flush=True)

    end = time.monotonic() + a.wait
    st_alerts = nan_alerts = []
    while time.monotonic() < end:
        st_alerts = get("%s/api/v1/alerts?run_id=%s&kind=straggler" % (a.server, strag))["alerts"]
        nan_alerts = get("%s/api/v1/alerts?run_id=%s&kind=non_finite" % (a.server, nan))["alerts"]
        if st_alerts and nan_alerts:
            break
        time.sleep(1)
    check("straggler alert names rank 1", len(st_alerts) == 1 and st_alerts[0].get("rank") == 1,
          [(x.get("rank"), x.get("text")) for x in st_alerts])
    check("non-finite alert on the NaN run", len(nan_alerts) == 1, [(x.get("rank"), x.get("text")) for x in nan_alerts])
    rk = get("%s/api/v1/runs/%s/ranks" % (a.server, strag))
    res["ranks"] = rk
    flagged = [s["rank"] for s in rk["ranks"] if s["straggler"]]
    check("ranks endpoint flags rank 1 alone", flagged == [1] and rk.get("lateness_from") == "arrivals",
          {"flagged": flagged, "lateness_from": rk.get("lateness_from"),
           "per_rank": {s["rank"]: {k: s.get(k) for k in ("median_step_ms", "busy_ms", "sync_wait_ms", "lateness_ms",
                                                           "last_pct", "clock_offset_ms", "straggler_score",
                                                           "input_wait_ms")} for s in rk["ranks"]}})
    res["all_ok"] = all(c["ok"] for c in res["checks"].values())
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if res["all_ok"] else 1


def main():
    a = args_parser().parse_args()
    if a.worker:
        return worker(a)
    if a.verify:
        return verify(a)
    return launcher(a)


if __name__ == "__main__":
    sys.exit(main())
