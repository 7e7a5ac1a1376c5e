"""Host cost per forward of SGLang's ``Scheduler._forward_isolation`` (with its
``record_batch_in_overlap``) against slot ``isolation_snapshot``'s hooks, on a real
ScheduleBatch (a distinct object in every field) and a stand-in scheduler and sampling
info. Interleaved repeats; no GPU needed (the methods do no device work).

    TRITON_INTERPRET=1 python benchmarks/bench_isolation_snapshot.py [--calls N] [--repeats R] [--json F]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from types import SimpleNamespace


class _Algo:
    def is_none(self):
        return False


class _SamplingInfo:
    def copy_for_forward(self):
        return _SamplingInfo()


def _batch():
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    b = ScheduleBatch.__new__(ScheduleBatch)
    b.__dict__.update({f.name: object() for f in dataclasses.fields(ScheduleBatch)})
    b.spec_algorithm, b.sampling_info = _Algo(), _SamplingInfo()
    return b


def _arms():
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_hostsync_plugin.slots import isolation_snapshot as iso

    isolation, record = Scheduler._forward_isolation, Scheduler.record_batch_in_overlap
    return {
        "stock": (isolation, record),
        "isolation_snapshot": (lambda s, b, overlap: iso.isolation_hook(isolation, s, b, overlap=overlap),
                               lambda s, b: iso.record_hook(record, s, b)),
    }


def per_forward_us(isolation, record, calls: int) -> float:
    batch = _batch()
    sched = SimpleNamespace(batch_record_ct=0, batch_record_buf=[None, None])
    sched.record_batch_in_overlap = lambda b: record(sched, b)
    t0 = time.perf_counter()
    for _ in range(calls):
        with isolation(sched, batch, overlap=True):
            batch.seq_lens = None  # the worker rebinds fields mid-forward
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    arms = _arms()
    runs: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):  # interleaved: host drift hits both arms alike
        for name, (isolation, record) in arms.items():
            runs[name].append(per_forward_us(isolation, record, args.calls))
    med = {name: statistics.median(v) for name, v in runs.items()}
    for name, v in runs.items():
        print(f"{name:20s} {med[name]:6.2f} µs per forward (runs {', '.join(f'{x:.2f}' for x in v)})")
    print(f"isolation_snapshot / stock: {med['isolation_snapshot'] / med['stock']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": args.calls, "repeats": args.repeats, "runs_us": runs, "median_us": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
