"""A watched run's records read back from the hook's file, and the
invariants every number must keep (the checks of compile_check.py,
accelerate_check.py and conformance.py): one step an optimizer step, MFU in
(0, 1], each phase within its step and their sum within it plus a
tolerance, the precision the run trained in."""

import gzip
import json
import statistics

PHASES = ("forward_ms", "backward_ms", "optimizer_ms")


def read(*paths):
    """{"steps": [...], "layers": [...], "meta": {...}, "other": [...]} of
    the files' records, each steps record expanded to one dict a step."""
    steps, layers, meta, other = [], [], {}, []
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                k = r.get("kind")
                if k == "run":
                    meta.update(r.get("meta") or {})
                elif k == "steps":
                    n = len(r["step"])
                    cols = {key: (v if isinstance(v, list) else [v] * n) for key, v in r.items()
                            if key not in ("kind", "run_id")}
                    metrics = cols.pop("metrics", None)
                    for i in range(n):
                        s = {key: cols[key][i] for key in cols}
                        if isinstance(r.get("metrics"), dict):
                            for mk, mv in r["metrics"].items():
                                s[mk] = mv[i] if isinstance(mv, list) else mv
                        steps.append(s)
                    del metrics
                elif k == "step":
                    steps.append(r)
                elif k == "layers":
                    layers.append(r)
                else:
                    other.append(r)
    return {"steps": steps, "layers": layers, "meta": meta, "other": other}


def median(steps, key):
    vals = [s[key] for s in steps if isinstance(s.get(key), (int, float))]
    return round(statistics.median(vals), 4) if vals else None


def invariants(got, tol_ms=0.1, tol_frac=0.05):
    """The numbers a user would read, and every broken invariant."""
    steps = got["steps"]
    bad = []
    for s in steps:
        st = s.get("step_ms")
        mfu = s.get("mfu")
        if mfu is not None and not (0 < mfu <= 1):
            bad.append("step %s rank %s: MFU %.4f" % (s.get("step"), s.get("rank"), mfu))
        if st is None:
            continue
        parts = [s.get(p) for p in PHASES]
        for name, p in zip(PHASES, parts):
            if p is not None and p > st * (1 + tol_frac) + tol_ms:
                bad.append("step %s rank %s: %s %.2f > step %.2f ms" % (s.get("step"), s.get("rank"), name, p, st))
        tot = sum(p for p in parts if p is not None)
        if tot > st * (1 + tol_frac) + tol_ms:
            bad.append("step %s rank %s: phases %.2f > step %.2f ms" % (s.get("step"), s.get("rank"), tot, st))
    ranks = sorted({s.get("rank", 0) for s in steps})
    per_rank = {r: [s for s in steps if s.get("rank", 0) == r] for r in ranks}
    m = got["meta"]
    lrs = [s.get("lr") for s in steps if s.get("lr") is not None]
    nums = [s.get("step") for s in per_rank.get(ranks[0], ())] if ranks else []
    return {"steps_recorded": {str(r): len(v) for r, v in per_rank.items()},
            # the first and last step numbers of the lowest rank: the last
            # is the loop's step count where every step was counted
            "first_last_step": [nums[0], nums[-1]] if nums else None,
            "precision": m.get("precision"), "peak_tflops": m.get("peak_tflops"),
            "micro_batch": m.get("micro_batch"), "grad_accum": m.get("grad_accum"),
            "effective_batch": m.get("effective_batch"),
            "median_step_ms": median(steps, "step_ms"), "median_optimizer_ms": median(steps, "optimizer_ms"),
            "median_mfu": median(steps, "mfu"), "max_mfu": max([s["mfu"] for s in steps if s.get("mfu")] or [None],
                                                                 key=lambda x: x or 0),
            "tokens_per_step": sorted({s.get("tokens") for s in steps if s.get("tokens") is not None})[:6],
            "lr_first_last": [lrs[0], lrs[-1]] if lrs else None,
            "violations": bad[:12], "violation_count": len(bad)}
