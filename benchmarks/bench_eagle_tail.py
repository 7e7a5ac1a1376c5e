"""eagle_fixed_shape_tail: stock vs Triton vs csrc, one process, same inputs (GPU).

Per call: host time (launch to return, median/p90 µs), GPU time (CUDA events,
median µs), and syncs per call (torch sync-debug "warn" counts). EAGLE page_size>1,
topk>1 draft-branch tail copy on a real SGLang MHATokenToKVPool.

    python benchmarks/bench_eagle_tail.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import argparse
import json
import random
import statistics
import time
import warnings

import torch

import os as _os, sys as _sys
_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import abba
from hostsync_drivers.eagle_tail import make_case, make_pool
from sglang.srt.speculative import eagle_worker_common as ewc
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft


def plugin_call(impl):
    fn = eft.tail_slots_cuda if impl == "cuda" else eft.tail_slots_triton

    def call(pool, *args):
        tgt, src = fn(*args)
        pool.move_kv_cache(tgt, src)
    return call


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    args_ns = ap.parse_args()
    iters = 300 // args_ns.rounds
    rows = []
    for bs, topk, page_size in [(1, 4, 16), (4, 4, 64), (16, 4, 64), (32, 4, 64), (64, 4, 64), (64, 8, 64)]:
        rng = random.Random(bs * 1000 + topk)
        size, args = make_case(rng, bs, topk, page_size, num_steps=3, device="cuda")
        pool = make_pool(size, page_size, "cuda", 0)
        full = (*args, topk, page_size)
        fns = {"stock": ewc.duplicate_prefix_tail_to_draft_branches,
               "triton": plugin_call("triton"), "cuda": plugin_call("cuda")}
        runs = abba({arm: (lambda fn=fn: sample(fn, pool, full, iters)) for arm, fn in fns.items()}, args_ns.rounds)
        rows.append({"bs": bs, "topk": topk, "page_size": page_size,
                     **{arm: measure(runs[arm], fn, pool, full) for arm, fn in fns.items()}})
    print(f"{'bs':>3} {'topk':>4} {'page':>4} | {'host µs med/p90 stock':>22} {'triton':>14} {'cuda':>14} | "
          f"{'ratio tri/cuda':>14} | {'gpu µs stock/tri/cuda':>22} | syncs s/t/c")
    for r in rows:
        s, t, c = r["stock"], r["triton"], r["cuda"]
        print(f"{r['bs']:>3} {r['topk']:>4} {r['page_size']:>4} | "
              f"{s['host_us_median']:>10.1f}/{s['host_us_p90']:<10.1f} "
              f"{t['host_us_median']:>6.1f}/{t['host_us_p90']:<7.1f} {c['host_us_median']:>6.1f}/{c['host_us_p90']:<7.1f} | "
              f"{t['host_us_median'] / s['host_us_median']:>6.2f}/{c['host_us_median'] / s['host_us_median']:<7.2f} | "
              f"{s['gpu_us_median']:>6.1f}/{t['gpu_us_median']:>6.1f}/{c['gpu_us_median']:<8.1f} | "
              f"{s['syncs_per_call']}/{t['syncs_per_call']}/{c['syncs_per_call']}")
    if args_ns.json:
        with open(args_ns.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
