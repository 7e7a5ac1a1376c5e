"""A server's processes as Linux's /proc shows them around a timed window: the CPU time its scheduler used and
the CPUs it ran on. Two servers of the same code can differ by a few percent to 13% in tok/s/user (2026-12-07);
a scheduler that needs more CPU per token, or sits on other CPUs, tells host placement from the GPU host's
drift. Empty where /proc cannot be read (another OS, a process gone)."""

from __future__ import annotations

import os
from dataclasses import dataclass

SCHEDULER_TITLE = "sglang::scheduler"  # SGLang's setproctitle for each scheduler process
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Proc:
    cpu_s: float  # user + system time so far, all threads
    cpu: int  # the CPU its main thread last ran on
    title: str


def _read(pid: int, pgid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        # the fields after "(comm)", which may itself hold spaces or parentheses: state, ppid, pgrp, ...
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) != pgid:
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0", 1)[0].decode(errors="replace")
        return Proc((int(rest[11]) + int(rest[12])) / _TICKS, int(rest[36]), title)
    except (OSError, ValueError, IndexError):
        return None


def group(pgid: int) -> dict[int, Proc]:
    """Every process of the process group ``pgid`` (a server started in a session of its own)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    return {pid: p for pid in pids if (p := _read(pid, pgid)) is not None}


def window(before: dict[int, Proc], after: dict[int, Proc], tokens: int) -> dict | None:
    """The scheduler processes' CPU over a window (µs per output token) and the CPUs they were on at its
    ends; None without a scheduler or tokens."""
    sched = [pid for pid, p in after.items() if p.title.startswith(SCHEDULER_TITLE)]
    if not sched or tokens <= 0:
        return None
    used = sum(after[pid].cpu_s - (before[pid].cpu_s if pid in before else 0.0) for pid in sched)
    cpus = sorted({p[pid].cpu for p in (before, after) for pid in sched if pid in p})
    return {"scheduler_cpu_us_per_token": round(used * 1e6 / tokens, 1), "scheduler_cpus": cpus}
