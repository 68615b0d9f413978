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
