"""greedy_row_argmax: ``torch.argmax(logits, dim=-1)`` vs the slot's kernel, one process, same
inputs (GPU): host µs per call (launch to return, the GPU kept busy), GPU µs per call (CUDA
events), syncs per call, for the rows verify and draft extend take over a 128k vocabulary.

    python benchmarks/bench_greedy_row_argmax.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from sglang_hostsync_plugin.slots import greedy_row_argmax as gra  # noqa: E402

VOCAB = 128256


def main():
    ns = parse_args()
    calls = {"stock": lambda x: torch.argmax(x, dim=-1), "plugin": lambda x: gra.row_argmax(x)}
    rows = []
    for n in (1, 4, 8, 32, 64):
        x = torch.randn(n, VOCAB, device="cuda")
        assert torch.equal(calls["stock"](x), calls["plugin"](x))
        rows.append({"rows": n, **compare(calls, x, (), ns)})
    print_rows(rows, ("rows",))
    write_json(ns.json, rows, vocab=VOCAB)


if __name__ == "__main__":
    main()
