"""The conformance matrix: every way people train, watched as they watch it,
held to the invariants every number must keep (recheck.py) and, on two
ranks, to the straggler named with its cause and the control clean.

Cells are {plain loop, Accelerate, HF Trainer, Lightning, DeepSpeed} x
{eager, torch.compile} x {one process, DDP, FSDP2, ZeRO-2/3} x {fp32, bf16,
fp16} x gradient accumulation {1, 4}, with a straggler planted on rank 1
(data: its input 40 ms late; host: 40 ms on the host after backward; gpu:
40 ms of device work in its forward) or none (the control). A slice is
what one run of the script on a GPU machine covers (a few minutes):

    single  one process: plain x {eager, compile} x {fp32, bf16, fp16} x
            accum {1, 4}; Accelerate x {bf16, fp16} x {1, 4}; HF Trainer and
            Lightning (integrations_check.py's runs)
    gloo    two ranks sharing one GPU over gloo (host-blocking collectives):
            DDP x {control, data, host}, FSDP2 x {control, data}, Accelerate
            {DDP, FSDP2} x {control, data}, DDP with compiled blocks (control),
            Accelerate with its DeepSpeed plugin, ZeRO-2 (accum 4) and ZeRO-3
            (DeepSpeed on PYTHONPATH)
    nccl    two GPUs or more, a rank a GPU: the same and the gpu straggler,
            compiled DDP and FSDP2, DeepSpeed ZeRO-2/3 (DeepSpeed on
            PYTHONPATH); refused, saying why, where fewer GPUs are lent

Device side (records to files; no database):

    python3 hook/gpu_check/conformance.py --slice single --records $OUT/conf_single.ndjson.gz --out $OUT/conf_single.json
    python3 hook/gpu_check/conformance.py --slice gloo ...   (starts its two ranks itself)

Server side (a running `deepseed serve`): the straggler each cell planted
named by /ranks with its cause, the controls clean, no consistency finding:

    python3 hook/gpu_check/conformance.py --verify conf_gloo.ndjson.gz --deepseed ./deepseed \\
        --server http://127.0.0.1:8080 --out conf_gloo_verify.json
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import recheck

STEPS = 16
BATCH, SEQ, VOCAB = 8, 128, 4096
PLANT_S = 0.040


def cells(slice_name):
    out = []
    if slice_name == "single":
        for comp in ("eager", "compile"):
            for prec in ("fp32", "bf16", "fp16"):
                for acc in (1, 4):
                    out.append(dict(fw="plain", comp=comp, par="single", prec=prec, acc=acc, plant="control"))
        for prec in ("bf16", "fp16"):
            for acc in (1, 4):
                out.append(dict(fw="accelerate", comp="eager", par="single", prec=prec, acc=acc, plant="control"))
        out.append(dict(fw="hf", comp="eager", par="single", prec="bf16", acc=2, plant="control"))
        out.append(dict(fw="lightning", comp="eager", par="single", prec="bf16", acc=2, plant="control"))
    elif slice_name == "gloo":
        for plant in ("control", "data", "host"):
            out.append(dict(fw="plain", comp="eager", par="ddp", prec="bf16", acc=1, plant=plant))
        for plant in ("control", "data"):
            out.append(dict(fw="plain", comp="eager", par="fsdp2", prec="bf16", acc=1, plant=plant))
        for par in ("ddp", "fsdp2"):
            for plant in ("control", "data"):
                out.append(dict(fw="accelerate", comp="eager", par=par, prec="bf16", acc=1, plant=plant))
        out.append(dict(fw="plain", comp="blocks", par="ddp", prec="bf16", acc=1, plant="control"))
        # Accelerate's DeepSpeed plugin (DeepSpeed on PYTHONPATH), ZeRO-2
        # with accumulation and ZeRO-3, over gloo.
        for par, acc, plant in (("zero2", 4, "control"), ("zero2", 4, "data"), ("zero3", 1, "control")):
            out.append(dict(fw="accelerate", comp="eager", par=par, prec="bf16", acc=acc, plant=plant))
    elif slice_name == "nccl":
        for par in ("ddp", "fsdp2"):
            for plant in ("control", "data", "host", "gpu"):
                out.append(dict(fw="plain", comp="eager", par=par, prec="bf16", acc=1, plant=plant))
            out.append(dict(fw="plain", comp="blocks", par=par, prec="bf16", acc=1, plant="control"))
        for par in ("zero2", "zero3"):
            for plant in ("control", "data"):
                out.append(dict(fw="deepspeed", comp="eager", par=par, prec="bf16", acc=4, plant=plant))
    for c in out:
        c["name"] = "%(fw)s-%(comp)s-%(par)s-%(prec)s-acc%(acc)d-%(plant)s" % c
    return out


# ---- device side -------------------------------------------------------------

def gpt(torch):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                        vocab_size=VOCAB, max_position_embeddings=SEQ, use_cache=False)
    return GPTNeoXForCausalLM(cfg)


def plant(cell, rank, where):
    if rank == 1 and cell["plant"] == where:
        time.sleep(PLANT_S)


def run_plain(cell, deepseed, torch, path, rank, world):
    model = gpt(torch).cuda().train()
    if cell["comp"] == "blocks":
        for blk in model.gpt_neox.layers:
            blk.compile()
    if cell["par"] == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif cell["par"] == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for blk in model.gpt_neox.layers:
            fully_shard(blk)
        fully_shard(model)
    call = torch.compile(model) if cell["comp"] == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda") if cell["prec"] == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cell["prec"])
    run = deepseed.init(project="conformance", name=cell["name"], run_id=cell["run_id"], file=path,
                        handle_signals=False)
    run.watch(call, optimizer=opt, scaler=scaler)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        for _ in range(cell["acc"]):
            plant(cell, rank, "data")
            ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                if cell["plant"] == "gpu" and rank == 1:
                    torch.cuda._sleep(int(PLANT_S * 1.5e9))
                out = call(input_ids=ids, labels=ids)
            loss = out.loss / cell["acc"]
            (scaler.scale(loss) if scaler else loss).backward()
        plant(cell, rank, "host")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    run.finish(timeout=10)


def run_accelerate(cell, deepseed, torch, path, rank, world):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import InitProcessGroupKwargs
    # One Accelerator a cell: its state is a process-wide singleton.
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    handlers = [InitProcessGroupKwargs(backend="gloo")] if world > 1 and os.environ.get("CONF_GLOO") else []
    kw = {}
    if cell["par"] == "fsdp2":
        from accelerate.utils import FullyShardedDataParallelPlugin
        kw["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
    elif cell["par"] in ("zero2", "zero3"):
        from accelerate.utils import DeepSpeedPlugin
        # gloo has no reduce-scatter: ZeRO reduces with all-reduce.
        ds = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": cell["acc"],
              "gradient_clipping": 1.0,
              "zero_optimization": {"stage": int(cell["par"][-1]), "reduce_scatter": False, "overlap_comm": False},
              "bf16": {"enabled": cell["prec"] == "bf16"}, "fp16": {"enabled": cell["prec"] == "fp16"}}
        kw["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=ds)
    acc = Accelerator(mixed_precision=cell["prec"] if cell["prec"] != "fp32" else "no",
                      gradient_accumulation_steps=cell["acc"], kwargs_handlers=handlers, **kw)
    model = gpt(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (STEPS * cell["acc"] * BATCH * world, SEQ))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)
    model, opt, data = acc.prepare(model, opt, data)
    run = deepseed.init(project="conformance", name=cell["name"], run_id=cell["run_id"], file=path,
                        handle_signals=False)
    run.watch(model, optimizer=opt)
    model.train()
    it = iter(data)
    for _ in range(STEPS * cell["acc"]):
        plant(cell, rank, "data")
        (batch,) = next(it)
        with acc.accumulate(model):
            out = model(input_ids=batch, labels=batch)
            acc.backward(out.loss)
            if acc.sync_gradients:
                plant(cell, rank, "host")
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            run.log_step(loss=out.loss.detach())
    run.finish(timeout=10)


def run_cell(cell, d, rank, world):
    import torch
    from common import HOOK
    sys.path.insert(0, HOOK)
    import deepseed
    os.makedirs(os.path.join(d, cell["name"]), exist_ok=True)
    path = os.path.join(d, cell["name"], "rank%d.ndjson" % rank)
    torch._dynamo.reset()
    if cell["fw"] == "plain":
        run_plain(cell, deepseed, torch, path, rank, world)
    elif cell["fw"] == "accelerate":
        run_accelerate(cell, deepseed, torch, path, rank, world)
    elif cell["fw"] in ("hf", "lightning"):
        import integrations_check as ic
        if cell["fw"] == "hf":
            ic.run_hf(path)
        else:
            ic.run_lightning(path, "bf16-mixed", cell["acc"])
    else:
        raise RuntimeError("%s needs the nccl slice" % cell["fw"])


def expect(cell, got, world):
    """The device-side checks of one cell's records."""
    inv = recheck.invariants(got)
    want_prec = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}[cell["prec"]]
    steps = STEPS if cell["fw"] in ("plain", "accelerate") else None
    checks = {
        "every rank recorded": len(inv["steps_recorded"]) == world,
        "no impossible number": inv["violation_count"] == 0,
        "precision": inv["precision"] == want_prec,
    }
    if steps is not None:
        checks["steps are optimizer steps"] = all(n == steps for n in inv["steps_recorded"].values())
        checks["grad accum"] = inv["grad_accum"] == cell["acc"]
        checks["tokens per step"] = inv["tokens_per_step"] == [BATCH * SEQ * cell["acc"]]
        checks["lr"] = inv["lr_first_last"] is not None
        checks["optimizer timed"] = (inv["median_optimizer_ms"] or 0) > 0
    return inv, checks


def device_slice(a):
    import torch
    world = 2 if a.slice != "single" else 1
    if a.slice == "nccl" and torch.cuda.device_count() < 2:
        res = {"slice": "nccl", "refused": "NCCL needs a GPU per rank: %d GPU(s) here" % torch.cuda.device_count(),
               "cells": [c["name"] for c in cells("nccl")]}
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(res["refused"])
        return
    d = a.dir or tempfile.mkdtemp(prefix="conformance-")
    nonce = "%x" % int(time.time())
    if world > 1 and not os.environ.get("LOCAL_RANK"):
        env = dict(os.environ, CONF_NONCE=nonce, CONF_GLOO="1" if a.slice == "gloo" else "")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__,
               "--slice", a.slice, "--dir", d, "--records", a.records, "--out", a.out]
        sys.exit(subprocess.call(cmd, env=env))
    rank = int(os.environ.get("RANK", "0"))
    nonce = os.environ.get("CONF_NONCE", nonce)
    if world > 1:
        os.environ["LOCAL_RANK"] = "0" if a.slice == "gloo" else os.environ["LOCAL_RANK"]
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("gloo" if a.slice == "gloo" else "nccl")
    results = []
    for cell in cells(a.slice):
        if a.only and cell["name"] not in a.only.split(","):
            continue
        cell["run_id"] = "conf-%s-%s" % (nonce, cell["name"])
        t0 = time.time()
        err = None
        try:
            run_cell(cell, d, rank, world)
        except Exception as e:
            err = "%s: %s" % (type(e).__name__, str(e)[:400])
        if world > 1:
            torch.distributed.barrier()
        if rank == 0:
            r = {"cell": cell, "seconds": round(time.time() - t0, 1), "error": err}
            files = [os.path.join(d, cell["name"], f) for f in sorted(os.listdir(os.path.join(d, cell["name"])))
                     if f.endswith(".ndjson")] if os.path.isdir(os.path.join(d, cell["name"])) else []
            if files and not err:
                inv, checks = expect(cell, recheck.read(*files), world)
                r.update(numbers=inv, checks=checks, ok=all(checks.values()))
            else:
                r["ok"] = False
            results.append(r)
            print("%-48s %s %s" % (cell["name"], "ok" if r["ok"] else "FAILED", err or
                                   [k for k, v in r.get("checks", {}).items() if not v]), flush=True)
    if rank != 0:
        return
    with gzip.open(a.records, "wt") as out:
        for r in results:
            cd = os.path.join(d, r["cell"]["name"])
            for f in sorted(os.listdir(cd)) if os.path.isdir(cd) else []:
                with open(os.path.join(cd, f)) as src:
                    out.writelines(src)
    res = {"slice": a.slice, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "cells": results, "ok": sum(r["ok"] for r in results), "total": len(results)}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("%d of %d cells ok" % (res["ok"], res["total"]))


# ---- server side ---------------------------------------------------------------

def verify(a):
    import server_side
    runs = server_side.import_records(a.verify, a.deepseed, a.server)
    api = a.server.rstrip("/") + "/api/v1"
    results = []
    for name, rid in sorted(runs.items()):
        plant_kind = name.rsplit("-", 1)[-1]
        deadline = time.time() + 120
        ranks = None
        while time.time() < deadline:
            ranks = server_side.get("%s/runs/%s/ranks" % (api, rid))
            if len(ranks.get("ranks") or []) >= 1:
                break
            time.sleep(1)
        run = server_side.get("%s/runs/%s" % (api, rid))
        flagged = [(r["rank"], r.get("own_cause") or "", r.get("straggler_by") or "")
                   for r in ranks.get("ranks") or [] if r.get("straggler")]
        multi = len(ranks.get("ranks") or []) > 1
        if not multi or plant_kind == "control":
            named = not flagged
        else:
            named = [f[0] for f in flagged] == [1] and (flagged[0][2] == "lateness" or flagged[0][1] == plant_kind)
        consistency = run.get("consistency") or []
        results.append({"run": name, "flagged": flagged, "named_right": named, "consistency": consistency,
                        "ok": named and not consistency})
        print("%-48s %s flagged=%s consistency=%d" % (name, "ok" if results[-1]["ok"] else "FAILED", flagged,
                                                      len(consistency)))
    res = {"runs": results, "ok": sum(r["ok"] for r in results), "total": len(results)}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("%d of %d runs ok" % (res["ok"], res["total"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slice", choices=("single", "gloo", "nccl"))
    ap.add_argument("--only", help="cell names, comma-separated")
    ap.add_argument("--dir")
    ap.add_argument("--records", default="conformance.ndjson.gz")
    ap.add_argument("--out", default="conformance.json")
    ap.add_argument("--verify", help="records to import into --server and check there")
    ap.add_argument("--deepseed", default="deepseed")
    ap.add_argument("--server", default="http://127.0.0.1:8080")
    a = ap.parse_args()
    if a.verify:
        verify(a)
    elif a.slice:
        device_slice(a)
    else:
        ap.error("give --slice or --verify")


if __name__ == "__main__":
    main()
