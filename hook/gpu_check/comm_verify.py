"""Server side of comm_check.py: imports the records a device run captured
into a running `deepseed serve` and checks what a user sees there (see
comm_check.py's docstring, "Server side")."""

import json
import time

from server_side import get, import_records


def verify(a, planted, profile):
    runs = import_records(a.verify, a.deepseed, a.server)
    res = {"runs": runs, "checks": [], "ranks": {}, "breakdown": {}, "alerts": {}}

    def check(name, ok, detail):
        res["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)

    end = time.monotonic() + a.wait
    want = {n for n in runs if n in planted}
    alerts = {}
    while time.monotonic() < end:
        for n in runs:
            alerts[n] = get("%s/api/v1/alerts?run_id=%s" % (a.server, runs[n]))["alerts"]
        if all(any(x["kind"] == "straggler" for x in alerts[n]) for n in want) and (
                "hang" not in runs or any(x["kind"] == "hang" for x in alerts["hang"])):
            break
        time.sleep(1)
    res["alerts"] = alerts
    for n, rid in sorted(runs.items()):
        rk = get("%s/api/v1/runs/%s/ranks" % (a.server, rid))
        res["ranks"][n] = rk
        st = [x.get("rank") for x in alerts.get(n, []) if x["kind"] == "straggler"]
        if n == "hang":
            hg = [x for x in alerts.get(n, []) if x["kind"] == "hang"]
            check("hang: the hang alert names rank 1", len(hg) == 1 and hg[0].get("rank") == 1,
                  [(x.get("rank"), x.get("text")) for x in hg])
            continue
        flagged = [s["rank"] for s in rk["ranks"] if s["straggler"]]
        per = {s["rank"]: {k: s.get(k) for k in ("busy_ms", "sync_wait_ms", "lateness_ms", "straggler_score")}
               for s in rk["ranks"]}
        if n in planted:
            check("%s: /ranks flags rank 1 alone" % n, flagged == [1], {"flagged": flagged, "from":
                                                                       rk.get("lateness_from"), "ranks": per})
            check("%s: straggler alert on rank 1 alone" % n, st == [1], st)
        else:
            check("%s: /ranks flags nobody" % n, flagged == [], {"flagged": flagged, "ranks": per})
            check("%s: no straggler alert" % n, st == [], st)
        for r in (0, 1):
            # From step 41: after the profiled steps, whose read-out pauses
            # the host for seconds and would weigh on the means.
            bd = get("%s/api/v1/runs/%s/breakdown?rank=%d&from_step=%d" % (a.server, rid, r, profile[1] + 1))
            res["breakdown"]["%s/%d" % (n, r)] = bd
            parts = {p["name"]: p["ms"] for p in bd["parts"]}
            named = sum(v for k, v in parts.items() if k != "other")
            check("%s rank %d: breakdown has communication and its named parts fit in the step" % (n, r),
                  parts.get("communication", 0) > 0 and named <= bd["step_ms"] * 1.01,
                  {"step_ms": round(bd["step_ms"], 2), "comm_ms": bd.get("comm_ms"),
                   "parts": {k: round(v, 2) for k, v in parts.items()}})
    cmp_ = get("%s/api/v1/compare?run=%s" % (a.server, ",".join(runs[n] for n in sorted(runs) if n != "hang")))
    res["compare"] = cmp_
    check("compare carries comm_ms and comm_exposed_ms", all(
        r.get("comm_ms") is not None and r.get("comm_exposed_ms") is not None for r in cmp_["rows"]),
          [(r["name"], r.get("comm_ms"), r.get("comm_exposed_ms")) for r in cmp_["rows"]])
    res["all_ok"] = all(c["ok"] for c in res["checks"])
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if res["all_ok"] else 1
