"""Stock vs the DP-meta slots, one process, same inputs, arms interleaved.

- ``dspark``: a draft DP-meta step (ForwardBatch's num_token_non_padded H2D +
  ``DraftBlockProposer._fill_dp_moe_sync_metadata``), stock vs ``dspark_dp_meta``.
- ``target``: ``ForwardBatch._init_num_token_non_padded`` + ``init_mlp_sync_metadata``
  as ``ForwardBatch.init_new`` runs them, stock vs ``target_dp_meta``.
- ``prepare``: ``ForwardBatch.prepare_mlp_sync_batch`` (the eager forward's DP
  padding, a decode batch of 4), stock vs ``target_dp_meta``'s edited method.

Each plugin slot runs twice: with the stager's copies issued from Python
(``plugin-py``) and from csrc (``plugin-cuda``, where it builds). Reported: host
time per step (median, p90), H2D copies and pinned host allocations per step, and
the ratio to stock. Two regimes: GPU idle, and GPU busy (the host runs ahead of
~2 ms kernels, as under spec-v2 overlap). Arms run in chunks of --chunk steps,
order reversed every chunk (ABBA), so host speed drift hits every arm alike.
Usage: python benchmarks/bench_dp_meta.py [--json PATH] [--steps N] [--chunk N]
"""

import argparse
import json
import random
import statistics
import time

import torch

from sglang_hostsync_plugin import csrc
import os as _os, sys as _sys
_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import Patcher, dp_meta, target_dp_meta as tdrv
from sglang_hostsync_plugin.slots import target_dp_meta as tdm
from sglang_hostsync_plugin.staging import TwoSlotStager

from sglang.srt.model_executor import forward_batch_info
from sglang.srt.speculative.dspark_components import dspark_draft

# The DP-attention / EP layout, where both sides stage num_token_non_padded.
dspark_draft.enable_num_token_non_padded = lambda: True
forward_batch_info.enable_num_token_non_padded = lambda: True
DEV = "cuda"


def _host_allocs():
    try:
        return torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    except Exception:
        return -1


def dspark_arms(impls):
    _, plugin_cls, plugin_nnp = dp_meta.plugin_classes()
    arms = {"stock": (dp_meta.make_proposer(dspark_draft.DraftBlockProposer, DEV), dp_meta.STOCK_MAKE_NNP)}
    for impl in impls:
        p = dp_meta.make_proposer(plugin_cls, DEV)
        p._hs_stager = TwoSlotStager(rows=2, scalar=True, impl=impl)
        arms[f"plugin-{impl}"] = (p, plugin_nnp)

    def make_step(arm):
        proposer, make_nnp = arms[arm]

        def step(batch, fb):
            fb.global_num_token_non_padded = make_nnp(fb.input_ids.numel(), DEV)
            proposer._fill_dp_moe_sync_metadata(fb, batch)
        return step

    def inputs(counts):
        return [(dp_meta.make_batch(g, lp), dp_meta.make_forward_batch(32, DEV, lambda n, d: None)) for g, lp in counts]
    return {arm: make_step(arm) for arm in arms}, inputs


def target_arms(impls):
    stagers = {f"plugin-{impl}": (TwoSlotStager(rows=2, fresh_device=True, impl=impl),
                                  TwoSlotStager(rows=1, dtype=torch.int32, fresh_device=True, impl=impl))
               for impl in impls}
    spec = tdrv.spec_info()

    def make_step(arm):
        if arm == "stock":
            return lambda batch, fb: tdrv.fill("stock", fb, batch, DEV)
        counts, non_padded = stagers[arm]

        def step(batch, fb):
            tdm._counts, tdm._non_padded = counts, non_padded
            tdrv.fill("plugin", fb, batch, DEV)
        return step

    def inputs(counts):
        return [(tdrv.make_schedule_batch(g, lp), tdrv.make_forward_batch(32, DEV, spec=spec)) for g, lp in counts]
    return {arm: make_step(arm) for arm in ["stock", *stagers]}, inputs


def prepare_arms(impls):
    stagers = {f"plugin-{impl}": TwoSlotStager(rows=1, fresh_device=True, impl=impl) for impl in impls}
    model_runner = tdrv.make_model_runner()

    def make_step(arm):
        if arm == "stock":
            return lambda batch, fb: tdrv.prepare("stock", fb, model_runner)
        padded = stagers[arm]

        def step(batch, fb):
            tdm._padded = padded
            tdrv.prepare("plugin", fb, model_runner)
        return step

    def inputs(counts):
        return [(None, tdrv.make_decode_batch(4, DEV, [4, *g[1:]])) for g, _ in counts]
    return {arm: make_step(arm) for arm in ["stock", *stagers]}, inputs


def count_h2d(step, pairs):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for batch, fb in pairs:
            step(batch, fb)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "HtoD" in e.name and e.device_type.name == "CUDA") / len(pairs)


def run(side, dp, busy, steps, chunk, impls):
    steps_by_arm, inputs = {"dspark": dspark_arms, "target": target_arms, "prepare": prepare_arms}[side](impls)
    rng = random.Random(dp)
    counts = [([rng.randint(0, 64) for _ in range(dp)], [rng.randint(0, 8) for _ in range(dp)]) for _ in range(steps)]
    arms = list(steps_by_arm)
    data = {arm: inputs(counts) for arm in arms}
    for arm in arms:  # warm-up: stagers allocate, csrc builds, caches fill
        for batch, fb in inputs(counts[:200]):
            steps_by_arm[arm](batch, fb)
    torch.cuda.synchronize()
    times = {arm: [] for arm in arms}
    allocs = {arm: 0 for arm in arms}
    for c, start in enumerate(range(0, steps, chunk)):
        for arm in (arms if c % 2 == 0 else arms[::-1]):
            step, t = steps_by_arm[arm], times[arm]
            if busy:
                torch.cuda._sleep(4_000_000)  # ~2 ms of device work the host runs ahead of
            a0 = _host_allocs()
            for batch, fb in data[arm][start:start + chunk]:
                t0 = time.perf_counter_ns()
                step(batch, fb)
                t.append(time.perf_counter_ns() - t0)
            allocs[arm] += _host_allocs() - a0
            torch.cuda.synchronize()
    row = dict(side=side, dp=dp, gpu="busy" if busy else "idle")
    for arm in arms:
        q = statistics.quantiles(times[arm], n=10)
        row[arm] = dict(median_us=statistics.median(times[arm]) / 1e3, p90_us=q[8] / 1e3,
                        h2d_per_step=count_h2d(steps_by_arm[arm], inputs(counts[:100])),
                        pinned_allocs_per_step=allocs[arm] / steps)
    for arm in arms[1:]:
        row[arm]["ratio_median"] = row[arm]["median_us"] / row["stock"]["median_us"]
        row[arm]["ratio_p90"] = row[arm]["p90_us"] / row["stock"]["p90_us"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    missing = csrc.unavailable_reason()
    impls = ["python"] if missing else ["python", "cuda"]
    patcher = Patcher()
    tdrv.stand_in_parallel_state(patcher, DEV)  # prepare_mlp_sync_batch's parallel state (MAX_LEN padding)
    rows = [run(side, dp, busy, args.steps, args.chunk, impls)
            for side in ("dspark", "target", "prepare") for dp in (2, 8, 16, 32) for busy in (False, True)]
    patcher.undo()
    print(f"DP-meta host time per step (us), {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"steps={args.steps}, chunk={args.chunk}" + (f"; no csrc arm: {missing}" if missing else ""))
    print(f"{'side':>6} {'dp':>3} {'gpu':>4} | {'arm':>13} {'med':>7} {'p90':>7} {'H2D':>4} {'pinA':>5} | {'med ratio':>9} {'p90 ratio':>9}")
    for r in rows:
        for arm in ["stock", *(f"plugin-{i}" for i in impls)]:
            a = r[arm]
            ratios = f"{a['ratio_median']:>9.3f} {a['ratio_p90']:>9.3f}" if arm != "stock" else f"{'':>9} {'':>9}"
            print(f"{r['side']:>6} {r['dp']:>3} {r['gpu']:>4} | {arm:>13} {a['median_us']:>7.2f} {a['p90_us']:>7.2f} "
                  f"{a['h2d_per_step']:>4.1f} {a['pinned_allocs_per_step']:>5.2f} | {ratios}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
