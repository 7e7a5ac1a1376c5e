"""Does a pageable ``copy_(non_blocking=True)`` H2D block the host while its stream is
busy? (Issue 15 item 4: ``eagle_prepare_for_decode`` copies ``cur_kv_lens_cpu`` /
``nxt_kv_lens_cpu``, pageable int32 tensors, this way on the schedule stream, which
the WAR barrier chains behind the previous forward.)

For each case a ~50 ms sleep kernel first occupies the stream (or, for ``chained``,
another stream the copy's stream waits on, as the WAR barrier does); then the host
times one 64-byte H2D issued behind it, pageable or pinned, and checks what arrived
after it overwrote the source right after the call returned. A call that takes about
the sleep's length blocked the host; a pageable copy that returns at once but
delivers the overwritten value would be a correctness hazard.

    python benchmarks/bench_pageable_h2d.py [--json out.json] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def one(torch, kind: str, pinned: bool, sleep_cycles: int) -> dict:
    dev = torch.device("cuda")
    busy = torch.cuda.Stream()
    copy_stream = torch.cuda.Stream() if kind == "chained" else busy
    src = torch.arange(16, dtype=torch.int32)  # 64 bytes
    if pinned:
        src = src.pin_memory()
    dst = torch.zeros(16, dtype=torch.int32, device=dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(sleep_cycles)
    if kind == "chained":
        copy_stream.wait_stream(busy)
    with torch.cuda.stream(copy_stream):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        call_ms = (time.perf_counter() - t0) * 1e3
        src.fill_(-1)  # the host reuses the buffer at once
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    wait_ms = (time.perf_counter() - t1) * 1e3
    arrived = dst.cpu().tolist()
    return {"call_ms": call_ms, "remaining_gpu_ms": wait_ms, "delivered_original": arrived == list(range(16))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sleep-ms", type=float, default=50.0)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA")
        return 0
    # Calibrate the sleep kernel's cycles to about --sleep-ms.
    torch.cuda.synchronize()
    cycles = 10_000_000
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    per_cycle = (time.perf_counter() - t0) / cycles
    cycles = int(args.sleep_ms / 1e3 / per_cycle)
    rows = []
    for kind in ("same_stream", "chained"):
        for pinned in (False, True):
            runs = [one(torch, kind, pinned, cycles) for _ in range(args.repeats)]
            rows.append({"case": kind, "source": "pinned" if pinned else "pageable",
                         "call_ms_median": statistics.median(r["call_ms"] for r in runs),
                         "call_ms_max": max(r["call_ms"] for r in runs),
                         "gpu_ms_left_after_call_median": statistics.median(r["remaining_gpu_ms"] for r in runs),
                         "delivered_original_value": all(r["delivered_original"] for r in runs)})
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; sleep kernel ~{args.sleep_ms:.0f} ms, "
          f"{args.repeats} repeats")
    print("| case | source | copy_ call ms (median, max) | GPU ms left after the call | value delivered |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['source']} | {r['call_ms_median']:.3f}, {r['call_ms_max']:.3f} | "
              f"{r['gpu_ms_left_after_call_median']:.1f} | {'original' if r['delivered_original_value'] else 'OVERWRITTEN'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
