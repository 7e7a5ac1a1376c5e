"""Stock vs dspark_dp_meta, one process, same inputs: host time per draft DP-meta
step (ForwardBatch's num_token_non_padded H2D + _fill_dp_moe_sync_metadata) and
H2D copies / pinned host allocations per step.

Two regimes: GPU idle (every copy has finished when the host comes back) and GPU
busy (the host runs ahead of a 2 ms kernel, as under spec-v2 overlap).
Usage: python benchmarks/bench_dp_meta.py [--json PATH] [--steps N]
"""

import argparse
import json
import random
import statistics
import time

import torch

from sglang_hostsync_plugin.drivers.dp_meta import STOCK_MAKE_NNP, make_batch, make_forward_batch, make_proposer, plugin_classes

from sglang.srt.speculative.dspark_components import dspark_draft

dspark_draft.enable_num_token_non_padded = lambda: True  # the DP-attention / EP layout


def _host_allocs():
    try:
        return torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    except Exception:
        return -1


def run_arm(proposer, make_nnp, batches, fbs, busy: bool):
    times = []
    allocs0 = _host_allocs()
    for i, (b, fb) in enumerate(zip(batches, fbs)):
        if busy and i % 200 == 0:
            torch.cuda._sleep(4_000_000)  # ~2 ms of device work the host runs ahead of
        t0 = time.perf_counter_ns()
        fb.global_num_token_non_padded = make_nnp(fb.input_ids.numel(), "cuda")
        proposer._fill_dp_moe_sync_metadata(fb, b)
        times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return times, _host_allocs() - allocs0


def count_h2d(proposer, make_nnp, batches, fbs):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for b, fb in zip(batches, fbs):
            fb.global_num_token_non_padded = make_nnp(fb.input_ids.numel(), "cuda")
            proposer._fill_dp_moe_sync_metadata(fb, b)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "HtoD" in e.name and e.device_type.name == "CUDA") / len(batches)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    _, plugin_cls, plugin_nnp = plugin_classes()
    rows = []
    for dp in (2, 8, 16, 32):
        for busy in (False, True):
            rng = random.Random(dp)
            batches = [make_batch([rng.randint(0, 64) for _ in range(dp)], [rng.randint(0, 8) for _ in range(dp)])
                       for _ in range(args.steps)]
            res = {}
            arms = {"stock": (dspark_draft.DraftBlockProposer, STOCK_MAKE_NNP), "plugin": (plugin_cls, plugin_nnp)}
            for name, (cls, mk) in arms.items():
                p = make_proposer(cls, "cuda")
                warm = [make_forward_batch(32, "cuda", lambda n, d: None) for _ in range(200)]
                run_arm(p, mk, batches[:200], warm, busy)
                fbs = [make_forward_batch(32, "cuda", lambda n, d: None) for _ in range(args.steps)]
                times, allocs = run_arm(p, mk, batches, fbs, busy)
                fbs2 = [make_forward_batch(32, "cuda", lambda n, d: None) for _ in range(100)]
                h2d = count_h2d(p, mk, batches[:100], fbs2)
                q = statistics.quantiles(times, n=10)
                res[name] = dict(median_us=statistics.median(times) / 1e3, p90_us=q[8] / 1e3,
                                 h2d_per_step=h2d, pinned_allocs_per_step=allocs / args.steps)
            rows.append(dict(dp=dp, gpu="busy" if busy else "idle", **{f"{k}_{m}": v for k, r in res.items() for m, v in r.items()},
                             ratio_median=res["plugin"]["median_us"] / res["stock"]["median_us"],
                             ratio_p90=res["plugin"]["p90_us"] / res["stock"]["p90_us"]))
    hdr = f"{'dp':>3} {'gpu':>4} | {'stock med':>9} {'p90':>7} {'H2D':>4} {'pinA':>5} | {'plugin med':>10} {'p90':>7} {'H2D':>4} {'pinA':>5} | {'med ratio':>9} {'p90 ratio':>9}"
    print(f"dspark_dp_meta host time per step (us), {torch.cuda.get_device_name()}, torch {torch.__version__}, steps={args.steps}")
    print(hdr)
    for r in rows:
        print(f"{r['dp']:>3} {r['gpu']:>4} | {r['stock_median_us']:>9.2f} {r['stock_p90_us']:>7.2f} {r['stock_h2d_per_step']:>4.1f} {r['stock_pinned_allocs_per_step']:>5.2f} | "
              f"{r['plugin_median_us']:>10.2f} {r['plugin_p90_us']:>7.2f} {r['plugin_h2d_per_step']:>4.1f} {r['plugin_pinned_allocs_per_step']:>5.2f} | "
              f"{r['ratio_median']:>9.3f} {r['ratio_p90']:>9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
