"""ngram_full_mask: stock's USE_FULL_MASK loop vs the slot's kernel, one process, same inputs
(GPU): host µs per call (launch to return, the GPU kept busy), GPU µs per call (CUDA events),
syncs per call, at the batch sizes and lengths an NGRAM server runs (8 draft tokens).

    python benchmarks/bench_ngram_full_mask.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402
from test_gpu_ngram_full_mask import stock_full_mask  # noqa: E402  (tests/ is on the path)

from sglang_hostsync_plugin.slots import ngram_full_mask as nfm  # noqa: E402

D = 8


def main():
    ns = parse_args()
    rows = []
    for bs, length in ((1, 400), (1, 4000), (8, 400), (8, 4000), (32, 1000)):
        rng = random.Random(bs * 7 + length)
        lens = [length + rng.randrange(0, 64) for _ in range(bs)]
        mask = (torch.rand(bs * D * D) < 0.4).to(torch.uint8).numpy()
        tree = torch.from_numpy(mask).to("cuda").to(torch.bool)
        seq_lens = torch.tensor(lens, device="cuda")
        seq_lens_cpu = torch.tensor(lens)
        calls = {"stock": lambda _p: stock_full_mask(mask, lens, D),
                 "plugin": lambda _p: nfm.full_mask(tree, seq_lens, seq_lens_cpu, D)}
        assert torch.equal(calls["stock"](None), calls["plugin"](None))
        rows.append({"bs": bs, "len": length, **compare(calls, None, (), ns)})
    print_rows(rows, ("bs", "len"))
    write_json(ns.json, rows, draft_tokens=D)


if __name__ == "__main__":
    main()
