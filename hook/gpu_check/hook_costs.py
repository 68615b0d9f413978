"""Where the hook's cost per step goes on the eager tiny MLP, by parts:

1. paired blocks as bench_split.py takes them (watched and unwatched
   copies alternating step by step), for the hook as it is and with one
   part taken away at a time: `hooks_empty` (the module and optimizer hooks
   registered but returning at once: what torch's hook dispatch costs),
   `reader_lean` (the read-back thread takes steps off the queue without
   building their records: what building and sending them costs, the
   interpreter they take from the training thread included),
   `build_nothing` (finished steps are read back and their events
   returned, no record built), `send_nothing` (records built and dropped
   instead of sent), `no_reader_thread`, `no_sender` (records dropped as
   they are queued), `no_threads` (both), `no_inline_read` (the training
   thread never reads steps back; the reader thread reads them all);
2. each hook entry point's inclusive time on the training thread, timed
   around the call (the timer's own cost measured and taken off);
3. the hook's threads' CPU per watched step, thread by thread.

    python3 hook/gpu_check/hook_costs.py --pairs 1500 --rounds 2 --out costs.json
"""

import argparse
import json
import statistics
import threading
import time

import bench
import bench_split
from bench import TinyMLP
from common import CaptureProcess

import torch  # noqa: E402

from deepseed import readback, sender, steps, torch_utils  # noqa: E402

HOOK_METHODS = ("forward_pre", "forward_post", "optimizer_pre", "optimizer_post")
TIMED = {steps.StepState: ("forward_pre", "forward_post", "optimizer_pre", "optimizer_post", "open_step",
                           "close_step", "count_batch", "read_lr", "take_grad_norm", "wrapped_graphs"),
         torch_utils.Fetcher: ("add", "flush"),
         torch_utils.EventPool: ("record", "use_current_stream"),
         readback.StepReader: ("read_waiting", "_take_batch", "_build", "_sync_fields", "_deliver_outbox",
                               "send_steps"),
         torch.cuda.Event: ("elapsed_time", "query")}


def _empty(self, *a, **k):
    return None


def _lean_loop(self):
    """A reader that returns each finished step's events and builds nothing."""
    while True:
        self.wake.wait(readback.READ_EVERY_S)
        self.wake.clear()
        if self.stop_event.is_set():
            return
        with self.lock:
            while len(self.pending) > 1 and self.pending[0].nxt_start is not None:
                slot = self.pending.popleft()
                for ev in self._slot_events(slot):
                    if ev is not slot.nxt_start:
                        self.pool.put(ev)


def _build_nothing(self, slot):
    """A read-back that returns a finished step's events and builds nothing."""
    nxt = slot.nxt_start
    for ev in self._slot_events(slot):
        if ev is not nxt:
            self.pool.put(ev)
    return None


def _send_nothing(self):
    """Steps read back and dropped instead of leaving as records."""
    self.columns = None


def _put_nothing(self, record):
    """A sender that drops every record: its thread waits and sends nothing."""


PATCHES = {"hooks_empty": [(steps.StepState, m, _empty) for m in HOOK_METHODS],
           # The hook's threads taken away one at a time: the reader thread
           # (the training thread still reads steps back as they close), the
           # sender's work (records dropped), both; and the training
           # thread's own read-back (the reader thread reads every step).
           "no_reader_thread": [(readback.StepReader, "start", _empty)],
           "no_sender": [(sender.Sender, "put", _put_nothing)],
           "no_threads": [(readback.StepReader, "start", _empty), (sender.Sender, "put", _put_nothing)],
           # The reader thread then reads every finished step each time it
           # wakes, not only those left READ_LATE_S: else most steps would be
           # read at the run's end, outside the timed steps.
           "no_inline_read": [(readback.StepReader, "read_waiting", _empty), (readback, "READ_LATE_S", 0.0)],
           "reader_lean": [(readback.StepReader, "_read_loop", _lean_loop)],
           "build_nothing": [(readback.StepReader, "_build", _build_nothing)],
           "send_nothing": [(readback.StepReader, "send_steps", _send_nothing)]}


def patched_block(variant, pairs, url, xs, ys):
    saved = []
    for cls, name, fn in PATCHES.get(variant, ()):
        saved.append((cls, name, vars(cls)[name]))
        setattr(cls, name, fn)
    try:
        res = bench_split.block("default" if variant in PATCHES else variant, pairs, url, xs, ys)
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    res["variant"] = variant
    return res


def method_costs(steps_n, url, xs, ys):
    """Inclusive µs per step of each timed method, on the training thread."""
    acc = {}
    saved = []
    pc = time.perf_counter_ns

    def wrap(key, fn):
        cell = acc.setdefault(key, [0, 0])

        def timed(*a, **k):
            t0 = pc()
            try:
                return fn(*a, **k)
            finally:
                cell[0] += pc() - t0
                cell[1] += 1
        return timed

    for cls, names in TIMED.items():
        for n in names:
            fn = cls.__dict__[n]
            saved.append((cls, n, fn))
            setattr(cls, n, wrap("%s.%s" % (cls.__name__, n), fn))
    # The timer's own cost, per timed call.
    probe = wrap("probe", lambda: None)
    for _ in range(20000):
        probe()
    per_call_ns = acc.pop("probe")[0] / 20000
    try:
        torch.manual_seed(0)
        model = TinyMLP().cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = bench.start_hook("default", model, opt, url)
        mse = torch.nn.functional.mse_loss
        for i in range(steps_n + 100):
            if i == 100:
                for c in acc.values():
                    c[0] = c[1] = 0
            loss = mse(model(xs[i % 4]), ys[i % 4])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        run.finish()
    finally:
        for cls, n, fn in saved:
            setattr(cls, n, fn)
    out = {}
    for k, (ns, calls) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
        out[k] = {"us_per_step": round((ns - calls * per_call_ns) / steps_n / 1e3, 2),
                  "calls_per_step": round(calls / steps_n, 3)}
    return {"timer_ns_per_call": round(per_call_ns, 1), "methods": out}


def inloop_primitives(steps_n, xs, ys):
    """Host µs of each device call the hook makes, timed one by one inside
    the unwatched tiny-MLP loop right after the optimizer's step (where the
    hook makes them): a call costs there what the launches queued before it
    make it cost, not what it costs alone. Medians and means."""
    torch.manual_seed(0)
    model = TinyMLP().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mse = torch.nn.functional.mse_loss
    stream = torch.cuda.current_stream()
    rec = torch._C._CudaEventBase.record
    ring = [torch.cuda.Event(enable_timing=True) for _ in range(16)]
    get_sid = torch._C._cuda_getCurrentStream
    pc = time.perf_counter_ns
    names = ("record", "elapsed_first", "elapsed_second", "query", "current_stream_id")
    acc = {k: [] for k in names}
    for i in range(steps_n + 50):
        loss = mse(model(xs[i % 4]), ys[i % 4])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t0 = pc()
        rec(ring[i % 16], stream)
        t1 = pc()
        if i >= 16:
            a, b = ring[(i - 12) % 16], ring[(i - 11) % 16]
            a.elapsed_time(b)
            t2 = pc()
            b.elapsed_time(ring[(i - 10) % 16])
            t3 = pc()
            b.query()
            t4 = pc()
            get_sid(0)
            t5 = pc()
            if i >= 50:
                for k, v in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    acc[k].append(v / 1e3)
    torch.cuda.synchronize()
    return {k: {"median_us": round(statistics.median(v), 2), "mean_us": round(statistics.fmean(v), 2)}
            for k, v in acc.items()}


def thread_split(pairs, url, xs, ys):
    """The hook's threads' CPU per watched step, by thread."""
    (ma, oa) = bench_split.tiny()
    mse = torch.nn.functional.mse_loss
    run = bench.start_hook("default", ma, oa, url)
    for i in range(60):
        loss = mse(ma(xs[i % 4]), ys[i % 4])
        loss.backward()
        oa.step()
        oa.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    threads = [t for t in threading.enumerate() if t.name.startswith("deepseed-") and t.is_alive()]
    c0 = {t.name: bench_split.thread_cpu_s(t) for t in threads}
    main0 = time.thread_time()
    for i in range(pairs):
        loss = mse(ma(xs[i % 4]), ys[i % 4])
        loss.backward()
        oa.step()
        oa.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    main_us = (time.thread_time() - main0) / pairs * 1e6
    out = {t.name: round((bench_split.thread_cpu_s(t) - c0[t.name]) / pairs * 1e6, 2) for t in threads if t.is_alive()}
    run.finish()
    return {"training_thread_cpu_us_per_step_watched": round(main_us, 2), "hook_threads_cpu_us_per_step": out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="costs.json")
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="default,hooks_empty,reader_lean")
    ap.add_argument("--old", help="another deepseed package directory to compare with (old_default)")
    a = ap.parse_args()
    if a.old:
        bench.load_old(a.old)
    cap = CaptureProcess()
    xs = [torch.randn(32, 256, device="cuda") for _ in range(4)]
    ys = [torch.randn(32, 1, device="cuda") for _ in range(4)]
    variants = a.variants.split(",")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "pairs": a.pairs, "blocks": []}
    out["inloop"] = inloop_primitives(3000, xs, ys)
    print(json.dumps(out["inloop"], indent=1), flush=True)
    out["methods"] = method_costs(3000, cap.url, xs, ys)
    print(json.dumps(out["methods"], indent=1), flush=True)
    out["threads"] = thread_split(3000, cap.url, xs, ys)
    print(json.dumps(out["threads"], indent=1), flush=True)
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            try:
                res = patched_block(v, a.pairs, cap.url, xs, ys)
            except Exception as e:
                res = {"variant": v, "error": repr(e)}
            res["round"] = r
            out["blocks"].append(res)
            print(json.dumps(res), flush=True)
    out["records_received"] = cap.close()
    summary = {}
    for v in variants:
        bs = [b for b in out["blocks"] if b["variant"] == v and "error" not in b]
        if bs:
            summary[v] = {"train_thread_us": round(statistics.fmean(b["train_thread_us_mean"] for b in bs), 1),
                          "background_cpu_us": round(statistics.fmean(b["background_cpu_us"] for b in bs), 1),
                          "added_us": round(statistics.fmean(b["added_us"] for b in bs), 1)}
    out["summary"] = summary
    print(json.dumps(summary, indent=1))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
