"""event_ring, pinned_d2h_ring, accept_lens_snapshot: host time per decode step on
each covered path, stock vs plugin, one process, same inputs (GPU). Also the
per-step Event() constructions and pinned allocations each arm makes.

    python benchmarks/bench_events.py [--steps 2000] [--rounds 4] [--json out.json]

Each arm runs --rounds times with steps/rounds steps, stock and plugin interleaved
ABBA (the host's speed drifts); the samples and counts of all rounds are pooled.

Paths (drivers in sglang_hostsync_plugin/drivers/):
- event_ring: two runners' _publish_read_done, the scheduler's copy_done
  (_copy_auxiliary_output_to_cpu + GenerationBatchResult.copy_to_cpu) and
  _apply_war_barrier;
- pinned_d2h_ring: GenerationBatchResult.copy_to_cpu of a DSpark step's outputs
  (4 tensors) on copy_stream;
- accept_lens_snapshot: DSparkWorkerV2._block_accept_lens + Scheduler._copy_result_to_cpu,
  copy_done from event_ring in the plugin arm as in the default slot set (the plugin
  adds a device copy: a correctness fix, not a speedup).
"""

import argparse
import json
import statistics
import time

import torch

import os as _os, sys as _sys
_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import accept_lens, event_ring as er_driver, pinned_d2h
from hostsync_drivers import Patcher, abba, count_pinned_allocations
from sglang_hostsync_plugin.slots import accept_lens_snapshot as als
from sglang_hostsync_plugin.slots import event_ring as er
from sglang_hostsync_plugin.slots import pinned_d2h_ring as pdr


def stats(values):
    v = sorted(values)
    return {"median": statistics.median(v), "p90": v[int(0.9 * len(v))]}


def pooled(runs):
    """One row from the rounds of an arm: (samples, counts) each."""
    samples = [x for run, _ in runs for x in run]
    counts = {k: sum(c[k] for _, c in runs) / len(runs) for k in runs[0][1]}
    return {**stats(samples), "per_step": counts}


def event_path(plugin, steps):
    device = er_driver.CountingDevice()
    loop = er_driver.Loop(device, plugin=plugin, device="cuda")
    loop.run(50)
    before = device.constructed
    loop.run(steps, start=50)
    loop.drain()
    torch.cuda.synchronize()
    return loop.host_us[50:], {"Event()": (device.constructed - before) / steps}


def pinned_path(plugin, steps):
    patcher = Patcher()
    count = count_pinned_allocations(patcher)
    ring = pdr.PinnedRing()
    if plugin:
        pinned_d2h.install(patcher, ring)
    try:
        loop = pinned_d2h.Loop(seed=3)
        for i in range(50 + steps):
            count.on = i >= 50
            loop.step()
        loop.release(all_=True)
    finally:
        patcher.undo()
    assert loop.mismatches == 0
    return loop.copy_us[50:], {"pinned allocs": count.n / steps}


def accept_path(plugin, steps):
    patcher = Patcher()
    ring = als.SnapshotRing()
    if plugin:
        accept_lens.install(patcher, ring)
    try:
        # The plugin arm is the default slot set: its copy_done events come from event_ring.
        factory = er.EventRing(torch.cuda.Event, er.COPY_DONE_DEPTH).acquire if plugin else None
        loop = accept_lens.Loop("cuda", event_factory=factory)
        for values, expected in accept_lens.random_steps(50 + steps, 4, "cuda"):
            loop.step(values, expected)
        loop.drain()
    finally:
        patcher.undo()
    return loop.host_us[50:], {"mismatches": loop.mismatches / loop.checked}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    per_round = args.steps // args.rounds
    for name, fn in (("event_ring", event_path), ("pinned_d2h_ring", pinned_path),
                     ("accept_lens_snapshot", accept_path)):
        runs = abba({"stock": lambda: fn(False, per_round), "plugin": lambda: fn(True, per_round)}, args.rounds)
        rows.append({"path": name, "stock": pooled(runs["stock"]), "plugin": pooled(runs["plugin"])})
    print(f"host us per decode step, {per_round * args.rounds} steps in {args.rounds} interleaved rounds per arm, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'path':<22} | stock med  p90 | plugin med  p90 | ratio | per step stock -> plugin")
    for r in rows:
        s, p = r["stock"], r["plugin"]
        counts = ", ".join(f"{k} {s['per_step'][k]:.2f} -> {p['per_step'][k]:.2f}" for k in s["per_step"])
        print(f"{r['path']:<22} | {s['median']:>9.1f} {s['p90']:>5.1f} | {p['median']:>10.1f} {p['p90']:>5.1f} | "
              f"{p['median'] / s['median']:>5.2f} | {counts}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name(), "steps": per_round * args.rounds,
                       "rounds": args.rounds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
