"""Sync sites, run-ahead and host time per decode step from audit traces (the e2e
benchmark's ``*.trace.tsv[.xz]``), over every decode step a server ran: also the
greedy-identity and warm-up traffic, which the e2e tables leave out.

    python benchmarks/trace_sites.py DIR [--skip 5]     # every trace in DIR

Under ``benchmarks/results/`` the traces are inside the run folder's ``raw.tar.xz``; they are read
from there (``raw_archive.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

from sglang_hostsync_plugin.e2e.stats import audit_figures
from sglang_hostsync_plugin.slots.audit import parse_trace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raw_archive  # noqa: E402


def _read(path: str) -> str:
    return raw_archive.read_text(path)


def summarize(path: str, skip: int) -> str:
    decode = [s for s in parse_trace(_read(path)) if s.decode][skip:]
    fig = audit_figures(decode)
    if not fig["steps"]:
        return f"{os.path.basename(path)}: no decode steps"

    def r(v, nd=2):
        return "-" if v is None else f"{v:.{nd}f}"

    lines = [f"{os.path.basename(path)}: {fig['steps']} decode steps, syncs/step {r(fig['syncs_per_step'])}, "
             f"run-ahead {r(fig['run_ahead_fraction'], 3)}, lead ms median {r(fig['launch_lead_ms_median'])}, "
             f"host us/step median {r(fig['host_us_per_step_median'], 0)}"]
    lines += [f"    {v:.2f}  {site}" for site, v in fig["sync_sites"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--skip", type=int, default=5, help="leading decode steps to leave out (warm-up)")
    args = ap.parse_args()
    paths = [os.path.join(args.dir, n) for n in raw_archive.listdir(args.dir) if n.endswith((".trace.tsv", ".trace.tsv.xz"))]
    if not paths:
        raise SystemExit(f"no *.trace.tsv[.xz] in {args.dir}")
    for p in paths:
        print(summarize(p, args.skip))


if __name__ == "__main__":
    main()
