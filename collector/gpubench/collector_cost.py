#!/usr/bin/env python3
"""Measures what `deepseed collect` costs on this machine's real GPUs.

For each sampling interval it starts the collector against a stub upstream
that answers 200, waits out a warm-up, and measures the collector process's
CPU over the measured window two ways: utime+stime from /proc/<pid>/stat
(10 ms ticks, the usual figure) and the sum of /proc/<pid>/task/*/schedstat
(nanoseconds, precise enough for a collector that costs a fraction of a
percent). It reports CPU as % of one core, per GPU and extrapolated to 8
GPUs, and RSS. Optionally it keeps a GPU busy with a PyTorch matmul loop
announced to the collector as a training process (so adaptive sampling
switches that GPU to the fast interval), takes a pprof CPU profile, and
records an NVML capture with per-call costs.

Usage (run from the repository root on the GPU machine):
  python3 collector/gpubench/collector_cost.py --bin ./deepseed \\
      --intervals 1s,100ms --seconds 60 --warm 5 --out /tmp/cost [--load] \\
      [--variant NAME=FLAGS ...] [--pprof 30 --pprof-only TAG] [--capture] \\
      [-- extra collect flags]
Each --variant (for instance nofast='--fast-interval 0', or old='BIN=./old')
is measured at every interval, in the order given; without one the
collector runs with its defaults. A variant's BIN= runs another binary, for
before/after comparisons interleaved on one machine.
Prints one JSON line per measurement and writes them to OUT/results.jsonl.
"""
import argparse
import glob
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")

LOAD = r"""
import os, sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


class Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts = 0
    bytes_in = 0

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        Stub.posts += 1
        Stub.bytes_in += n
        body = b'{"accepted":0}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stat_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def sched_cpu(pid):
    tot = 0
    for p in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(p) as f:
                tot += int(f.read().split()[0])
        except OSError:
            pass
    return tot / 1e9


def rss_mib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def rss_by_mapping(pid):
    """Resident KiB of the process by what is mapped: a file, or anonymous."""
    out, name = {}, "?"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and ":" in parts[3]:
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:":
                out[name] = out.get(name, 0) + int(parts[1])
    return sorted(out.items(), key=lambda kv: -kv[1])


def post(url, body):
    req = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return len([l for l in out.splitlines() if l.startswith("GPU ")])
    except Exception:
        return 0


def measure(a, interval, load_pids, stub_port, tag, bin_path, flags):
    hook_port, metrics_port, pprof_port = free_port(), free_port(), free_port()
    spool = tempfile.mkdtemp(prefix="spool-")
    env = dict(os.environ, DEEPSEED_PPROF_LISTEN=f"127.0.0.1:{pprof_port}")
    cmd = [bin_path, "collect", "--server", f"http://127.0.0.1:{stub_port}", "--hook-listen", f"127.0.0.1:{hook_port}",
           "--metrics-listen", f"127.0.0.1:{metrics_port}", "--spool-dir", spool, "--interval", interval,
           "--host-name", "bench", "--log-level", "warn"]
    cap_path = None
    if a.capture:
        cap_path = os.path.join(a.out, f"capture-{tag}.json")
        cmd += ["--capture", cap_path]
    cmd += flags + a.extra
    log = open(os.path.join(a.out, f"collect-{tag}.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    hook = f"http://127.0.0.1:{hook_port}/api/v1/ingest"
    for _ in range(200):
        try:
            post(hook, '{"kind":"event","run_id":"bench","type":"note","text":"start"}\n')
            break
        except Exception:
            time.sleep(0.05)
    for rank, pid in enumerate(load_pids):
        post(hook, json.dumps({"kind": "process", "run_id": "bench", "rank": rank, "local_rank": rank, "pid": pid}) + "\n")
    time.sleep(a.warm)
    s0, c0, t0 = stat_cpu(p.pid), sched_cpu(p.pid), time.monotonic()
    posts0 = Stub.posts
    time.sleep(a.seconds)
    s1, c1, t1 = stat_cpu(p.pid), sched_cpu(p.pid), time.monotonic()
    posts1, bytes1 = Stub.posts, Stub.bytes_in
    mem = rss_mib(p.pid)
    try:
        with open(os.path.join(a.out, f"rss-{tag}.txt"), "w") as f:
            for name, kib in rss_by_mapping(p.pid):
                f.write(f"{kib:8d} KiB  {name}\n")
    except OSError as e:
        print(f"smaps: {e}", file=sys.stderr)
    metrics = ""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        with open(os.path.join(a.out, f"metrics-{tag}.txt"), "w") as f:
            f.write(metrics)
    except Exception as e:
        metrics = f"# metrics failed: {e}"
    if a.pprof > 0 and a.pprof_only in tag:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{pprof_port}/debug/pprof/profile?seconds={a.pprof}", timeout=a.pprof + 30) as r:
                with open(os.path.join(a.out, f"pprof-{tag}.pb.gz"), "wb") as f:
                    f.write(r.read())
        except Exception as e:
            print(f"pprof failed: {e}", file=sys.stderr)
    p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
    wall = t1 - t0
    gpus = a.gpus
    res = {
        "tag": tag, "interval": interval, "gpus": gpus, "load": bool(load_pids), "seconds": round(wall, 1),
        "cpu_pct_stat": round(100 * (s1 - s0) / wall, 3),
        "cpu_pct_sched": round(100 * (c1 - c0) / wall, 4),
        "rss_mib": round(mem.get("VmRSS", 0), 1), "peak_rss_mib": round(mem.get("VmHWM", 0), 1),
        "posts_per_s": round((posts1 - posts0) / wall, 2),
        "bin": bin_path, "extra": flags + a.extra,
    }
    if gpus:
        res["cpu_pct_per_gpu"] = round(res["cpu_pct_sched"] / gpus, 4)
        res["cpu_pct_8gpu_extrapolated"] = round(8 * res["cpu_pct_sched"] / gpus, 3)
    for line in metrics.splitlines():
        if line.startswith("deepseed_gpu_sample_interval_seconds{"):
            res.setdefault("sample_interval_seconds", []).append(line.rsplit(" ", 1)[1])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--intervals", default="1s,100ms")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warm", type=float, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load", action="store_true", help="keep every GPU busy with an announced matmul loop")
    ap.add_argument("--pprof", type=int, default=0, help="after measuring, take a CPU profile of this many seconds")
    ap.add_argument("--pprof-only", default="", help="profile only the measurements whose tag holds this")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=FLAGS: collect flags (and BIN=path for another binary) measured at every interval")
    ap.add_argument("--capture", action="store_true", help="write an NVML capture with per-call costs")
    ap.add_argument("--tag", default="")
    ap.add_argument("extra", nargs="*", help="extra flags for deepseed collect, after --")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    a.gpus = gpu_count()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    stub_port = srv.server_address[1]
    loads = []
    if a.load:
        for g in range(a.gpus):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(g))
            lp = subprocess.Popen([sys.executable, "-c", LOAD], env=env, stdout=subprocess.PIPE, text=True)
            lp.stdout.readline()
            loads.append(lp)
    variants = []
    for v in a.variant or ["="]:
        name, _, flags = v.partition("=")
        bin_path, rest = a.bin, []
        for f in flags.split():
            if f.startswith("BIN="):
                bin_path = f[len("BIN="):]
            else:
                rest.append(f)
        variants.append((name, bin_path, rest))
    results = []
    try:
        for iv0 in a.intervals.split(","):
            for name, bin_path, flags in variants:
                # A variant may set its own --interval (the last flag wins).
                iv = iv0
                if "--interval" in flags:
                    iv = flags[flags.index("--interval") + 1]
                tag = f"{a.tag}{name + '-' if name else ''}{'load' if a.load else 'idle'}-{iv}"
                r = measure(a, iv, [lp.pid for lp in loads], stub_port, tag, bin_path, flags)
                print(json.dumps(r), flush=True)
                results.append(r)
    finally:
        for lp in loads:
            lp.kill()
        srv.shutdown()
    with open(os.path.join(a.out, "results.jsonl"), "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
