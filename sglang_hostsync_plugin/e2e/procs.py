"""A server's scheduler processes as Linux's /proc shows them around a timed window: how long their main thread
waited for a CPU (run-queue wait, ``schedstat``), how often it was preempted, and the CPUs it ran on. A busy
scheduler never sleeps, so its CPU time says little; waiting to run is what another process on its CPU, or a
move between CPUs, costs it. Two servers of the same code can differ by several percent in
tok/s/user (2026-12-07): these figures tell host contention and placement from the GPU host's drift. Empty where
/proc cannot be read (another OS, a process gone).

The other arms' servers stay up through each window: ``others`` is their scheduler processes' CPU use over it, in
CPUs (an idle SGLang scheduler polls without sleeping unless started with ``--sleep-on-idle``: about 1 each, one
per server at TP 1)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

SCHEDULER_TITLE = "sglang::scheduler"  # SGLang's setproctitle for each scheduler process


@dataclass(frozen=True)
class Proc:
    title: str
    cpu: int  # the CPU its main thread last ran on
    wait_ns: int  # its main thread's time on a run queue, waiting for a CPU, so far
    preempted: int  # its nonvoluntary context switches so far
    cpu_ticks: int  # the whole process's user + system CPU time so far, in clock ticks


def _read(pid: int, pgids: set[int]) -> tuple[int, Proc] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        # the fields after "(comm)", which may itself hold spaces or parentheses: state, ppid, pgrp, ...
        rest = stat[stat.rindex(")") + 2:].split()
        pgid = int(rest[2])
        if pgid not in pgids:
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0", 1)[0].decode(errors="replace")
        with open(f"/proc/{pid}/schedstat") as f:
            wait_ns = int(f.read().split()[1])
        with open(f"/proc/{pid}/status") as f:
            preempted = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        return pgid, Proc(title, int(rest[36]), wait_ns, preempted, int(rest[11]) + int(rest[12]))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def groups(pgids: Iterable[int]) -> dict[int, dict[int, Proc]]:
    """Every process of each process group in ``pgids`` (servers started in sessions of their own), read in one
    pass over /proc."""
    wanted = set(pgids)
    out: dict[int, dict[int, Proc]] = {g: {} for g in wanted}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if (got := _read(pid, wanted)) is not None:
            out[got[0]][pid] = got[1]
    return out


def others(before: dict[int, Proc], after: dict[int, Proc], span_s: float) -> float | None:
    """CPUs the schedulers among ``after`` (the other arms' servers) used over the ``span_s`` seconds between the
    samples, summed; None without a scheduler seen at both ends."""
    sched = [pid for pid, p in after.items() if p.title.startswith(SCHEDULER_TITLE) and pid in before]
    if not sched or span_s <= 0:
        return None
    ticks = sum(after[p].cpu_ticks - before[p].cpu_ticks for p in sched)
    return round(ticks / os.sysconf("SC_CLK_TCK") / span_s, 3)


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


def arm_window(before: dict[int, dict[int, Proc]], after: dict[int, dict[int, Proc]], timed: int,
               wall_s: float, span_s: float) -> dict | None:
    """``window`` for the timed server's group ``timed`` over its ``wall_s``, with ``others_cpus``: what every
    other group's schedulers used between the two samples (``span_s`` apart, the window and the reads)."""
    out = window(before.get(timed, {}), after.get(timed, {}), wall_s)
    if out is not None:
        def rest(sample: dict[int, dict[int, Proc]]) -> dict[int, Proc]:
            return {pid: p for g, group_ in sample.items() if g != timed for pid, p in group_.items()}

        out["others_cpus"] = others(rest(before), rest(after), span_s)
    return out
