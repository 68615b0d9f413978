#!/usr/bin/env python3
"""Times each NVML call the collector makes, on every GPU of this machine.

For each call it reports the CPU time spent on the calling thread (user and
system, which is what a collector pays) and the wall time, as medians over
repeated calls, in microseconds, and whether the device supports it. It also
times nvmlDeviceGetFieldValues batches that could replace several calls.

Usage: python3 nvml_call_costs.py [--reps 50] > costs.json
Needs nvidia-ml-py (import pynvml).
"""
import argparse
import json
import statistics
import sys
import time

import pynvml as N


def measure(fn, reps, budget_s=1.5):
    cpu, wall = [], []
    err = None
    t_end = time.perf_counter() + budget_s
    for _ in range(reps):
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            fn()
        except N.NVMLError as e:
            err = str(e)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        cpu.append(c1 - c0)
        wall.append(w1 - w0)
        if time.perf_counter() > t_end:
            break
    return {
        "n": len(cpu),
        "cpu_us_median": round(statistics.median(cpu) / 1e3, 1),
        "cpu_us_mean": round(statistics.fmean(cpu) / 1e3, 1),
        "wall_us_median": round(statistics.median(wall) / 1e3, 1),
        "error": err,
    }


def field_ids(names):
    out = []
    for n in names:
        v = getattr(N, n, None)
        if v is not None:
            out.append(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    N.nvmlInit()
    res = {"driver": N.nvmlSystemGetDriverVersion(), "devices": []}
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        fast_fields = field_ids(["NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                 "NVML_FI_DEV_MEMORY_TEMP"])
        slow_fields = field_ids(["NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
                                 "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC", "NVML_FI_DEV_REMAPPED_PENDING",
                                 "NVML_FI_DEV_PCIE_REPLAY_COUNTER"])
        pcie_count = field_ids(["NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"])
        calls = {
            "utilization": lambda: N.nvmlDeviceGetUtilizationRates(h),
            "memory_info_v2": lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
            "memory_info": lambda: N.nvmlDeviceGetMemoryInfo(h),
            "power_usage": lambda: N.nvmlDeviceGetPowerUsage(h),
            "total_energy": lambda: N.nvmlDeviceGetTotalEnergyConsumption(h),
            "temperature": lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
            "field_mem_temp": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_MEMORY_TEMP"])),
            "clock_sm": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
            "clock_mem": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
            "pcie_throughput_tx": lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_throughput_rx": lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES),
            "pcie_replay_counter": lambda: N.nvmlDeviceGetPcieReplayCounter(h),
            "ecc_corrected": lambda: N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_AGGREGATE_ECC),
            "ecc_uncorrected": lambda: N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC),
            "remapped_rows": lambda: N.nvmlDeviceGetRemappedRows(h),
            "clocks_event_reasons": lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h),
            "compute_processes": lambda: N.nvmlDeviceGetComputeRunningProcesses(h),
            "process_utilization": lambda: N.nvmlDeviceGetProcessUtilization(h, 0),
            "gpm_query_support": lambda: N.nvmlGpmQueryDeviceSupport(h),
            "nvlink_state_0": lambda: N.nvmlDeviceGetNvLinkState(h, 0),
            "fields_fast_batch": lambda: N.nvmlDeviceGetFieldValues(h, fast_fields),
            "fields_slow_batch": lambda: N.nvmlDeviceGetFieldValues(h, slow_fields),
            "fields_pcie_count": lambda: N.nvmlDeviceGetFieldValues(h, pcie_count),
            "fields_power_instant": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_POWER_INSTANT"])),
            "fields_energy": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"])),
            "fields_ecc_sbe": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_ECC_SBE_AGG_TOTAL"])),
            "fields_remapped_cor": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_REMAPPED_COR"])),
            "fields_pcie_replay": lambda: N.nvmlDeviceGetFieldValues(h, field_ids(["NVML_FI_DEV_PCIE_REPLAY_COUNTER"])),
        }
        d = {"index": i, "name": N.nvmlDeviceGetName(h), "calls": {}}
        for name, fn in calls.items():
            d["calls"][name] = measure(fn, a.reps)
        # What the batches return, so unsupported fields show.
        for label, ids in (("fast", fast_fields), ("slow", slow_fields), ("pcie_count", pcie_count)):
            try:
                vals = N.nvmlDeviceGetFieldValues(h, ids)
                d["fields_" + label + "_returns"] = {str(ids[k]): int(v.nvmlReturn) for k, v in enumerate(vals)}
            except N.NVMLError as e:
                d["fields_" + label + "_returns"] = str(e)
        res["devices"].append(d)
    N.nvmlShutdown()
    json.dump(res, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
