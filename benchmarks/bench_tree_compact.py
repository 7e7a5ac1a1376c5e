"""fused_tree_compact: stock ``_finalize_accept_tree_path`` vs the slot's hook, one process,
same inputs (GPU).

Per call: host time (launch to return, median/p90 µs, with the GPU kept busy), GPU time (CUDA
events, median µs), syncs per call (torch sync-debug "warn"). Real SGLang MHATokenToKVPool
(32 layers, 8 KV heads x 128, bf16: an 8B-shaped target) and its tiled all-layer KV copy.

    python benchmarks/bench_tree_compact.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import random

import torch

import os as _os, sys as _sys
_sys.path.insert(0, _os.path.dirname(_os.path.abspath(__file__)))
from per_call import compare, parse_args, write_json  # also puts tests/ on the path
from types import SimpleNamespace

from hostsync_drivers.tree_compact import RecordingPool, make_case
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import eagle_worker_common as ewc
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc


class Pool(RecordingPool):
    def move_kv_cache(self, tgt, src):
        self.pool.move_kv_cache(tgt, src)


def big_pool(size: int):
    with get_context().override_server_args():
        return MHATokenToKVPool(size=size, page_size=1, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=32,
                                device="cuda", enable_memory_saver=False, enable_alt_stream=False,
                                enable_kv_cache_copy=True)


def main():
    ns = parse_args()
    hook = lambda *a, **k: ftc.finalize_hook(ewc._finalize_accept_tree_path, *a, **k)  # noqa: E731
    rows = []
    for bs, topk, steps in [(1, 4, 3), (4, 4, 3), (8, 4, 3), (32, 4, 3), (8, 8, 7)]:
        case = make_case(random.Random(bs * 100 + topk), bs, topk, steps, hidden_dim=4096, device="cuda")
        pool = Pool(big_pool(case["size"]))
        fns = {"stock": ewc._finalize_accept_tree_path, "plugin": hook}
        batch = SimpleNamespace(seq_lens=torch.zeros(bs, dtype=torch.int64, device="cuda"),
                                out_cache_loc=case["out_cache_loc"])
        logits = SimpleNamespace(hidden_states=None)

        def call(pool, fn):  # neither path writes its inputs (but the pool, the same each call)
            logits.hidden_states = case["hidden"]
            return fn(batch, case["accept_index"], case["accept_lens"], case["predict"], logits, bs,
                      token_to_kv_pool_allocator=pool, num_draft_tokens=case["nd"])

        calls = {arm: (lambda pool, fn=fn: call(pool, fn)) for arm, fn in fns.items()}
        rows.append({"bs": bs, "topk": topk, "steps": steps, **compare(calls, pool, (), ns)})
    print(f"{'bs':>3} {'topk':>4} {'steps':>5} | {'host µs med/p90 stock':>22} {'plugin':>14} | {'ratio':>6} | "
          f"{'gpu µs stock/plugin':>20} | syncs s/p")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        print(f"{r['bs']:>3} {r['topk']:>4} {r['steps']:>5} | {s['host_us_median']:>10.1f}/{s['host_us_p90']:<10.1f} "
              f"{p['host_us_median']:>6.1f}/{p['host_us_p90']:<7.1f} | {p['host_us_median'] / s['host_us_median']:>6.2f} | "
              f"{s['gpu_us_median']:>9.1f}/{p['gpu_us_median']:<10.1f} | {s['syncs_per_call']}/{p['syncs_per_call']}")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
