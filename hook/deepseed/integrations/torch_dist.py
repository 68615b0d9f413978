"""Plain torch.distributed: DDP, FSDP (its sharding strategy reported as the
equivalent ZeRO stage) and ZeroRedundancyOptimizer (ZeRO-1)."""

from __future__ import annotations

# FSDP sharding strategy name -> the ZeRO stage that shards the same state.
FSDP_ZERO_STAGE = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "_HYBRID_SHARD_ZERO2": 2, "FULL_SHARD": 3,
                   "HYBRID_SHARD": 3}

_PRECISION = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def _name(x):
    return getattr(x, "name", None) or str(x).rsplit(".", 1)[-1]


def describe(model, optimizer=None):
    """Run meta implied by how model and optimizer are wrapped: framework,
    parallelism, zero_stage, offload and precision. Works on the objects'
    attributes, so it needs no process group of its own."""
    meta = {}
    cls = type(model).__name__
    mro = {c.__name__ for c in type(model).__mro__}
    if cls == "FullyShardedDataParallel" or "FullyShardedDataParallel" in mro:
        strategy = _name(getattr(model, "sharding_strategy", "FULL_SHARD"))
        meta.update(framework="fsdp", parallelism="fsdp", zero_stage=FSDP_ZERO_STAGE.get(strategy, 3))
        off = getattr(model, "cpu_offload", None)
        if off is not None and getattr(off, "offload_params", False):
            # FSDP's CPU offload moves parameters and gradients, and with them
            # the optimizer step, to the host.
            meta.update(offload_params="cpu", offload_optimizer="cpu")
        mp = getattr(model, "mixed_precision", None)
        pd = getattr(mp, "param_dtype", None) if mp is not None else None
        if pd is not None:
            meta["precision"] = _PRECISION.get(str(pd), str(pd))
    elif "FSDPModule" in mro:  # FSDP2 (fully_shard)
        meta.update(framework="fsdp", parallelism="fsdp", zero_stage=3)
        try:
            st = model._get_fsdp_state()
            pg = st._fsdp_param_group
            if pg is not None and pg.post_forward_mesh_info is None:
                meta["zero_stage"] = 2  # reshard_after_forward=False keeps parameters
            # MixedPrecisionPolicy(param_dtype=...): the forward and backward
            # run in it (Accelerate's FSDP2 plugin sets it, with no autocast).
            pd = getattr(getattr(st, "_mp_policy", None), "param_dtype", None)
            if pd is not None:
                meta["precision"] = _PRECISION.get(str(pd), str(pd))
        except Exception:
            pass
    elif cls in ("DistributedDataParallel", "DataParallel"):
        meta.update(framework="torch", parallelism="ddp" if cls == "DistributedDataParallel" else "dp",
                    zero_stage=0)
    if optimizer is not None and type(optimizer).__name__ == "ZeroRedundancyOptimizer":
        meta["zero_stage"] = max(1, meta.get("zero_stage", 0) or 0)
        meta.setdefault("framework", "torch")
        meta.setdefault("parallelism", "ddp")
    return meta


def param_count(module):
    """Number of model parameters behind module, counted once each, also
    when FSDP has flattened and sharded them.

    FSDP (FullyShardedDataParallel) replaces a unit's parameters with one
    FlatParameter that holds only this rank's shard, so counting numel()
    gives about 1/world_size of the model. A FlatParameter remembers the
    sizes of the parameters it holds (``_numels``, padding excluded, tied
    parameters once); the original parameters that use_orig_params=True
    keeps are views into a shard and are skipped. DeepSpeed's ZeRO-3
    parameters carry their full size as ``ds_numel``; DTensors (FSDP2)
    report their global numel already. Works on attributes alone: no
    torch import, no collective."""
    flats = {}
    n = 0
    seen = set()

    def flat(fp):
        if fp is not None and id(fp) not in flats:
            numels = getattr(fp, "_numels", None)
            if numels is not None:
                total = sum(int(x) for x in numels)
            else:
                size = getattr(fp, "_unpadded_unsharded_size", None)
                total = _numel_of_size(size) if size is not None else int(fp.numel())
            flats[id(fp)] = total

    for m in module.modules():
        # FSDP units keep their handle even when the FlatParameter is not
        # registered as a parameter (use_orig_params=True).
        h = getattr(m, "_handle", None)
        flat(getattr(h, "flat_param", None))
        hs = getattr(m, "_handles", None)  # torch < 2.1
        if isinstance(hs, (list, tuple)):
            for h in hs:
                flat(getattr(h, "flat_param", None))
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if getattr(p, "_is_flat_param", False):
            flat(p)
            continue
        if getattr(p, "_fsdp_flattened", False):
            continue
        n += int(getattr(p, "ds_numel", 0) or p.numel())
    return n + sum(flats.values())


def _numel_of_size(size):
    total = 1
    for d in size:
        total *= int(d)
    return total


def grads_sharded(meta):
    """True when each rank holds only a shard of the gradients (FSDP with
    SHARD_GRAD_OP or FULL_SHARD), so a norm of the local gradients is not
    the model's: it must be summed over the ranks."""
    return meta.get("framework") == "fsdp" and int(meta.get("zero_stage") or 0) >= 2
