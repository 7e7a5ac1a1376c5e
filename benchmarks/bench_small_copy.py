"""small_copy_launch: SGLang's ``try_small_copy`` ("stock") vs the slot's hook ("plugin") on the
CUDA-graph runners' input copies (the draft runner's six fields: seq_lens, out_cache_loc,
positions, topk_p, topk_index, req_pool_indices; static buffers <- this step's tensors), same
operands: host µs per call (launch to return), GPU µs, syncs per call.

    python benchmarks/bench_small_copy.py [--rounds 4] [--json out.json]
"""

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from hostsync_drivers import small_copy as drv  # noqa: E402
from sglang.kernels.ops.memory.small_copy import try_small_copy  # noqa: E402
from sglang_hostsync_plugin.slots import small_copy_launch as slc  # noqa: E402


def main():
    ns = parse_args()
    rng = random.Random(9)
    gen = torch.Generator().manual_seed(9)
    rows = []
    for bs, topk in ((1, 4), (8, 4), (32, 8)):
        dsts, srcs = drv.runner_case(rng, bs, topk, "cuda", gen)
        calls = {"stock": lambda _, d, s: try_small_copy(d, s),
                 "plugin": lambda _, d, s: slc.small_copy_hook(try_small_copy, d, s)}
        assert calls["stock"](None, dsts, srcs) is calls["plugin"](None, dsts, srcs) is True
        rows.append({"bs": bs, "topk": topk, "pairs": len(dsts), **compare(calls, None, (dsts, srcs), ns)})
    print("host / GPU µs per call: stock = SGLang's try_small_copy, plugin = small_copy_launch's hook")
    print_rows(rows, ("bs", "topk", "pairs"))
    print(f"captures {slc._state.captures}, relaunches {slc._state.hits}")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
