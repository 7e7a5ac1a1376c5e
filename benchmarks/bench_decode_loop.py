"""``python benchmarks/bench_decode_loop.py``: a decode loop, stock vs plugin, one run.

A server runs one speculative algorithm, so the bench runs one loop per algorithm.
Each step drives real SGLang 0.5.23 objects through the code paths that algorithm's
owned slots change: DSpark's target-verify and draft DP-meta staging (DP attention,
dp 8) and block_accept_lens readback,
EAGLE's draft-branch tail copy, DFlash's draft-input prepare, and for all three the
scheduler's read_done / copy_done events (the readback and event paths need CUDA).
The stock arm runs SGLang's code and the plugin arm the default slot set, on the
same inputs; ``--opt-in pinned_d2h_ring`` adds that opt-in slot (and the result
readback path it changes) to every loop.
Then the step replays a captured CUDA graph that stands in for the model forward,
with a set GPU time (``--gpu-step-ms``). Arms run ``--repeats`` times, interleaved
ABBA, and the median run is reported (the host's speed drifts).

As in SGLang's overlap loop, the host waits for step N's results after launching
step N+1, then processes them. That wait is allowlisted, like the ``copy_done``
wait it stands in for.

The audit slot's own classes measure both arms: syncs per step with call sites, the
run-ahead fraction and the launch lead. The output is a table, JSON (``--json``) and
a PNG of the launch lead per step (``--png``). Without CUDA it runs a reduced loop
and reports host µs/step only, and says which figures need a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import os as _os, sys as _sys
_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))  # hostsync_drivers
from hostsync_drivers import abba
from sglang_hostsync_plugin.e2e.png import line_plot
from sglang_hostsync_plugin.slots import audit

# A server runs one algorithm: each step drives the owned slots' paths for that one.
ALGORITHMS = {
    "dspark": ("target_dp_meta", "dspark_dp_meta", "event_ring", "accept_lens_snapshot"),
    "eagle": ("eagle_fixed_shape_tail", "event_ring"),
    "dflash": ("draft_input_reuse", "event_ring"),
}
OPT_IN = ("pinned_d2h_ring",)  # --opt-in adds its path (the result readback) to every loop
PATHS = ("target_dp_meta", "dspark_dp_meta", "eagle_fixed_shape_tail", "draft_input_reuse", "event_ring", "accept_lens_snapshot",
         *OPT_IN)
GPU_PATHS = ("event_ring", "accept_lens_snapshot", *OPT_IN)  # their drivers need CUDA streams and events
GPU_ONLY = ("syncs_per_step", "run_ahead_fraction", "launch_lead_ms", "steps_per_s")
BENCH_ALLOW = (("benchmarks/bench_decode_loop.py", "wait_for_results",
                "the bench's stand-in for result processing's copy_done wait"),)
DP = 8
TOPK, PAGE = 4, 16


def _paths(arm: str, bs: int, device: str, patcher, algorithm: str, opt_in: tuple[str, ...] = ()):
    """``{path: (launch, process)}`` for ``algorithm``'s owned slots, ``arm`` stock or
    plugin: ``launch`` runs in the step, ``process`` (or None) with result processing."""
    import random

    from sglang.srt.speculative import dflash_info_v2
    from sglang.srt.speculative import eagle_worker_common as ewc
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.dspark_components import dspark_draft

    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from hostsync_drivers import dp_meta, draft_input, eagle_tail, target_dp_meta
    from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft

    plugin = arm == "plugin"
    rng = random.Random(bs)
    patcher.setattr(dspark_draft, "enable_num_token_non_padded", lambda: True)
    if plugin:
        _, cls, make_nnp = dp_meta.plugin_classes()
    else:
        cls, make_nnp = dspark_draft.DraftBlockProposer, dp_meta.STOCK_MAKE_NNP
    proposer = dp_meta.make_proposer(cls, device)
    counts = dp_meta.make_batch([bs * 4] * DP, [bs] * DP)

    def dspark():
        dp_meta.step(proposer, counts, bs * 4, device, make_nnp)

    # The target verify batch's DP counts, as ForwardBatch.init_new stages them.
    patcher.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: True)
    target_counts = target_dp_meta.make_schedule_batch([bs * 4] * DP, [bs] * DP)
    verify_spec = target_dp_meta.spec_info(4, 1)
    target_arm = "plugin" if plugin else "stock"

    def target():
        fb = target_dp_meta.make_forward_batch(bs * 4, device, spec=verify_spec, mode=ForwardMode.TARGET_VERIFY)
        target_dp_meta.fill(target_arm, fb, target_counts, device)

    size, args = eagle_tail.make_case(rng, bs, TOPK, PAGE, num_steps=3, device=device)
    pool = eagle_tail.make_pool(size, PAGE, device, 0)
    if plugin:
        def eagle():
            eft.duplicate_prefix_tail(None, pool, *args, TOPK, PAGE)
    else:
        def eagle():
            ewc.duplicate_prefix_tail_to_draft_branches(pool, *args, TOPK, PAGE)

    patcher.setattr(dflash_info_v2, "alloc_for_spec_decode", lambda *a, **k: None)
    if plugin:
        draft_input.fresh_ring(patcher)
    input_cls = draft_input.plugin_class() if plugin else DFlashDraftInputV2
    batch = draft_input.make_batch([draft_input.make_req(rng, 4) for _ in range(bs)], device, 4)

    def dflash():
        draft_input.new_input(input_cls, bs, device, patcher).prepare_for_decode(batch)

    paths = {"target_dp_meta": (target, None), "dspark_dp_meta": (dspark, None), "eagle_fixed_shape_tail": (eagle, None),
             "draft_input_reuse": (dflash, None)}
    wanted = [p for p in (*ALGORITHMS[algorithm], *opt_in) if device == "cuda" or p not in GPU_PATHS]
    if device != "cuda":
        return {p: paths[p] for p in wanted}
    import torch

    from hostsync_drivers import accept_lens, event_ring as er_driver
    from sglang_hostsync_plugin.slots import accept_lens_snapshot as als, event_ring as er

    # The scheduler's events; the previous step's copy_done is waited on in result processing.
    events = er_driver.Loop(er_driver.CountingDevice(), plugin=plugin, device=device)
    step_no = iter(range(1 << 30))

    def event_launch():
        events.launch(next(step_no))

    def event_process():
        while len(events.queue) > 1:
            events.process()

    if plugin:
        accept_lens.install(patcher, als.SnapshotRing())
    factory = er.EventRing(torch.cuda.Event, er.COPY_DONE_DEPTH).acquire if plugin else None
    accept = accept_lens.Loop(device, event_factory=factory)
    lens = accept_lens.random_steps(64, bs, device, max_bs=bs)
    lens_no = iter(range(1 << 30))

    def accept_launch():
        accept.launch(*lens[next(lens_no) % len(lens)])

    def accept_process():
        while len(accept.queue) > 1:
            accept.process(*accept.queue.popleft())

    paths.update(event_ring=(event_launch, event_process), accept_lens_snapshot=(accept_launch, accept_process))
    if "pinned_d2h_ring" in opt_in:
        from hostsync_drivers import pinned_d2h
        from sglang_hostsync_plugin.slots import pinned_d2h_ring as pdr

        if plugin:
            pinned_d2h.install(patcher, pdr.PinnedRing())
        # Both arms read back a DSpark step's 4 outputs; the consumer is result processing.
        readback = pinned_d2h.Loop(seed=bs, check=False)
        paths["pinned_d2h_ring"] = (readback.launch, readback.release)
    return {p: paths[p] for p in wanted}


def sleep_cycles(gpu_step_ms: float) -> int:
    """GPU sleep cycles for ``gpu_step_ms``, measured once after the clocks are up
    (both arms use the same value)."""
    import torch

    for _ in range(20):
        torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * gpu_step_ms / start.elapsed_time(end))


def _forward_graph(cycles: int):
    """A CUDA graph whose replay keeps the GPU busy for ``cycles``."""
    import torch

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    return graph


def wait_for_results(event) -> None:
    event.synchronize()


def run_arm(arm: str, bs: int, steps: int, cycles: int, warmup: int = 20, algorithm: str = "dspark",
            opt_in: tuple[str, ...] = ()) -> dict:
    import torch

    from sglang.srt.runtime_context import get_context

    from hostsync_drivers.draft_input import BLOCK, Patcher

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    patcher = Patcher()
    gc_pauses: list[list[float]] = []  # [step, ms, generation]: host stalls, told apart from syncs
    gc_started = [0]
    sync_audit = None
    host_us: list[float] = []

    def on_gc(phase, info):
        if sync_audit is None:
            return
        if phase == "start":
            gc_started[0] = time.perf_counter_ns()
        else:
            gc_pauses.append([len(host_us), (time.perf_counter_ns() - gc_started[0]) / 1e6, info["generation"]])

    try:
        with get_context().override_server_args(speculative_num_draft_tokens=BLOCK):
            paths = _paths(arm, bs, device, patcher, algorithm, opt_in)
            graph = _forward_graph(cycles) if cuda else None
            stream = torch.cuda.current_stream() if cuda else None
            meter = previous = None
            per_path = {name: [] for name in paths}
            t_start = 0.0
            gc.callbacks.append(on_gc)
            for i in range(warmup + steps):
                if i == warmup:
                    if cuda:
                        torch.cuda.synchronize()
                        previous = None
                    sync_audit = audit.SyncAudit(allowlist=audit.ALLOWLIST + BENCH_ALLOW)
                    sync_audit.arm()
                    meter = audit.RunAheadMeter(sync_audit.state, stream) if cuda else None
                    t_start = time.perf_counter()
                t0 = time.perf_counter_ns()
                for name, (fn, _) in paths.items():
                    t_path = time.perf_counter_ns()
                    fn()
                    if sync_audit is not None:
                        per_path[name].append((time.perf_counter_ns() - t_path) / 1e3)
                if graph is not None:
                    graph.replay()
                done = None
                if cuda:
                    done = torch.cuda.Event()
                    done.record(stream)
                if sync_audit is not None:
                    host_us.append((time.perf_counter_ns() - t0) / 1e3)
                    sync_audit.state.steps += 1
                    if meter is not None:
                        meter.finished_launching()
                        meter.drain()  # the audit's pass does this every PROCESS_EVERY steps; the ring holds 64
                if previous is not None:  # result processing of the step before
                    wait_for_results(previous)
                for _, process in paths.values():
                    if process is not None:
                        process()
                previous = done
            if cuda:
                torch.cuda.synchronize()
                meter.drain()
            wall = time.perf_counter() - t_start
            sync_audit.disarm()
    finally:
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
        patcher.undo()
    summary = sync_audit.state.summary()
    state = sync_audit.state
    leads = list(state.leads)  # summary() collected every pair (and dropped the finish times it used)
    result = {
        "algorithm": algorithm, "arm": arm, "bs": bs, "device": device, "paths": list(paths),
        "host_us_per_step_median": statistics.median(host_us),
        "host_us_per_step_p90": sorted(host_us)[int(0.9 * len(host_us))],
        "host_us_per_path_median": {name: statistics.median(v) for name, v in per_path.items()},
        "gc_pauses": gc_pauses,
        # The 5 slowest steps with each path's share: where host stalls come from.
        "slowest_steps": [
            {"step": i, "host_us": host_us[i], **{name: v[i] for name, v in per_path.items()}}
            for i in sorted(range(len(host_us)), key=host_us.__getitem__)[-5:]
        ],
    }
    if cuda:
        result.update(
            syncs_per_step=summary["syncs_per_step"],
            allowlisted_per_step=summary["allowlisted_per_step"],
            sites=summary["sites"],
            run_ahead_fraction=summary["run_ahead_fraction"],
            launch_lead_ms=summary["launch_lead_ms_median"],
            steps_per_s=steps / wall,
            meter_us_per_step=summary["meter_us_per_step"],
            leads_ms=[lead * 1e3 for lead in leads],
        )
    return result


def merge_repeats(runs: list[dict]) -> dict:
    """The run with the median host time, plus every run's host median and the worst
    run-ahead fraction, syncs and allowlisted waits over all runs."""
    ordered = sorted(runs, key=lambda r: r["host_us_per_step_median"])
    row = dict(ordered[len(ordered) // 2])
    row["host_us_per_step_median_runs"] = [r["host_us_per_step_median"] for r in runs]
    if "run_ahead_fraction" in row:
        row["run_ahead_fraction"] = min(r["run_ahead_fraction"] for r in runs)
        row["syncs_per_step"] = max(r["syncs_per_step"] for r in runs)
        row["allowlisted_per_step"] = max(r["allowlisted_per_step"] for r in runs)
    return row


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(prog="python benchmarks/bench_decode_loop.py")
    ap.add_argument("--algorithms", nargs="+", choices=sorted(ALGORITHMS), default=list(ALGORITHMS))
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--gpu-step-ms", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm, interleaved; the median run is reported")
    ap.add_argument("--opt-in", nargs="*", choices=OPT_IN, default=[],
                    help="also run these opt-in slots (the plugin arm enables them; both arms run their path)")
    ap.add_argument("--json")
    ap.add_argument("--png", help="launch lead per step, stock vs plugin, first algorithm at the first --bs")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    steps = args.steps if cuda else min(args.steps, 20)
    cycles = sleep_cycles(args.gpu_step_ms) if cuda else 0
    rows = []
    for algorithm in args.algorithms:
        for bs in args.bs:
            # ABBA order: this host's speed drifts by up to 2x over seconds.
            runs = abba({arm: (lambda arm=arm: run_arm(arm, bs, steps, cycles, algorithm=algorithm,
                                                       opt_in=tuple(args.opt_in)))
                         for arm in ("stock", "plugin")}, args.repeats)
            rows.extend(merge_repeats(runs[arm]) for arm in ("stock", "plugin"))
    where = torch.cuda.get_device_name() if cuda else "CPU (no CUDA)"
    print(f"hostsync decode-loop bench: {where}; {steps} steps x {args.repeats} interleaved runs per arm; "
          f"GPU step {args.gpu_step_ms} ms"
          + ("" if cuda else " (not run: no GPU)"))
    for algorithm in args.algorithms:
        print(f"  {algorithm}: paths {', '.join((*ALGORITHMS[algorithm], *args.opt_in))}")
    if not cuda:
        print(f"needs a GPU (not reported here): {', '.join(GPU_ONLY)}; paths {', '.join(GPU_PATHS)}")
    print("algo   |  bs | arm    | host us/step med   p90 | syncs/step (+allow) | run-ahead | lead ms | steps/s | host ratio")
    for stock, plugin in zip(rows[::2], rows[1::2]):
        for r in (stock, plugin):
            gpu = (f"{r['syncs_per_step']:>9.2f} (+{r['allowlisted_per_step']:.2f}) | {r['run_ahead_fraction']:>9.3f} | "
                   f"{r['launch_lead_ms']:>7.3f} | {r['steps_per_s']:>7.1f}") if cuda else f"{'-':>19} | {'-':>9} | {'-':>7} | {'-':>7}"
            ratio = r["host_us_per_step_median"] / stock["host_us_per_step_median"]
            print(f"{r['algorithm']:<6} | {r['bs']:>3} | {r['arm']:<6} | {r['host_us_per_step_median']:>12.1f} "
                  f"{r['host_us_per_step_p90']:>6.1f} | {gpu} | {ratio:>10.2f}")
    for r in rows:
        if r["gc_pauses"]:
            worst = max(r["gc_pauses"], key=lambda p: p[1])
            print(f"gc during {r['algorithm']} bs {r['bs']} {r['arm']}: {len(r['gc_pauses'])} collections, longest "
                  f"{worst[1]:.2f} ms (gen {worst[2]}) at step {worst[0]}")
    print("algo   |  bs | path                     | host us stock | plugin | ratio")
    for stock, plugin in zip(rows[::2], rows[1::2]):
        for name in stock["paths"]:
            a, b = stock["host_us_per_path_median"][name], plugin["host_us_per_path_median"][name]
            note = "" if cuda or name != "eagle_fixed_shape_tail" else "  (plugin: Triton interpreter on CPU, not comparable)"
            print(f"{stock['algorithm']:<6} | {stock['bs']:>3} | {name:<24} | {a:>13.1f} | {b:>6.1f} | {b / a:>5.2f}{note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": where,
                       "gpu_step_ms": args.gpu_step_ms, "steps": steps,
                       "algorithms": {a: ALGORITHMS[a] for a in args.algorithms}, "opt_in": args.opt_in,
                       "needs_gpu": [] if cuda else list(GPU_ONLY), "rows": rows}, f, indent=2)
    if args.png and cuda:
        first = args.algorithms[0]
        line_plot(args.png, {r["arm"]: r["leads_ms"] for r in rows if r["bs"] == args.bs[0] and r["algorithm"] == first})
    return 0


if __name__ == "__main__":
    sys.exit(main())
