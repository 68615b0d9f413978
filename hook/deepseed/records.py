"""Step and eval records: the fields a record knows, how a caller's value
(a number, a bool, a tensor read later) is placed in one, and what a step
record gains from its others (throughput). Standard library only."""

from __future__ import annotations

import math

# Step-record fields a caller may pass by name; anything else goes to metrics.
STEP_FIELDS = ("epoch", "loss", "lr", "grad_norm", "loss_scale", "skipped", "samples", "tokens",
               "throughput_sps", "throughput_tps", "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
               "comm_ms", "comm_exposed_ms", "data_ms", "gpu_util_pct", "gpu_mem_used_gb", "gpu_mem_peak_gb", "gpu_mem_reserved_gb",
               "cpu_util_pct", "tflops", "mfu", "sync_ns", "sync_wait_ms", "input_wait_ms")
INT_FIELDS = ("samples", "tokens", "sync_ns")
_STEP_SET = frozenset(STEP_FIELDS)
_INT_SET = frozenset(INT_FIELDS)
_EVAL_SET = frozenset(("loss", "accuracy", "f1"))

# CUDA events and the host clock resolve about half a microsecond, so four
# decimals of a millisecond keep every digit a timing has; the rest is the
# noise of float32 event times, which would otherwise travel as 17 digits
# per value (and be parsed as such by the server).
MS_DECIMALS = 4


def round_ms(v):
    """A duration in milliseconds rounded to what was measured."""
    return round(v, MS_DECIMALS)


def is_tensor(v):
    # Recognised without importing torch: only a caller that already has a
    # tensor has torch loaded.
    return type(v).__module__.startswith("torch") and hasattr(v, "detach")


def _num(v):
    """A plain number from a Python or numpy number or bool; None otherwise."""
    if v is None:
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    try:
        return float(v)
    except Exception:
        return None


def _clean_fields(fields):
    """Splits caller values into plain numbers and tensors (read later)."""
    plain, tensors = {}, {}
    for k, v in fields.items():
        if v is None:
            continue
        if is_tensor(v):
            tensors[k] = v
            continue
        n = _num(v)
        if n is not None:
            plain[k] = n
    return plain, tensors


def _place(rec, key, value):
    """Puts a value in a step or eval record: known fields at top level,
    the rest under metrics."""
    if key in _INT_SET:
        if isinstance(value, float) and math.isfinite(value):
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            rec[key] = value
        return
    if key == "skipped":
        rec[key] = bool(value)
        return
    kind = rec.get("kind")
    known = key in _STEP_SET if kind == "step" else (kind == "eval" and key in _EVAL_SET)
    if known:
        value = float(value)
        rec[key] = round_ms(value) if key.endswith("_ms") else value
    else:
        if isinstance(value, bool):
            value = float(value)
        rec.setdefault("metrics", {})[str(key)[:256]] = float(value)


class _Pending:
    """A record waiting for tensor values that the device has not produced
    yet. It is emitted once they have been copied to the host."""

    __slots__ = ("rec", "lazy")

    def __init__(self, rec, lazy):
        self.rec = rec
        self.lazy = lazy


def _positive(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v > 0 and v != float("inf") else None


def _derive_throughput(rec):
    ms = rec.get("step_ms")
    if not ms or not (ms > 0) or not math.isfinite(ms):
        return
    if "samples" in rec and "throughput_sps" not in rec:
        rec["throughput_sps"] = rec["samples"] * 1000.0 / ms
    if "tokens" in rec and "throughput_tps" not in rec:
        rec["throughput_tps"] = rec["tokens"] * 1000.0 / ms
