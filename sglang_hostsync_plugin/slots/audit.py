"""Slot ``audit`` (tool, not in ``default``): count host syncs and measure run-ahead.

Sync audit. Armed at the scheduler's first ``run_batch``, which comes after CUDA
graph capture. It counts every synchronizing CUDA operation on the scheduler thread
and names the call site. torch's sync-debug mode is process-global, so the audit
sets it to "warn" (keeping "error" when set) and routes the warnings itself. Syncs
on other threads are neither counted nor printed: those threads run as with the mode
off, and the audit stays armed. Allowlisted call sites (the intended ``copy_done``
waits in result processing) are counted apart, each with its reason.

Run-ahead meter. For each step N it records a CUDA event on the forward stream
after ``run_batch`` returns; the event marks step N's GPU finish. The host launch
time of a step is when its ``run_batch`` returned, i.e. when all of its work is
enqueued: a sync inside ``run_batch`` moves it after the previous step's finish. It maps the event
onto the host clock through one reference event taken when the audit is armed:
host_time = t_ref + elapsed_ms(ref, event) / 1e3. The launch lead is step N's GPU
finish minus the host launch time of step N+1. It is positive when the host was
already a step ahead. The run-ahead fraction is the share of steps with a positive
lead. Events come from a ring and are read back only once they have completed, so
the meter itself never waits. The fraction counts every measured pair; the median lead
is over the last ``LEADS_KEPT`` of them (the audit's memory and per-summary work stay
bounded in a long run).

Only pairs of decode steps count towards the lead and the run-ahead fraction: the
step before a prefill, or before the first step after the scheduler idled, waits for
requests, not for the host. ``run_ahead_after_ramp`` is the fraction over the pairs more
than ``RAMP_STEPS`` decode steps after a prefill: each prefill restarts the pipeline with
the GPU idle, so with short requests the first pairs after it miss however little host
work a step takes, and this figure is the steady state.

A summary goes to SGLang's log every ``SGLANG_HOSTSYNC_AUDIT_EVERY`` steps (default
1000) and when the scheduler process exits normally (Ctrl-C). SGLang's own server
stop kills its scheduler processes (SIGTERM without a handler, or SIGKILL), so a
server stopped that way logs no last summary: for a short run set the step count
to one the run reaches, or read the trace. With ``SGLANG_HOSTSYNC_AUDIT_JSON=<path>``, the same summary
is written there as JSON. With ``SGLANG_HOSTSYNC_AUDIT_TRACE=<path>``, one line per
step is appended there (``TRACE_HEADER``; written in batches of ``TRACE_BATCH`` lines once
each step's GPU finish is known, and at once when the scheduler idles (its ``on_idle``), so the
lines of a finished load are on disk when the next request runs): the end-to-end benchmark cuts it
into its measurement windows by host time (``time.perf_counter_ns``, the same monotonic clock in
every process). In a server of
several scheduler processes (TP, PP, DP ranks) rank 0 writes these paths and rank r
``<root>.rank<r><ext>`` (``rank_path``).
Host µs per step is the scheduler thread's CPU time between two step launches; a
blocking sync that spins counts in it. Neither output ever raises into the serving
loop: a write that fails is logged once and that output is switched off. Nor does the
audit's own code: an error in it is logged once and the audit switches itself off.

Cost. Per step the hook takes the launch time, the thread's CPU time and the decode flag
and records the meter's event; the rest (mapping completed events, the attribution, the
trace lines, the leads) runs in one pass every ``PROCESS_EVERY`` steps and once when the
scheduler idles (SGLang's ``Scheduler.on_idle``; not between a new request's prefill and its
first decode step, where it ran up to 7.7 ms on the critical path, H100 2026-12-06). Per-step
state is dropped once its pair is collected and its line formatted, so memory stays bounded in
a long-running server.

Phase attribution (``audit_phases``): the host time of each step window by phase,
and the part of it that ran while the GPU was idle, ranked in the summary and per
step in the trace.

What the sync audit cannot see: torch's sync-debug mode flags synchronizing torch
calls only. A wait inside the CUDA driver (a blocking ``cudaMemcpy`` in a C++
extension; a pageable ``copy_(non_blocking=True)`` if the driver had to wait to stage
it, which a 64-byte one did not on the H200: ``benchmarks/bench_pageable_h2d.py``) is
not reported as a sync; it shows up as host time in the phase table and as a shorter
launch lead.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import math
import os
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck
from . import audit_phases as phases

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "audit"
RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
ENV_EVERY = "SGLANG_HOSTSYNC_AUDIT_EVERY"
ENV_JSON = "SGLANG_HOSTSYNC_AUDIT_JSON"
ENV_TRACE = "SGLANG_HOSTSYNC_AUDIT_TRACE"
# v3: integer ns on perf_counter_ns (-1: not measured); phases ``name:host_ns:idle_ns``. Integers
# because formatting floats was most of the audit's per-step cost. v1/v2 lines (seconds, µs) still parse.
TRACE_HEADER = "#hostsync-audit-trace v3\tstep\tt_launch_ns\tt_finish_ns\tdecode\thost_ns\tsites\tgpu_idle_ns\tphases\n"
SYNC_MESSAGE = "called a synchronizing CUDA operation"

# (path suffix, function, reason): syncs that are meant to be there.
ALLOWLIST = (
    ("managers/scheduler_components/batch_result_processor.py", "process_batch_result_decode",
     "copy_done: waits for the step's D2H result copy before the tokens are read (as EAGLE3 spec-v2)"),
    ("managers/scheduler_components/batch_result_processor.py", "process_batch_result_prefill",
     "copy_done: the prefill result copy, same wait"),
    ("managers/scheduler_components/batch_result_processor.py", "advance_grammar_fsm",
     "copy_done: grammar requests need the sampled ids on the host"),
)
EVENT_RING = 64  # timing events in flight; a step's is read back once complete
ENV_MARKS = "SGLANG_HOSTSYNC_AUDIT_MARKS"
MARK_RING = 1024  # GPU markers in flight: about two per timed call, read back once complete
MARK_SLACK_NS = 20_000  # a marker within this of the least record-to-execution latency found the stream drained,
MARK_SLACK_SHARE = 0.05  # or within this share of the time since the previous marker (an idle GPU runs it later)
LEADS_KEPT = 65536  # the median lead is over the most recent pairs
# Decode steps after a prefill before a pair counts as steady state: each prefill restarts the
# pipeline with the GPU idle and the host a step behind (the e2e's ramp table uses the same).
RAMP_STEPS = 10
TRACE_BATCH = 64  # trace lines per write
# Steps between the attribution / trace / lead passes (and one when the scheduler idles). Prime, so the
# pass lands in a timed phase window (1 in SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY) as often as in any
# window: with 16 and the default 8, every other timed window held a whole pass in ``other``.
PROCESS_EVERY = 17
IDLE_S = 0.05  # a step window this long follows an idle scheduler: a pass there unless on_idle made one


# --- run-ahead arithmetic (pure, CPU-testable) ---------------------------------

def launch_leads(gpu_finish: dict[int, float], host_launch: list[float],
                 decode: list[bool] | None = None) -> list[float]:
    """lead[N] = GPU finish of step N - host launch of step N+1 (seconds, one clock),
    for every step N whose finish was measured and that has a next launch; with
    ``decode`` (per step), only where steps N and N+1 are both decode steps."""
    return [
        gpu_finish[n] - host_launch[n + 1]
        for n in sorted(gpu_finish)
        if n + 1 < len(host_launch) and (decode is None or (decode[n] and decode[n + 1]))
    ]


def run_ahead_fraction(leads: list[float]) -> float:
    return sum(lead > 0 for lead in leads) / len(leads) if leads else 0.0


def event_to_host(t_ref: float, elapsed_ms: float) -> float:
    """Host-clock time of an event ``elapsed_ms`` after the reference event."""
    return t_ref + elapsed_ms / 1e3


# --- the audit -----------------------------------------------------------------

@dataclass
class SyncSite:
    where: str
    count: int = 0
    allowed: str = ""  # the allowlist reason, when allowlisted


@dataclass
class AuditState:
    thread_id: int | None = None
    steps: int = 0
    syncs: dict[str, SyncSite] = field(default_factory=dict)
    foreign_syncs: int = 0  # seen on other threads (not counted, not printed)
    # step -> host launch time (s) / is a decode step; both pruned once the step's pair is collected
    host_launch: dict[int, float] = field(default_factory=dict)
    decode: dict[int, bool] = field(default_factory=dict)
    step_sites: list[str] = field(default_factory=list)  # counted syncs since the last launch
    # step -> host-clock time; entries before the last resolved step are dropped once used
    gpu_finish: dict[int, float] = field(default_factory=dict)
    gpu_begin: dict[int, float] = field(default_factory=dict)  # timed windows: step -> when its run_batch began on the GPU
    leads: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LEADS_KEPT))
    lead_pairs: int = 0  # decode pairs measured, all of them
    leads_ahead: int = 0  # of which with a positive lead
    lead_next: int = 0  # the next step whose lead is collected
    decode_run: int = 0  # decode steps since the last prefill, up to step lead_next - 1
    steady_pairs: int = 0  # decode pairs more than RAMP_STEPS decode steps after a prefill
    steady_ahead: int = 0  # of which with a positive lead
    meter_ns: int = 0  # host time the meter itself spent
    # GPU markers (SGLANG_HOSTSYNC_AUDIT_MARKS): timed step -> [(recorded ns, executed ns)], a step
    # that lost one (ring full) in marks_lost; their record calls' host time in the window.
    marks: dict[int, list] = field(default_factory=dict)
    marks_lost: set = field(default_factory=set)
    mark_ns: dict[int, int] = field(default_factory=dict)
    marked_windows: int = 0
    mark_latency_ns: float = 0.0  # a marker's record-to-execution on a drained stream (measured at arm time)
    # Phase attribution: step -> (window, segments) until its idle interval is known,
    # then step -> (gpu idle ns, {phase: (host ns, idle ns)}) for the trace.
    pending_segments: dict[int, tuple] = field(default_factory=dict)
    phase_rows: dict[int, tuple] = field(default_factory=dict)
    phase_totals: phases.PhaseTotals = field(default_factory=phases.PhaseTotals)
    phase_calls: int = 0  # timed calls, all windows
    timed_windows: int = 0
    phase_call_ns: float = 0.0
    phase_pass_ns: float = 0.0
    phase_every: int = 1
    # timed step -> (the audit's own work, of which the attribution) per step, averaged over the
    # steps since the previous timed one
    own_cost_ns: dict[int, tuple[float, float]] = field(default_factory=dict)
    bookkeeping_total_ns: int = 0
    attribution_total_ns: int = 0
    book_mark: tuple[int, int, int] = (0, 0, 0)  # (step, bookkeeping_total_ns, attribution_total_ns) at the last timed window
    idle_pass_at: int = -1  # ``steps`` when on_idle last made the pass

    def counted(self) -> int:
        return sum(s.count for s in self.syncs.values() if not s.allowed)

    def allowed(self) -> int:
        return sum(s.count for s in self.syncs.values() if s.allowed)

    def collect_leads(self, upto: int) -> None:
        """Leads of the steps <= ``upto`` not yet collected; what no later pair or window needs is
        dropped after (the audit's memory stays bounded in a long run)."""
        last = min(upto, self.steps - 2)
        launch, decode = self.host_launch, self.decode
        run = self.decode_run
        for n in range(self.lead_next, last + 1):
            run = run + 1 if not decode or decode[n] else 0
            finish = self.gpu_finish.get(n)
            if finish is not None and (not decode or (decode[n] and decode[n + 1])):
                lead = finish - launch[n + 1]
                self.leads.append(lead)
                self.lead_pairs += 1
                self.leads_ahead += lead > 0
                if run > RAMP_STEPS:
                    self.steady_pairs += 1
                    self.steady_ahead += lead > 0
        self.decode_run = run
        for n in range(self.lead_next - 1, last):  # step ``last``'s finish is the next pair's
            self.gpu_finish.pop(n, None)
            self.gpu_begin.pop(n, None)
            launch.pop(n, None)  # pending windows are all past ``last``: they read from decode[last] on
            decode.pop(n, None)
        self.lead_next = max(self.lead_next, last + 1)

    def clock_ns_per_step(self) -> float:
        """The phase timers' cost per step: the timed calls, and as many passing through in
        each untimed step as a timed window averaged."""
        if not self.timed_windows:
            return 0.0
        untimed = max(0, self.steps - self.timed_windows)
        calls = self.phase_calls / self.timed_windows
        return (self.phase_calls * self.phase_call_ns + untimed * calls * self.phase_pass_ns) / max(self.steps, 1)

    def summary(self, upto: int | None = None) -> dict:
        self.collect_leads(self.steps - 1 if upto is None else upto)
        leads = list(self.leads)
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "syncs_per_step": self.counted() / steps,
            "allowlisted_per_step": self.allowed() / steps,
            "sites": sorted(
                ({"where": s.where, "count": s.count, "allowlisted": s.allowed} for s in self.syncs.values()),
                key=lambda d: -d["count"],
            ),
            "foreign_thread_syncs": self.foreign_syncs,
            "run_ahead_fraction": self.leads_ahead / self.lead_pairs if self.lead_pairs else 0.0,
            # the same past the first RAMP_STEPS decode steps after each prefill (None before any)
            "run_ahead_after_ramp": self.steady_ahead / self.steady_pairs if self.steady_pairs else None,
            "ramp_steps": RAMP_STEPS,
            "launch_lead_ms_median": statistics.median(leads) * 1e3 if leads else None,
            "measured_steps": self.lead_pairs,
            "meter_us_per_step": self.meter_ns / steps / 1e3,
            "marked_windows": self.marked_windows,
            "mark_latency_us": self.mark_latency_ns / 1e3,
            "phase_every": self.phase_every,
            "timed_windows": self.timed_windows,
            "phase_clock_us_per_step": self.clock_ns_per_step() / 1e3,
            # What that estimate is made of: one timed call, one passing call (calibrated at arm
            # time), and the calls a timed window made on average.
            "phase_call_ns": self.phase_call_ns,
            "phase_pass_ns": self.phase_pass_ns,
            "phase_calls_per_timed_window": self.phase_calls / self.timed_windows if self.timed_windows else 0.0,
            "bookkeeping_us_per_step": self.bookkeeping_total_ns / steps / 1e3,
            "attribution_us_per_step": self.attribution_total_ns / steps / 1e3,
            "attribution": self.phase_totals.summary(),
        }

    def settle(self, upto: int) -> None:
        """Attribute every pending step <= ``upto`` (decode pairs whose idle interval is known)."""
        if not self.pending_segments:
            return
        t_start = time.perf_counter_ns()
        for step in [k for k in self.pending_segments if k <= upto]:
            (w0, w1), segments, calls = self.pending_segments.pop(step)
            book, attribution = self.own_cost_ns.pop(step, (0.0, 0.0))
            finish, begin = self.gpu_finish.get(step - 1), self.gpu_begin.get(step)
            marks, lost, mark_ns = self.marks.pop(step, None), step in self.marks_lost, self.mark_ns.pop(step, 0)
            self.marks_lost.discard(step)
            previous = self.decode.get(step - 1)
            if finish is None or begin is None or previous is None or not self.decode.get(step):
                continue
            window = (w0 * 1e9, w1 * 1e9)  # the segments are perf_counter_ns
            idle = [(finish * 1e9, begin * 1e9)] if begin > finish else []
            if marks and not lost:
                # In-step idle: where the stream drained between two phase transitions (NGRAM's and
                # FlashInfer's wait inside run_batch, stock code's syncs), not only before run_batch.
                idle = phases.idle_intervals(idle + phases.idle_from_marks(marks, self.mark_latency_ns, MARK_SLACK_NS,
                                                                                     MARK_SLACK_SHARE))
                self.marked_windows += 1
            row = phases.attribute(segments, window, idle)
            # Per-step averages (timed and passing calls; bookkeeping), not this window's own cost.
            every = self.phase_every
            row[phases.CLOCK] = (calls * (self.phase_call_ns + (every - 1) * self.phase_pass_ns) / every, 0.0)
            row[phases.BOOKKEEPING] = (book, 0.0)
            row[phases.ATTRIBUTION] = (attribution, 0.0)
            if mark_ns:
                row[phases.MARKS] = (mark_ns, 0.0)
            idle_ns = sum(phases.overlap(*window, a, b) for a, b in idle)  # the part inside this step's window
            if previous:  # the first decode step after a prefill goes to the trace only (its window holds the prefill's)
                self.phase_totals.add(window[1] - window[0], idle_ns, row)
            self.phase_rows[step] = (idle_ns, row)
        self.attribution_total_ns += time.perf_counter_ns() - t_start


def _allow_reason(filename: str, function: str, allowlist=ALLOWLIST) -> str:
    path = filename.replace(os.sep, "/")
    for suffix, fn, reason in allowlist:
        if path.endswith(suffix) and function == fn:
            return reason
    return ""


class SyncAudit:
    """Counts sync warnings raised on one thread; see the module docstring."""

    def __init__(self, allowlist=ALLOWLIST):
        self.state = AuditState()
        self.allowlist = tuple(allowlist)
        self.armed = False
        self._lock = threading.Lock()
        self._previous_showwarning = None
        self._previous_mode = None
        self._filter = None

    def arm(self, thread_id: int | None = None) -> None:
        import torch

        if self.armed:
            return
        self.state.thread_id = threading.get_ident() if thread_id is None else thread_id
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._showwarning
        # "always": every sync is reported, not only the first per call site.
        warnings.filterwarnings("always", message=f".*{SYNC_MESSAGE}.*")
        self._filter = warnings.filters[0]
        if torch.cuda.is_available():
            self._previous_mode = torch.cuda.get_sync_debug_mode()
            if self._previous_mode == 0:
                torch.cuda.set_sync_debug_mode("warn")
        self.armed = True

    def disarm(self) -> None:
        import torch

        if not self.armed:
            return
        warnings.showwarning = self._previous_showwarning
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            notify = getattr(warnings, "_filters_mutated", None)  # private; absent on some Pythons
            if notify is not None:
                notify()
        if self._previous_mode is not None and torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(self._previous_mode)
        self.armed = False

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_MESSAGE not in str(message):
            return self._previous_showwarning(message, category, filename, lineno, file, line)
        if threading.get_ident() != self.state.thread_id:
            with self._lock:
                self.state.foreign_syncs += 1
            return None
        function, caller = _caller_function(filename, lineno)
        where = f"{_short(filename)}:{lineno} ({function})" + (f" <- {caller}" if caller else "")
        with self._lock:
            site = self.state.syncs.get(where)
            if site is None:
                site = self.state.syncs[where] = SyncSite(where, allowed=_allow_reason(filename, function, self.allowlist))
            site.count += 1
            if not site.allowed:
                self.state.step_sites.append(where)
        return None


def _caller_function(filename: str, lineno: int) -> tuple[str, str]:
    """The warning frame's function, and for a sync raised inside torch (e.g.
    ``Stream.synchronize``) the first frame outside it, which names the real site."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == filename and frame.f_lineno == lineno:
            caller = frame.f_back if _in_torch(filename) else None
            while caller is not None and _in_torch(caller.f_code.co_filename):
                caller = caller.f_back
            where = (f"{_short(caller.f_code.co_filename)}:{caller.f_lineno} ({caller.f_code.co_name})"
                     if caller is not None else "")
            return frame.f_code.co_name, where
        frame = frame.f_back
    return "?", ""


def _in_torch(filename: str) -> bool:
    return "/torch/" in filename.replace(os.sep, "/")


def _short(filename: str) -> str:
    path = filename.replace(os.sep, "/")
    for root in ("/sglang/", "/sglang_hostsync_plugin/", "/torch/"):
        if root in path:
            return root.strip("/") + "/" + path.rsplit(root, 1)[1]
    return path


class RunAheadMeter:
    """Per-step GPU-finish events mapped to the host clock (see module docstring)."""

    def __init__(self, state: AuditState, stream):
        import torch

        self.state = state
        self.stream = stream
        self.ring = [torch.cuda.Event(enable_timing=True) for _ in range(EVENT_RING)]
        self.pending: collections.deque = collections.deque()  # (event index, step, is_begin)
        self.free = list(range(EVENT_RING))
        self.mark_ring: list = []
        self.mark_pending: collections.deque = collections.deque()  # (event index, step, recorded ns)
        self.mark_free: list[int] = []
        self.ref = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        self.ref.record(stream)
        self.ref.synchronize()
        self.t_ref = time.perf_counter_ns() / 1e9

    def enable_marks(self, size: int = MARK_RING, probes: int = 15) -> None:
        """The marker ring, and a drained stream's record-to-execution latency (the median of
        ``probes`` markers each recorded after a synchronize), the reference ``idle_from_marks`` needs."""
        import torch

        self.mark_ring = [torch.cuda.Event(enable_timing=True) for _ in range(size)]
        self.mark_free = list(range(size))
        latencies = []
        probe = self.mark_ring[0]
        for _ in range(probes):
            self.stream.synchronize()
            recorded = time.perf_counter_ns()
            probe.record(self.stream)
            probe.synchronize()
            latencies.append(event_to_host(self.t_ref, self.ref.elapsed_time(probe)) * 1e9 - recorded)
        self.state.mark_latency_ns = statistics.median(latencies)

    def began(self, step: int) -> None:
        """Step ``step``'s run_batch starts (a timed window's): where the GPU resumes after an idle gap."""
        t0 = time.perf_counter_ns()
        if self.free:
            index = self.free.pop()
            self.ring[index].record(self.stream)
            self.pending.append((index, step, True))
        self.state.meter_ns += time.perf_counter_ns() - t0

    def mark(self, t_ns: int) -> None:
        """A GPU marker at a phase transition of a timed window (``PhaseClock.marker``)."""
        t0 = time.perf_counter_ns()
        state = self.state
        step = state.steps
        if self.mark_free:
            index = self.mark_free.pop()
            try:
                self.mark_ring[index].record(self.stream)
            except Exception:  # noqa: BLE001  (called inside SGLang's functions: never raise into serving)
                logger.exception("hostsync audit: a GPU marker failed; markers are off in this process from now on")
                clock = phases.armed()
                if clock is not None:
                    clock.marker = None
                self.mark_free = []  # a call already under way (a phase's exit) takes the lost branch
                state.marks_lost.add(step)
                return
            self.mark_pending.append((index, step, t_ns))
        else:
            state.marks_lost.add(step)
        spent = time.perf_counter_ns() - t0
        state.mark_ns[step] = state.mark_ns.get(step, 0) + spent
        state.meter_ns += spent

    def finished_launching(self) -> None:
        """The step just counted (``state.steps - 1``) has all its work enqueued."""
        t0 = time.perf_counter_ns()
        step = self.state.steps - 1
        self.state.host_launch[step] = t0 / 1e9
        if self.free:
            index = self.free.pop()
            self.ring[index].record(self.stream)
            self.pending.append((index, step, False))
        self.state.meter_ns += time.perf_counter_ns() - t0

    def drain(self) -> None:
        """Maps every completed event, oldest first, onto the host clock (never waits)."""
        t0 = time.perf_counter_ns()
        pending, ring, ref = self.pending, self.ring, self.ref
        while pending and ring[pending[0][0]].query():
            index, step, is_begin = pending.popleft()
            # A step whose event was skipped (ring full) has no entry and no lead.
            times = self.state.gpu_begin if is_begin else self.state.gpu_finish
            times[step] = event_to_host(self.t_ref, ref.elapsed_time(ring[index]))
            self.free.append(index)
        marks, mark_ring, marks_of = self.mark_pending, self.mark_ring, self.state.marks
        while marks and mark_ring[marks[0][0]].query():
            index, step, recorded = marks.popleft()
            executed = event_to_host(self.t_ref, ref.elapsed_time(mark_ring[index])) * 1e9
            marks_of.setdefault(step, []).append((recorded, executed))
            self.mark_free.append(index)
        self.state.meter_ns += time.perf_counter_ns() - t0


@dataclass(frozen=True)
class TraceStep:
    step: int
    t_launch: float  # host clock, seconds
    t_finish: float  # GPU finish on the host clock; nan when not measured
    decode: bool
    host_us: float  # scheduler-thread CPU time since the previous launch; nan for the first
    sites: tuple[str, ...]  # counted (not allowlisted) syncs since the previous launch
    gpu_idle_us: float = math.nan  # GPU idle before this step's run_batch (attributed steps)
    phases: dict = field(default_factory=dict)  # phase -> (host µs, of which GPU idle µs)


MISSING = -1  # a v3 trace value that was not measured


def trace_line(step: int, launch_ns: int, finish_ns: int, decode: bool, host_ns: int, sites,
               idle_ns: float, phase_ns: dict | None) -> str:
    """One v3 trace line (see ``TRACE_HEADER``); ``phase_ns``: phase -> (host ns, of which GPU idle ns)."""
    site_cell = ";".join(s.replace(";", ",").replace("\t", " ") for s in sites) if sites else ""
    phase_cell = ",".join(["%s:%d:%d" % (k, h, i) for k, (h, i) in phase_ns.items()]) if phase_ns else ""
    return "%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n" % (step, launch_ns, finish_ns, decode, host_ns, site_cell,
                                                idle_ns, phase_cell)


def _ns(value: float, scale: float) -> int:
    return MISSING if math.isnan(value) else round(value * scale)


def format_trace_line(t: TraceStep) -> str:
    return trace_line(t.step, _ns(t.t_launch, 1e9), _ns(t.t_finish, 1e9), t.decode, _ns(t.host_us, 1e3), t.sites,
                      _ns(t.gpu_idle_us, 1e3), {k: (round(h * 1e3), round(i * 1e3)) for k, (h, i) in t.phases.items()})


def _from_ns(cell: str, scale: float) -> float:
    value = int(cell)
    return math.nan if value == MISSING else value / scale


def parse_trace(text: str) -> list[TraceStep]:
    """The steps of a trace file, in step order (a torn last line is dropped). Reads v3 lines and
    the v1/v2 lines of earlier runs (seconds and µs as decimals)."""
    steps = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        cells = line.split("\t")
        if len(cells) not in (6, 8):  # v1 lines have no attribution
            continue
        sites = tuple(x for x in cells[5].split(";") if x)
        try:
            if "." in cells[1]:  # v1 / v2
                extra = (float(cells[6]), phases.parse_phases(cells[7])) if len(cells) == 8 else ()
                steps.append(TraceStep(int(cells[0]), float(cells[1]), float(cells[2]), cells[3] == "1",
                                       float(cells[4]), sites, *extra))
            else:
                cell = phases.parse_phases(cells[7])
                steps.append(TraceStep(int(cells[0]), _from_ns(cells[1], 1e9), _from_ns(cells[2], 1e9),
                                       cells[3] == "1", _from_ns(cells[4], 1e3), sites, _from_ns(cells[6], 1e3),
                                       {k: (h / 1e3, i / 1e3) for k, (h, i) in cell.items()}))
        except ValueError:  # torn
            continue
    return sorted(steps, key=lambda t: t.step)


class _Output:
    """A file the audit writes; the first failure is logged and switches it off."""

    def __init__(self, path: str | None):
        self.path = path or None
        self.broken = False

    def write(self, text: str, append: bool) -> None:
        if self.path is None or self.broken:
            return
        try:
            with open(self.path, "a" if append else "w") as f:
                f.write(text)
        except OSError as exc:
            self.broken = True
            logger.error("hostsync audit: cannot write %s (%s); this output is off from now on", self.path, exc)


class Trace:
    """Per-step records, formatted once each step's GPU finish is resolved and written in batches
    to a file kept open (see the module docstring)."""

    def __init__(self, path: str | None):
        self.out = _Output(path)
        self.pending: collections.deque = collections.deque()  # (step, t_launch, decode, host_us, sites)
        self.lines: list[str] = []
        self.file = None
        self.out.write(TRACE_HEADER, append=False)
        if self.on:
            try:
                self.file = open(self.out.path, "a")
            except OSError as exc:
                self._broke(exc)

    @property
    def on(self) -> bool:
        return self.out.path is not None and not self.out.broken

    def _broke(self, exc: OSError) -> None:
        self.out.broken = True
        self.pending.clear()
        self.lines = []
        logger.error("hostsync audit: cannot write %s (%s); this output is off from now on", self.out.path, exc)

    def add(self, step: int, t_launch: float, decode: bool, host_ns: int, sites: list[str]) -> None:
        if self.on:
            self.pending.append((step, t_launch, decode, host_ns, sites))

    def flush(self, gpu_finish: dict[int, float], upto: int, phase_rows: dict[int, tuple] | None = None,
              write: bool = True) -> int:
        """Formats the steps <= ``upto``; writes the formatted lines out when ``write`` or when a batch is full.
        Returns the ns spent formatting the lines that carry an attribution."""
        rows = {} if phase_rows is None else phase_rows
        pending, lines = self.pending, self.lines
        attributed_ns = 0
        while pending and pending[0][0] <= upto:
            step, t_launch, decode, host_ns, sites = pending.popleft()
            finish = gpu_finish.get(step)
            idle_ns, row = rows.pop(step, (MISSING, None)) if rows else (MISSING, None)
            t0 = time.perf_counter_ns() if row else 0
            lines.append(trace_line(step, int(t_launch * 1e9), MISSING if finish is None else int(finish * 1e9),
                                    decode, host_ns, sites, idle_ns, row))
            if row:
                attributed_ns += time.perf_counter_ns() - t0
        if rows:
            for step in [k for k in rows if k <= upto]:  # no trace line waits for them (trace off)
                del rows[step]
        if lines and self.file is not None and (write or len(lines) >= TRACE_BATCH):
            try:
                self.file.write("".join(lines))
                self.file.flush()
            except OSError as exc:
                self._broke(exc)
            self.lines = []
        return attributed_ns


_audit: SyncAudit | None = None
_meter: RunAheadMeter | None = None
_trace: Trace | None = None
_json: _Output | None = None
_every = 1000
_last_thread_ns: int | None = None
_broken = False  # the audit's own code failed once: its hooks only pass through


def _resolved_upto() -> int:
    """The last step whose GPU finish is known or will never be (no event)."""
    last = _audit.state.steps - 1
    if _meter is not None and _meter.pending:
        last = min(last, _meter.pending[0][1] - 1)
    if _meter is not None and _meter.mark_pending:  # a step is attributed once its markers are back too
        last = min(last, _meter.mark_pending[0][1] - 1)
    return last


def _log_summary(reason: str) -> None:
    if _audit is None or _broken:
        return
    state = _audit.state
    if _meter is not None:
        _meter.drain()
    upto = _resolved_upto() if reason != "shutdown" else state.steps
    state.settle(upto)
    if _trace is not None:
        state.attribution_total_ns += _trace.flush(state.gpu_finish, upto, state.phase_rows)
    summary = state.summary(upto)
    logger.info("hostsync audit (%s): %s", reason, json.dumps(summary))
    if summary["attribution"]["attributed_steps"]:
        logger.info("hostsync audit (%s): host time by phase, ranked by GPU-idle time\n%s", reason,
                    format_attribution(summary["attribution"]))
    if _json is not None:
        _json.write(json.dumps(summary, indent=2), append=False)


def format_attribution(attribution: dict) -> str:
    lines = [f"  {attribution['attributed_steps']} decode steps; window {attribution['window_us_per_step']:.0f} us/step, "
             f"GPU idle {attribution['gpu_idle_us_per_step']:.0f} us/step",
             f"  {'phase':<16} {'host us/step':>12} {'in GPU idle':>12} {'share of idle':>14}"]
    for r in attribution["phases"]:
        lines.append(f"  {r['phase']:<16} {r['host_us_per_step']:>12.1f} {r['gpu_idle_us_per_step']:>12.1f} "
                     f"{r['share_of_gpu_idle']:>14.1%}")
    return "\n".join(lines)


def _is_decode(batch) -> bool:
    mode = getattr(batch, "forward_mode", None)  # None: a stand-in batch (tests)
    return True if mode is None else bool(mode.is_decode())


def rank_path(path: str | None, rank: int) -> str | None:
    """Rank 0 writes ``path``; rank r of a multi-process server ``<root>.rank<r><ext>``, so the
    ranks' schedulers never write one file."""
    if not path or rank == 0:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _arm(scheduler) -> None:
    global _audit, _meter, _every, _trace, _json
    _audit = SyncAudit()
    _every = summary_every()
    rank = _global_rank()
    _json = _Output(rank_path(os.environ.get(ENV_JSON), rank))
    _trace = Trace(rank_path(os.environ.get(ENV_TRACE), rank))
    _audit.arm()
    state = _audit.state
    clock = phases.arm(state.thread_id, phases.enabled(os.environ))
    if clock is not None:
        state.phase_call_ns, state.phase_pass_ns = clock.call_ns, clock.pass_ns
        state.phase_every = phases.phase_every(os.environ)
    import torch

    if torch.cuda.is_available():
        _meter = RunAheadMeter(state, scheduler.forward_stream)
        if clock is not None and marks_enabled(os.environ):
            _meter.enable_marks()
            clock.marker = _meter.mark
    atexit.register(_log_summary, "shutdown")


def _process(write: bool) -> None:
    """Attributes, formats and collects what the meter has resolved since the last pass: in one
    pass every ``PROCESS_EVERY`` steps, which costs the scheduler less than a little every step."""
    state = _audit.state
    if _meter is not None:
        _meter.drain()
    upto = _resolved_upto()
    state.settle(upto)
    state.attribution_total_ns += _trace.flush(state.gpu_finish, upto, state.phase_rows, write=write)
    state.collect_leads(upto)


def run_batch_hook(original, scheduler, batch=None, *args, **kwargs):
    if _broken:
        return original(scheduler, batch, *args, **kwargs)
    clock = None
    try:
        if _audit is None:
            _arm(scheduler)
        clock = phases.clock()  # None unless this step's window is timed
        if clock is not None:
            if _meter is not None:
                _meter.began(_audit.state.steps)
            clock.enter(phases.RUN_BATCH)
    except Exception:
        _break()
        return original(scheduler, batch, *args, **kwargs)
    try:
        result = original(scheduler, batch, *args, **kwargs)
    finally:
        if clock is not None:
            clock.exit()
    try:
        _account(batch, clock)
    except Exception:
        _break()
    return result


def on_idle_hook(original, scheduler, *args, **kwargs):
    """SGLang calls ``on_idle`` on every loop turn without a batch: the first one after a step makes
    the pass and writes the trace out (later ones again while a step's GPU finish is still unknown).
    Before SGLang's own: under ``--sleep-on-idle`` that ends asleep until the next request arrives."""
    if _audit is not None and not _broken:
        try:
            state = _audit.state
            if state.idle_pass_at != state.steps or _resolved_upto() < state.steps - 1:
                t0 = time.perf_counter_ns()
                _process(write=True)
                state.idle_pass_at = state.steps
                state.bookkeeping_total_ns += time.perf_counter_ns() - t0
        except Exception:
            _break()
    return original(scheduler, *args, **kwargs)


def _break() -> None:
    """A failure of the audit's own code: logged once, the audit switched off, serving goes on."""
    global _broken
    _broken = True
    logger.exception("hostsync audit: its own bookkeeping failed; the audit is off in this process from now on")
    phases.disarm()
    if _audit is not None:
        try:
            _audit.disarm()
        except Exception:  # noqa: BLE001  (restoring the warning hooks must not raise into serving either)
            pass


def _account(batch, clock) -> None:
    """The audit's work after a step's ``run_batch`` returned (``@audit``)."""
    global _last_thread_ns
    state = _audit.state
    t_book = time.perf_counter_ns()
    now_thread = time.thread_time_ns()
    host_ns = MISSING if _last_thread_ns is None else now_thread - _last_thread_ns
    _last_thread_ns = now_thread
    step = state.steps
    decode = state.decode[step] = _is_decode(batch)
    state.steps += 1
    if _meter is not None:
        _meter.finished_launching()
    else:
        state.host_launch[step] = time.perf_counter_ns() / 1e9
    launches = state.host_launch
    sites = state.step_sites
    if sites:
        state.step_sites = []
    _trace.add(step, launches[step], decode, host_ns, sites or ())
    if clock is not None:
        window = (launches[step - 1] if step else launches[step], launches[step])
        state.pending_segments[step] = (window, clock.take(), clock.calls - state.phase_calls)
        state.phase_calls = clock.calls
        state.timed_windows += 1
        mark_step, mark_ns, mark_attr = state.book_mark
        if step > mark_step:  # the audit's work per step since the last timed window (that ran in these)
            n = step - mark_step
            state.own_cost_ns[step] = ((state.bookkeeping_total_ns - mark_ns) / n,
                                       (state.attribution_total_ns - mark_attr) / n)
        state.book_mark = (step, state.bookkeeping_total_ns, state.attribution_total_ns)
    # A loop that idles without on_idle: the pass after its first step.
    idle = step > 0 and state.idle_pass_at != step and launches[step] - launches[step - 1] > IDLE_S
    if idle or state.steps % PROCESS_EVERY == 0:
        _process(write=idle)
    elif _meter is not None and len(_meter.mark_pending) > MARK_RING // 2:
        _meter.drain()  # every window timed with many phases: the markers come back before their ring runs out
    if state.steps % _every == 0:
        _log_summary(f"every {_every} steps")
    if phases.armed() is not None:
        phases.time_windows(state.steps % state.phase_every == 0)  # the next step's window
    state.bookkeeping_total_ns += time.perf_counter_ns() - t_book


def summary_every(env=None) -> int:
    from ..config import env_count

    return env_count(ENV_EVERY, 1000, env)


def check_outputs(env=None) -> None:
    """Raises ValueError when a file output's path cannot be written (at startup,
    so a bad path never surfaces inside the serving loop)."""
    env = os.environ if env is None else env
    for name in (ENV_JSON, ENV_TRACE):
        path = env.get(name)
        if not path:
            continue
        if os.path.isdir(path):
            raise ValueError(f"{name}={path!r} is a directory; give a file path")
        existed = os.path.exists(path)
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            raise ValueError(f"{name}={path!r} cannot be written: {exc.strerror or exc}") from None
        if not existed:
            os.remove(path)


def marks_enabled(env) -> bool:
    from ..config import env_bool

    return env_bool(ENV_MARKS, False, env)


def check_config(env=None) -> None:
    summary_every(env)
    check_outputs(env)
    env = os.environ if env is None else env
    phases.enabled(env)
    phases.phase_every(env)
    marks_enabled(env)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.TOOL,
    origin="hostsync",
    summary="sync audit (per thread, with allowlist) and run-ahead meter on the scheduler's decode loop",
    default=False,
    precheck=config_precheck(check_config),
    targets=(
        HookTarget(RUN_BATCH, TargetKind.FUNCTION, hook=run_batch_hook,
                   params=("self", "batch", "pp_proxy_tensors"), source_sha="4e9bb4d5e649e2f1"),
        HookTarget(ON_IDLE, TargetKind.FUNCTION, hook=on_idle_hook, params=("self",), source_sha="7b36d7bcce30e1b2"),
        *phases.phase_targets(phases.PHASES),
    ),
)
