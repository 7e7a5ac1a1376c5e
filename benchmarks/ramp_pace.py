"""``python benchmarks/ramp_pace.py TRACE [--steps N]``: the host's pace after each prefill in an
audit trace (``SGLANG_HOSTSYNC_AUDIT_TRACE``, v1-v3, plain or ``.xz``; one of ``benchmarks/results/``
is read from its run folder's ``raw.tar.xz``, ``raw_archive.py``).

One line per prefill: its launch time, the start lead (the prefill's GPU finish minus the first
decode step's launch, ms) and, for the next ``--steps`` decode steps, ``gap/cpu/lead``: the
launch-to-launch gap, the scheduler thread's CPU time over it (both ms) and the step's launch
lead against the previous step's GPU finish. While the host is behind the GPU (negative lead)
the gap is the host's own time per step, so a slow stretch of the host reads directly here.
The e2e report's ramp table has the pooled figures; this is the per-request view behind them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sglang_hostsync_plugin.slots.audit import parse_trace  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raw_archive  # noqa: E402


def ramps(steps, n: int) -> list[dict]:
    """Per prefill followed by a decode step: start lead and the first ``n`` decode steps."""
    out = []
    for k, s in enumerate(steps[:-1]):
        nxt = steps[k + 1]
        if s.decode or not nxt.decode or nxt.step != s.step + 1:
            continue
        row = {"prefill": s.step, "t_launch": s.t_launch,
               "start_lead_ms": (s.t_finish - nxt.t_launch) * 1e3 if not math.isnan(s.t_finish) else math.nan,
               "steps": []}
        for j in range(k + 2, min(k + 2 + n, len(steps))):
            a, b = steps[j - 1], steps[j]
            if not (a.decode and b.decode and b.step == a.step + 1):
                break
            row["steps"].append({"gap_ms": (b.t_launch - a.t_launch) * 1e3, "cpu_ms": b.host_us / 1e3,
                                 "lead_ms": (a.t_finish - b.t_launch) * 1e3})
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=6, help="decode steps shown after each prefill")
    args = ap.parse_args(argv)
    steps = parse_trace(raw_archive.read_text(args.trace))
    for r in ramps(steps, args.steps):
        cells = " ".join(f"{s['gap_ms']:.1f}/{s['cpu_ms']:.1f}/{s['lead_ms']:+.1f}" for s in r["steps"])
        print(f"prefill {r['prefill']:>6} at {r['t_launch']:9.2f} s  start {r['start_lead_ms']:+6.1f} ms | {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
