"""What every per-call benchmark here shares (stock vs plugin arms of one function, one process,
same inputs, GPU): the command line, ABBA rounds of timed calls, and the JSON it writes.

Per call: host time (launch to return, median/p90 µs, the GPU kept busy), GPU time (CUDA events
around the call only, median µs), syncs per call (torch sync-debug "warn" counts)."""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import abba  # noqa: E402


def parse_args():
    """``--rounds`` (ABBA rounds of 300/rounds calls per arm, samples pooled) and ``--json``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    ns = ap.parse_args()
    ns.iters = 300 // ns.rounds
    return ns


def sample(fn, pool, args, iters):
    """(host µs, GPU µs) per call, ``iters`` calls after a warm-up."""
    for _ in range(20):
        fn(pool, *args)
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(iters):
        # Keep the GPU busy (~1 ms, longer than any call's launch path here) so the host times the
        # launch path, not a drained queue, and the events time only the call's kernels. Before
        # 2026-12-02 this slept 20k cycles (~11 µs): GPU µs then included launch waits.
        torch.cuda._sleep(2_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter_ns()
        fn(pool, *args)
        host.append((time.perf_counter_ns() - t0) / 1e3)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return host, gpu


def measure(runs, fn, pool, args):
    """One arm's row from its rounds of ``sample``, plus its syncs per call."""
    host = sorted(x for h, _ in runs for x in h)
    gpu = [x for _, g in runs for x in g]
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(pool, *args)
    torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return {"host_us_median": statistics.median(host), "host_us_p90": host[int(0.9 * len(host))],
            "gpu_us_median": statistics.median(gpu), "syncs_per_call": syncs}


def compare(calls: dict, pool, args, ns) -> dict:
    """arm -> its measured row: ``calls`` (arm -> fn(pool, *args)) in ABBA rounds."""
    runs = abba({arm: (lambda fn=fn: sample(fn, pool, args, ns.iters)) for arm, fn in calls.items()}, ns.rounds)
    return {arm: measure(runs[arm], fn, pool, args) for arm, fn in calls.items()}


def print_rows(rows, keys):
    """One line per row: its ``keys``, then host / GPU µs and syncs of stock and plugin."""
    print(f"{' '.join(f'{k:>5}' for k in keys)} | {'host µs stock/plugin':>21} | {'gpu µs stock/plugin':>20} | syncs s/p")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        print(f"{' '.join(f'{r[k]:>5}' for k in keys)} | {s['host_us_median']:>10.1f}/{p['host_us_median']:<10.1f} | "
              f"{s['gpu_us_median']:>9.1f}/{p['gpu_us_median']:<10.1f} | {s['syncs_per_call']}/{p['syncs_per_call']}")


def write_json(path, rows, **meta):
    if path:
        with open(path, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), **meta, "rows": rows}, f, indent=2)
