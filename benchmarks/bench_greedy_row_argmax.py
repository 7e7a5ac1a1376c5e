"""greedy_row_argmax: ``torch.argmax(logits, dim=-1)`` vs the slot's kernel, one process, same
inputs (GPU): host µs per call (launch to return, the GPU kept busy), GPU µs per call (CUDA
events), syncs per call, for the rows verify and draft extend take over a 128k vocabulary.

    python benchmarks/bench_greedy_row_argmax.py [--rounds 4] [--json out.json]

Each arm runs --rounds rounds of 300/rounds calls, interleaved (ABBA), samples pooled.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_eagle_tail import measure, sample  # noqa: E402
from hostsync_drivers import abba  # noqa: E402

from sglang_hostsync_plugin.slots import greedy_row_argmax as gra  # noqa: E402

VOCAB = 128256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    ns = ap.parse_args()
    iters = 300 // ns.rounds
    calls = {"stock": lambda x: torch.argmax(x, dim=-1), "plugin": lambda x: gra.row_argmax(x)}
    rows = []
    for n in (1, 4, 8, 32, 64):
        x = torch.randn(n, VOCAB, device="cuda")
        assert torch.equal(calls["stock"](x), calls["plugin"](x))
        runs = abba({arm: (lambda c=c: sample(c, x, (), iters)) for arm, c in calls.items()}, ns.rounds)
        rows.append({"rows": n, **{arm: measure(runs[arm], c, x, ()) for arm, c in calls.items()}})
    print(f"{'rows':>4} | {'host µs stock/plugin':>21} | {'gpu µs stock/plugin':>20} | syncs s/p")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        print(f"{r['rows']:>4} | {s['host_us_median']:>10.1f}/{p['host_us_median']:<10.1f} | "
              f"{s['gpu_us_median']:>9.1f}/{p['gpu_us_median']:<10.1f} | {s['syncs_per_call']}/{p['syncs_per_call']}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), "vocab": VOCAB, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
