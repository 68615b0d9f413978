"""Step and eval records: the fields a record knows, how a caller's value
(a number, a bool, a tensor read later) is placed in one, and what a step
record gains from its others (throughput). Standard library only."""

from __future__ import annotations

import math

from . import flops

# Step-record fields a caller may pass by name; anything else goes to metrics.
STEP_FIELDS = ("epoch", "loss", "lr", "grad_norm", "loss_scale", "skipped", "samples", "tokens",
               "throughput_sps", "throughput_tps", "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
               "comm_ms", "comm_exposed_ms", "data_ms", "gpu_util_pct", "gpu_mem_used_gb", "gpu_mem_peak_gb", "gpu_mem_reserved_gb",
               "cpu_util_pct", "tflops", "mfu", "sync_ns", "sync_wait_ms", "input_wait_ms")
INT_FIELDS = ("samples", "tokens", "sync_ns")
_STEP_SET = frozenset(STEP_FIELDS)
_INT_SET = frozenset(INT_FIELDS)
_EVAL_SET = frozenset(("loss", "accuracy", "f1"))
_FLOAT_SET = _STEP_SET - _INT_SET - {"skipped"}

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


def num(v):
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


def clean_fields(fields):
    """Splits caller values into plain numbers and tensors (read later)."""
    plain, tensors = {}, {}
    for k, v in fields.items():
        if v is None:
            continue
        if is_tensor(v):
            tensors[k] = v
            continue
        n = num(v)
        if n is not None:
            plain[k] = n
    return plain, tensors


def place(rec, key, value):
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


class Pending:
    """A record waiting for tensor values that the device has not produced
    yet. It is emitted once they have been copied to the host."""

    __slots__ = ("rec", "lazy")

    def __init__(self, rec, lazy):
        self.rec = rec
        self.lazy = lazy


def positive(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v > 0 and v != float("inf") else None


def derive_throughput(rec):
    ms = rec.get("step_ms")
    if not ms or not (ms > 0) or not math.isfinite(ms):
        return
    if "samples" in rec and "throughput_sps" not in rec:
        rec["throughput_sps"] = rec["samples"] * 1000.0 / ms
    if "tokens" in rec and "throughput_tps" not in rec:
        rec["throughput_tps"] = rec["tokens"] * 1000.0 / ms


# Watched steps leave as one `steps` record for many steps (api/decode_steps.go):
# columns instead of a JSON object per step. A record goes when it holds
# STEPS_PER_RECORD steps or its first is STEPS_MAX_AGE_S old: the age
# keeps the view live, and the count only bounds a record of steps shorter
# than 2 ms, whose per-record costs (columns made, encoded, sent) are
# what a short step pays most for.
STEPS_PER_RECORD = 256
STEPS_MAX_AGE_S = 0.5
MAX_METRICS = 256  # names under a record's metrics (api.MaxMetrics)


class StepColumns:
    """Steps of one rank gathered until they leave as one ``steps`` record:
    each field a list with an entry per step (None where a step has none),
    sent as one value when every step has the same. A step is kept as the
    two dicts it came with; the columns are made once, when the record is
    (a few list comprehensions per field instead of work per step)."""

    __slots__ = ("run_id", "rank", "steps", "times", "measured", "fields", "since")

    def __init__(self, run_id, rank):
        self.run_id = run_id
        self.rank = rank
        self.steps = []
        self.times = []
        self.measured = []
        self.fields = []
        self.since = 0.0

    def __len__(self):
        return len(self.steps)

    def add(self, step, t, measured, fields, now):
        """One step: measured holds known fields in their record form (the
        watcher's own), fields what a caller or framework added, placed
        as a step record's fields are (they win over measured ones)."""
        if not self.steps:
            self.since = now
        self.steps.append(int(step))
        self.times.append(t)
        self.measured.append(measured)
        self.fields.append(fields)

    def records(self, flops_token=None, peak=None):
        """The steps records for these steps: one, unless their metrics
        have more names together than a record may carry (each step is
        held to that bound alone, a steps record to it for all its steps),
        then as many as keep each under it."""
        names = set()
        for f in self.fields:
            if f:
                names.update(f)
        n = len(self.steps)
        if len(names - _STEP_SET) <= MAX_METRICS or n < 2:
            return [self.record(flops_token, peak)]
        out = []
        for lo, hi in ((0, n // 2), (n // 2, n)):
            part = StepColumns(self.run_id, self.rank)
            part.steps, part.times = self.steps[lo:hi], self.times[lo:hi]
            part.measured, part.fields = self.measured[lo:hi], self.fields[lo:hi]
            out.extend(part.records(flops_token, peak))
        return out

    def record(self, flops_token=None, peak=None):
        """The steps record (a dict), with throughput, TFLOP/s and MFU
        worked out for the steps that have what they need."""
        n = len(self.steps)
        cols = {}
        metrics = {}
        keys = set()
        for m in self.measured:
            keys.update(m)
        for k in keys:
            cols[k] = [m.get(k) for m in self.measured]
        keys = set()
        for f in self.fields:
            if f:
                keys.update(f)
        for k in keys:
            vals = [f.get(k) for f in self.fields]
            if k in _FLOAT_SET and all(type(v) is float for v in vals if v is not None):
                if k.endswith("_ms"):
                    vals = [round(v, MS_DECIMALS) if v is not None else None for v in vals]
                _over(cols, k, vals)
                continue
            # Anything else as a step record would place it: ints, bools,
            # numbers of other types, and names that go to metrics.
            for i, v in enumerate(vals):
                v = num(v) if v is not None else None
                if v is None:
                    continue
                box = {"kind": "step"}
                place(box, k, v)
                for name, val in box.items():
                    if name == "metrics":
                        for mk, mv in val.items():
                            metrics.setdefault(mk, [None] * n)[i] = mv
                    elif name != "kind":
                        col = cols.get(name)
                        if col is None:
                            cols[name] = col = [None] * n
                        col[i] = val
        ms = cols.get("step_ms")
        if ms is not None:
            for out, src in (("throughput_sps", "samples"), ("throughput_tps", "tokens")):
                have = cols.get(src)
                if have is not None:
                    _fill(cols, out, [x * 1000.0 / m if x is not None and m and m > 0 and math.isfinite(m) else None
                                      for x, m in zip(have, ms)])
            tokens = cols.get("tokens")
            if flops_token and tokens is not None:
                # As a step record gets them (Run._finalize): TFLOP/s and MFU
                # where the step sent no TFLOP/s of its own.
                tf = cols.get("tflops") or [None] * n
                mf = cols.get("mfu") or [None] * n
                for i, (x, m) in enumerate(zip(tokens, ms)):
                    if tf[i] is None:
                        tf[i], derived = flops.achieved(flops_token, x, m, peak)
                        if tf[i] is not None and mf[i] is None:
                            mf[i] = derived
                cols["tflops"] = tf
                if any(v is not None for v in mf):
                    cols["mfu"] = mf
        rec = {"kind": "steps", "run_id": self.run_id, "rank": self.rank, "step": self.steps, "time": self.times}
        for k, col in cols.items():
            _column(rec, k, col, n)
        if metrics:
            m = {}
            for k, col in metrics.items():
                _column(m, k, col, n)
            if m:
                rec["metrics"] = m
        return rec


def _over(cols, key, vals):
    # A caller's values win over the measured ones where they are given.
    col = cols.get(key)
    cols[key] = vals if col is None else [v if v is not None else c for c, v in zip(col, vals)]


def _fill(cols, key, derived):
    # Derived values where the step sent none of its own.
    col = cols.get(key)
    cols[key] = derived if col is None else [c if c is not None else d for c, d in zip(col, derived)]


def _column(out, key, col, n):
    first = col[0]
    if col.count(first) == n:
        if first is not None:
            out[key] = first  # the same for every step
    else:
        out[key] = col


def expand_steps(records):
    """The records with each ``steps`` record replaced by the ``step``
    records it holds, as the server stores them: for reading a local
    file."""
    out = []
    for r in records:
        if r.get("kind") != "steps":
            out.append(r)
            continue
        steps = r["step"]
        n = len(steps)
        cols = [(k, v) for k, v in r.items() if k not in ("kind", "run_id", "rank", "step", "metrics")]
        mcols = list((r.get("metrics") or {}).items())
        for i in range(n):
            s = {"kind": "step", "run_id": r["run_id"], "rank": r["rank"], "step": steps[i]}
            for k, v in cols:
                v = v[i] if isinstance(v, list) else v
                if v is not None:
                    s[k] = v
            m = {}
            for k, v in mcols:
                v = v[i] if isinstance(v, list) else v
                if v is not None:
                    m[k] = v
            if m:
                s["metrics"] = m
            out.append(s)
    return out
