"""draft_vocab_topk: ``torch.topk(probs, k, dim=-1)`` vs the slot's candidate pass, one process,
same inputs (GPU): host µs per call (launch to return, the GPU kept busy), GPU µs per call (CUDA
events), syncs per call, for the rows the EAGLE draft takes at topk 4 over a 128k vocabulary
(requests x topk rows in the draft steps).

    python benchmarks/bench_draft_vocab_topk.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from sglang_hostsync_plugin.slots import draft_vocab_topk as dvt  # noqa: E402

VOCAB = 128256


def main():
    ns = parse_args()
    rows = []
    for k in (4, 8):
        calls = {"stock": lambda x, k=k: torch.topk(x, k, dim=-1), "plugin": lambda x, k=k: dvt.vocab_topk(x, k)}
        for n in (1, 4, 8, 32, 64):
            x = torch.softmax(torch.randn(n, VOCAB, device="cuda"), dim=-1)
            s, p = calls["stock"](x), calls["plugin"](x)
            assert torch.equal(s.values, p.values) and torch.equal(s.indices, p.indices)
            rows.append({"k": k, "rows": n, **compare(calls, x, (), ns)})
    print_rows(rows, ("k", "rows"))
    write_json(ns.json, rows, vocab=VOCAB)


if __name__ == "__main__":
    main()
