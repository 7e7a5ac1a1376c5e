"""A server's scheduler processes as Linux's /proc shows them around a timed window: how long their main thread
waited for a CPU (run-queue wait, ``schedstat``), how often it was preempted, and the CPUs it ran on. SGLang's
scheduler polls without sleeping, so its CPU time tracks the wall clock; waiting to run is what another process
on its CPU, or a move between CPUs, costs it. Two servers of the same code can differ by several percent in
tok/s/user (2026-12-07): these figures tell host contention and placement from the GPU host's drift. Empty where
/proc cannot be read (another OS, a process gone)."""

from __future__ import annotations

import os
from dataclasses import dataclass

SCHEDULER_TITLE = "sglang::scheduler"  # SGLang's setproctitle for each scheduler process


@dataclass(frozen=True)
class Proc:
    title: str
    cpu: int  # the CPU its main thread last ran on
    wait_ns: int  # its main thread's time on a run queue, waiting for a CPU, so far
    preempted: int  # its nonvoluntary context switches so far


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
        with open(f"/proc/{pid}/schedstat") as f:
            wait_ns = int(f.read().split()[1])
        with open(f"/proc/{pid}/status") as f:
            preempted = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        return Proc(title, int(rest[36]), wait_ns, preempted)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def group(pgid: int) -> dict[int, Proc]:
    """Every process of the process group ``pgid`` (a server started in a session of its own)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    return {pid: p for pid in pids if (p := _read(pid, pgid)) is not None}


def window(before: dict[int, Proc], after: dict[int, Proc], wall_s: float) -> dict | None:
    """The scheduler processes over a window of ``wall_s`` seconds: their run-queue wait as a share of it, their
    preemptions and the CPUs they were on at its ends. None without a scheduler, or where the schedulers
    changed between the samples (one started or ended: its counts do not cover the window)."""
    sched = sorted(pid for pid, p in after.items() if p.title.startswith(SCHEDULER_TITLE))
    if not sched or wall_s <= 0 or sorted(p for p, x in before.items() if x.title.startswith(SCHEDULER_TITLE)) != sched:
        return None
    wait = sum(after[p].wait_ns - before[p].wait_ns for p in sched) / 1e9
    return {"scheduler_wait_share": round(wait / wall_s / len(sched), 5),
            "scheduler_preempted": sum(after[p].preempted - before[p].preempted for p in sched),
            "scheduler_cpus": sorted({x[p].cpu for x in (before, after) for p in sched})}
