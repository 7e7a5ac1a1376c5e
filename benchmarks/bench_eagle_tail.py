"""eagle_fixed_shape_tail: stock vs Triton vs csrc, one process, same inputs (GPU).

Per call: host time (launch to return, median/p90 µs), GPU time (CUDA events,
median µs), and syncs per call (torch sync-debug "warn" counts). EAGLE page_size>1,
topk>1 draft-branch tail copy on a real SGLang MHATokenToKVPool.

    python benchmarks/bench_eagle_tail.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import os as _os, sys as _sys
import random

_sys.path.insert(0, _os.path.dirname(_os.path.abspath(__file__)))
from per_call import compare, parse_args, write_json  # also puts tests/ on the path
from hostsync_drivers.eagle_tail import make_case, make_pool
from sglang.srt.speculative import eagle_worker_common as ewc
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft


def plugin_call(impl):
    fn = eft.tail_slots_cuda if impl == "cuda" else eft.tail_slots_triton

    def call(pool, *args):
        tgt, src = fn(*args)
        pool.move_kv_cache(tgt, src)
    return call


def main():
    ns = parse_args()
    rows = []
    for bs, topk, page_size in [(1, 4, 16), (4, 4, 64), (16, 4, 64), (32, 4, 64), (64, 4, 64), (64, 8, 64)]:
        rng = random.Random(bs * 1000 + topk)
        size, args = make_case(rng, bs, topk, page_size, num_steps=3, device="cuda")
        pool = make_pool(size, page_size, "cuda", 0)
        full = (*args, topk, page_size)
        fns = {"stock": ewc.duplicate_prefix_tail_to_draft_branches,
               "triton": plugin_call("triton"), "cuda": plugin_call("cuda")}
        rows.append({"bs": bs, "topk": topk, "page_size": page_size, **compare(fns, pool, full, ns)})
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
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
