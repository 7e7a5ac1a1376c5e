"""ngram_full_mask: stock's USE_FULL_MASK loop vs the slot's kernel, one process, same inputs
(GPU): host µs per call (launch to return, the GPU kept busy), GPU µs per call (CUDA events),
syncs per call, at the batch sizes and lengths an NGRAM server runs (8 draft tokens).

    python benchmarks/bench_ngram_full_mask.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_eagle_tail import measure, sample  # noqa: E402
from hostsync_drivers import abba  # noqa: E402
from test_gpu_ngram_full_mask import stock_full_mask  # noqa: E402

from sglang_hostsync_plugin.slots import ngram_full_mask as nfm  # noqa: E402

D = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    ns = ap.parse_args()
    iters = 300 // ns.rounds
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
        runs = abba({arm: (lambda c=c: sample(c, None, (), iters)) for arm, c in calls.items()}, ns.rounds)
        rows.append({"bs": bs, "len": length, **{arm: measure(runs[arm], c, None, ()) for arm, c in calls.items()}})
    print(f"{'bs':>3} {'len':>5} | {'host µs stock/plugin':>21} | {'gpu µs stock/plugin':>20} | syncs s/p")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        print(f"{r['bs']:>3} {r['len']:>5} | {s['host_us_median']:>10.1f}/{p['host_us_median']:<10.1f} | "
              f"{s['gpu_us_median']:>9.1f}/{p['gpu_us_median']:<10.1f} | {s['syncs_per_call']}/{p['syncs_per_call']}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), "draft_tokens": D, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
