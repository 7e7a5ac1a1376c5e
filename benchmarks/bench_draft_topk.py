"""draft_extend_topk_graph: SGLang's eager ``fast_topk(renorm_draft_probs(logits), topk)`` ("stock")
vs the slot's graph replay with its two clones ("plugin"), on a static logits buffer as the
draft-extend graph leaves it (vocab 128256, float32): host µs per call (launch to return), GPU µs,
syncs per call, and one capture's host ms.

    python benchmarks/bench_draft_topk.py [--rounds 4] [--json out.json]
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from sglang_hostsync_plugin.slots import draft_extend_topk_graph as tg  # noqa: E402

VOCAB = 128256


def main():
    ns = parse_args()
    rows = []
    for bs in (1, 4, 16):
        for topk in (4, 8):
            buf = torch.randn(bs, VOCAB, device="cuda")
            tg.stock_topk(buf, None, False, topk)
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            tg.draft_topk(buf, None, False, topk, True)  # first call: eager + capture
            first_ms = (time.perf_counter_ns() - t0) / 1e6
            calls = {"stock": lambda _, x, k: tg.stock_topk(x, None, False, k),
                     "plugin": lambda _, x, k: tg.draft_topk(x, None, False, k, True)}
            rows.append({"bs": bs, "topk": topk, "first_call_ms": first_ms, **compare(calls, None, (buf, topk), ns)})
    print("host / GPU µs per call: stock = fast_topk(renorm_draft_probs), plugin = graph replay + 2 clones")
    print_rows(rows, ("bs", "topk"))
    print("first call (eager + capture), host ms:", [f"{r['first_call_ms']:.2f}" for r in rows],
          "median", f"{statistics.median(r['first_call_ms'] for r in rows):.2f}")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
