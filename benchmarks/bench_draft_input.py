"""draft_input_reuse: host time of DFlash's per-step draft-input prepare, stock vs
plugin, one process, same inputs (GPU). alloc_for_spec_decode (the KV allocator the
prepared lengths feed) is stubbed out: both arms share it unchanged.

    python benchmarks/bench_draft_input.py [--json out.json]
"""

import argparse
import json
import random
import statistics
import time

import torch

import os as _os, sys as _sys
_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import abba
from hostsync_drivers.draft_input import BLOCK, Patcher, make_batch, make_req, new_input, plugin_class
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import dflash_info_v2
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2


def sample(cls, bs, steps, mp):
    """(host µs per step, counts per step) over ``steps`` steps after 50 warm-up ones."""
    rng = random.Random(bs)
    batches = [make_batch([make_req(rng, 4) for _ in range(bs)], "cuda", 4) for _ in range(steps + 50)]
    counts = {"pinned": 0, "device": 0}
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):
        if kwargs.get("pin_memory"):
            counts["pinned"] += 1
        elif str(kwargs.get("device", "cpu")) != "cpu":
            counts["device"] += 1
        return real_empty(*args, **kwargs)

    times = []
    with get_context().override_server_args(speculative_num_draft_tokens=BLOCK):
        for i, batch in enumerate(batches):
            if i == 50:
                counts.update(pinned=0, device=0)
                mp.setattr(torch, "empty", counting_empty)
            torch.cuda._sleep(200_000)  # the device is busy, as under overlap
            t0 = time.perf_counter_ns()
            new_input(cls, bs, "cuda", mp).prepare_for_decode(batch)
            if i >= 50:
                times.append((time.perf_counter_ns() - t0) / 1e3)
            if i % 64 == 0:
                torch.cuda.synchronize()
    mp.setattr(torch, "empty", real_empty)
    torch.cuda.synchronize()
    return times, {k: v / steps for k, v in counts.items()}


def pooled(runs):
    times = sorted(x for t, _ in runs for x in t)
    return {"host_us_median": statistics.median(times), "host_us_p90": times[int(0.9 * len(times))],
            "pinned_allocs_per_step": sum(c["pinned"] for _, c in runs) / len(runs),
            "device_allocs_per_step": sum(c["device"] for _, c in runs) / len(runs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved (ABBA) rounds per arm; samples pooled")
    args = ap.parse_args()
    per_round = args.steps // args.rounds
    rows = []
    mp = Patcher()
    try:
        mp.setattr(dflash_info_v2, "alloc_for_spec_decode", lambda *a, **k: None)
        plugin_cls = plugin_class()
        for bs in (1, 4, 16, 32):
            runs = abba({"stock": lambda: sample(DFlashDraftInputV2, bs, per_round, mp),
                         "plugin": lambda: sample(plugin_cls, bs, per_round, mp)}, args.rounds)
            rows.append({"bs": bs, "stock": pooled(runs["stock"]), "plugin": pooled(runs["plugin"])})
    finally:
        mp.undo()
    print(f"draft-input prepare host time per step (us), {torch.cuda.get_device_name()}, "
          f"steps={per_round * args.rounds} in {args.rounds} interleaved rounds per arm")
    print(" bs | stock med    p90  pin/step dev/step | plugin med    p90  pin/step dev/step | med ratio")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        print(f"{r['bs']:>3} | {s['host_us_median']:>9.1f} {s['host_us_p90']:>6.1f} {s['pinned_allocs_per_step']:>8.2f} "
              f"{s['device_allocs_per_step']:>8.2f} | {p['host_us_median']:>10.1f} {p['host_us_p90']:>6.1f} "
              f"{p['pinned_allocs_per_step']:>8.2f} {p['device_allocs_per_step']:>8.2f} | "
              f"{p['host_us_median'] / s['host_us_median']:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
