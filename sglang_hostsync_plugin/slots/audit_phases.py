"""Part of slot ``audit``: where the scheduler thread's host time goes, by phase, and
how much of it ran while the GPU sat idle (the host-work attribution).

Phase clock. Each function in ``PHASES`` gets an AROUND hook (a target of the audit
slot; those in ``FINE_PHASES``, ``BLOCK_PHASES`` and ``NGRAM_PHASES`` are slots ``audit_fine``'s,
``audit_block``'s and ``audit_ngram``'s); on the scheduler thread it opens its phase on entry and
closes it on exit.
Time is exclusive: while a nested phase runs its parent's clock stops, so a step's
phases plus ``other`` (the loop's own code between them) add up to its host window,
the time between two step launches. Each stretch of one phase is a segment
``(phase, t0_ns, t1_ns)`` on ``time.perf_counter_ns``.

GPU idle. Besides the finish event after ``run_batch``, the meter records a begin
event when ``run_batch`` starts. For step k the GPU was idle over
``[finish(k-1), begin(k)]`` when begin > finish (both on the host clock): an event
recorded on an idle stream executes at once, and one recorded behind work executes
after it. Host segments of step k's window that overlap that interval are the host
time on the critical path. Decode->decode pairs make the per-step table, as for the leads; the
window of the first decode step after a prefill (from the prefill's launch) goes to the trace only.

Sampling. The clock times one step window in ``SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY``
(default 8; 1 times every step); in the other windows its hooks only pass through. The
table is over the timed windows, and the GPU-idle interval of a timed window is known
because the meter records its begin event for timed windows only.

GPU markers (``SGLANG_HOSTSYNC_AUDIT_MARKS=1``, off by default). The begin event cannot see idle
inside a step: a wait or sync inside ``run_batch`` (NGRAM's and FlashInfer's resolve, stock code's
syncs) drains the stream after the begin event executed, and the GPU then idles while the host
prepares. With markers the meter records an event at every phase transition of a timed window;
between two transitions the stream idled when the later marker found it drained
(``idle_from_marks``), and those intervals join the begin interval. Kernels launched between two
transitions are taken as short, so a drained stretch bounds the idle from above.

Cost. A timed call costs two ``perf_counter_ns`` calls and one list append more than a
passing one; both go through SGLang's AROUND wrapper and the installer's gate. At arm time
the clock measures both through that same chain (``call_ns``, ``pass_ns``), and the audit
reports their per-step average as ``@clock``; the audit's own work after each ``run_batch``
(meter, trace, this attribution) is timed and reported per step as ``@audit`` (it lies inside
``other``; its pass when the scheduler idles, counted too, lies between step windows), and the
attribution's part of it (its arithmetic and its trace cells) as ``@attribution``. All are
averages over every step, timed or not. Where the host sets the pace, an audited arm is slower
than the same slots without it: compare host figures between audited arms only.
``SGLANG_HOSTSYNC_AUDIT_PHASES=0`` turns the clock off (its hooks then only pass through).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..slot import HookTarget, TargetKind

ENV_PHASES = "SGLANG_HOSTSYNC_AUDIT_PHASES"
ENV_PHASE_EVERY = "SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY"
DEFAULT_PHASE_EVERY = 8
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
EAGLE_COMMON = "sglang.srt.speculative.eagle_worker_common"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
DECODE_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
SEQ_LENS_RESOLVE = "seq_lens_resolve"  # the per-step wait for step N-1, wherever a slot moves it (run_as)
STEP_GRAPH_LAUNCH = "step_graph_launch"  # a step graph's one launch (eagle_step_graph.launch_graph, run_as)

# (phase, function): scheduler loop, EAGLE-family v2 draft / verify / draft extend, the
# target graph runner's per-replay metadata load. "run_batch" is the audit's own hook.
PHASES: tuple[tuple[str, str], ...] = (
    ("ingest", f"{SCHEDULER}.ingest_requests"),
    ("schedule", f"{SCHEDULER}.get_next_batch_to_run"),
    ("result", f"{SCHEDULER}.process_batch_result"),
    ("sample_launch", f"{SCHEDULER}.launch_batch_sample_if_needed"),
    # Inside run_batch, every spec-v2 algorithm: where a backend that plans on the host (FlashInfer) or
    # NGRAM waits for the previous step (its synchronize spins, so that wait counts as CPU time too).
    (SEQ_LENS_RESOLVE, "sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu"),
    ("decode_prep", f"{EAGLE_UTILS}.eagle_prepare_for_decode"),
    ("draft", "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"),
    ("draft_prep", f"{EAGLE_COMMON}.prepare_for_draft"),
    ("draft_graph", "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute"),
    ("verify_input", f"{EAGLE_COMMON}.build_eagle_verify_input"),
    ("verify", f"{EAGLE_COMMON}.run_eagle_verify"),
    ("verify_prep", f"{EAGLE_UTILS}.eagle_prepare_for_verify"),
    ("graph_load", f"{DECODE_RUNNER}.load_batch"),
    ("graph_execute", f"{DECODE_RUNNER}.execute"),
    ("draft_extend", "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"),
    # SGLang's SGLANG_SIMULATE_ACC_LEN acceptance (benchmarks only: real serving never calls it); its
    # length draw samples on the CPU, about 180 µs a step on the H200, timed apart from verify.
    ("simulate", "sglang.srt.speculative.spec_utils.generate_simulated_accept_index"),
)
# Inside the phases above (which part of verify / draft extend / run_batch): the
# targets of slot ``audit_fine``, which doubles the timed calls per step.
FINE_PHASES: tuple[tuple[str, str], ...] = (
    ("worker", "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
    ("resolve_inputs", "sglang.srt.managers.overlap_utils.resolve_forward_inputs"),
    ("relay_payload", f"{SCHEDULER}._relay_forward_payload"),
    ("copy_result", f"{SCHEDULER}._copy_result_to_cpu"),
    ("target_forward", "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"),
    ("verify_sample", f"{EAGLE_UTILS}.eagle_sample"),
    ("verify_commit", "sglang.kernels.ops.speculative.eagle.prepare_verify_commit_outputs"),
    ("verify_logprobs", "sglang.srt.layers.logprob_processor.compute_spec_logprobs"),
    ("tree_compact", f"{EAGLE_COMMON}._finalize_accept_tree_path"),
    ("draft_extend_prep", f"{EAGLE_COMMON}.prepare_for_draft_extend"),
    ("draft_extend_graph",
     "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.execute"),
)
# The DFlash family's steps (DFLASH, DSPARK), which call none of the EAGLE functions above but
# the scheduler's and the target graph runner's: the targets of slot ``audit_block``. A name may
# time several functions (each family's function of that role).
DFLASH = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
DSPARK = "sglang.srt.speculative.dspark_components"
BLOCK_PHASES: tuple[tuple[str, str], ...] = (
    # DFlash keeps its draft prep, draft sampling head and verify input in this one function.
    ("block_worker", f"{DFLASH}.forward_batch_generation"),
    ("block_verify_prep", "sglang.srt.speculative.dflash_info.DFlashVerifyInput.prepare_for_verify"),
    ("block_accept", f"{DFLASH}._accept_block"),
    ("block_kv_append", f"{DFLASH}._append_target_hidden_to_draft_kv_by_loc"),
    ("block_next_input", f"{DFLASH}._make_next_draft_input_decode"),
    ("simulate", "sglang.srt.speculative.dflash_utils.apply_dflash_simulated_acceptance"),
    ("block_worker", f"{DSPARK}.dspark_worker_v2.DSparkWorkerV2.forward_batch_generation"),
    ("block_draft", f"{DSPARK}.dspark_draft.DraftBlockProposer.propose"),
    ("block_verify_prep", f"{DSPARK}.dspark_worker_v2.DSparkWorkerV2._stage_target_verify_metadata"),
    ("block_plan", f"{DSPARK}.dspark_planner.DSparkVerifyPlanner.schedule_layout"),
    ("block_verify", f"{DSPARK}.dspark_verify.TargetVerifyExecutor.run_non_compact"),
    ("block_verify", f"{DSPARK}.dspark_verify.TargetVerifyExecutor.run_compact"),
    ("block_accept", f"{DSPARK}.dspark_verify.TargetVerifyExecutor.accept_and_finalize"),
    ("block_kv_append", f"{DSPARK}.dspark_verify.TargetVerifyExecutor.commit_hidden"),
    ("block_next_input", f"{DSPARK}.dspark_draft.make_next_draft_input"),
    ("simulate", f"{DSPARK}.dspark_verify.TargetVerifyExecutor.begin_simulated_step"),
    # Draft and target forwards alike: the model runner's own glue around the graph runner's load and replay.
    ("model_forward", "sglang.srt.model_executor.model_runner.ModelRunner.forward"),
)
# NGRAM's step (slot ``audit_ngram``): it shares the EAGLE verify's sampling and the target forward
# (``audit_fine``'s verify_sample and target_forward), but drafts on the host from its corpus.
NGRAM = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
NGRAM_CORPUS = "sglang.srt.speculative.cpp_ngram.ngram_corpus.NgramCorpus"
NGRAM_PHASES: tuple[tuple[str, str], ...] = (
    ("ngram_worker", f"{NGRAM}.forward_batch_generation"),
    ("ngram_verify_input", f"{NGRAM}._prepare_for_speculative_decoding"),
    ("ngram_draft", f"{NGRAM}._prepare_draft_tokens"),
    ("ngram_corpus_wait", f"{NGRAM_CORPUS}.synchronize"),
    ("ngram_lookup", f"{NGRAM_CORPUS}.batch_get"),
    ("ngram_kv_move", "sglang.srt.speculative.spec_utils.move_accept_tokens_to_target_kvcache"),
    ("ngram_corpus_update", f"{NGRAM}._update_ngram_corpus"),
)
RUN_BATCH = "run_batch"
OTHER = "other"
CLOCK = "@clock"  # the phase timers' estimated cost per step (their calls, timed or passing through)
BOOKKEEPING = "@audit"  # the audit's own work after run_batch per step (inside ``other``), measured
ATTRIBUTION = "@attribution"  # of which the attribution (segments against the GPU-idle interval, its trace cells)
MARKS = "@marks"  # GPU markers' record calls in a timed window (SGLANG_HOSTSYNC_AUDIT_MARKS); inside its phases' time


# --- arithmetic (pure, CPU-testable) --------------------------------------------

def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def idle_intervals(idle: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(start, end)`` intervals as sorted disjoint non-empty ones (overlapping ones merged)."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in idle if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def attribute(segments: Iterable[tuple[str, float, float]], window: tuple[float, float],
              idle: Iterable[tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Phase -> (host time, of which while the GPU idled) over one step window; the
    uncovered rest of the window is ``other``. ``idle``: the GPU-idle intervals (any order,
    overlapping or empty ones too). Any one unit (the audit passes ns); per timed step on
    the scheduler thread, so kept lean: one sweep over time-ordered segments."""
    w0, w1 = window
    ivs = [(max(a, w0), min(b, w1)) for a, b in idle_intervals(idle) if b > w0 and a < w1]
    host: dict[str, float] = {}
    in_idle: dict[str, float] = {}
    get = host.get
    covered = covered_idle = 0
    j, n, last_t0 = 0, len(ivs), w0
    for phase, t0, t1 in segments:
        if t0 < w0:
            t0 = w0
        if t1 > w1:
            t1 = w1
        if t1 <= t0:
            continue
        d = t1 - t0
        host[phase] = get(phase, 0) + d
        covered += d
        if t0 < last_t0:  # out of time order: sweep the intervals from the start again
            j = 0
        last_t0 = t0
        while j < n and ivs[j][1] <= t0:
            j += 1
        k, o = j, 0
        while k < n and ivs[k][0] < t1:
            a, b = ivs[k]
            o += (t1 if t1 < b else b) - (t0 if t0 > a else a)
            k += 1
        if o:
            in_idle[phase] = in_idle.get(phase, 0) + o
            covered_idle += o
    out = {p: (h, in_idle.get(p, 0.0)) for p, h in host.items()}
    out[OTHER] = (max(0.0, (w1 - w0) - covered), max(0.0, sum(b - a for a, b in ivs) - covered_idle))
    return out


def idle_from_marks(marks: Sequence[tuple[float, float]], latency: float, slack: float,
                    share: float = 0.0) -> list[tuple[float, float]]:
    """GPU-idle intervals inside a step window from stream markers ``(recorded, executed)`` (host
    time of the record call, the marker's execution on the GPU mapped onto the host clock), in
    record order. ``latency``: record-to-execution of a marker on a drained stream, measured when
    the markers were armed (the window's least, if lower). A marker that executed within ``slack``
    of it, or within ``share`` of the time since the previous marker if more (a GPU idle that long
    takes longer to run a marker), found the stream drained. When the later of two neighbours did,
    the stream idled from the earlier one's drain (its execution less the latency, or its record if
    later) to the later record: the kernels launched in between are taken as short (host prep
    launches), so this bounds the idle from above there. When it found the stream busy, the
    interval counts nothing."""
    if len(marks) < 2:
        return []
    lat = min(latency, min(g - r for r, g in marks))
    out = []
    for (r0, g0), (r1, g1) in zip(marks, marks[1:]):
        if g1 - r1 <= lat + max(slack, share * (r1 - r0)):
            start = max(r0, g0 - lat)
            if r1 > start:
                out.append((start, r1))
    return out


@dataclass
class PhaseTotals:
    """Sums over attributed steps: host and GPU-idle time per phase (ns)."""

    steps: int = 0
    window_ns: float = 0.0
    idle_ns: float = 0.0
    host: dict[str, float] = field(default_factory=dict)
    in_idle: dict[str, float] = field(default_factory=dict)

    def add(self, window_ns: float, idle_ns: float, phases: dict[str, tuple[float, float]]) -> None:
        self.steps += 1
        self.window_ns += window_ns
        self.idle_ns += idle_ns
        for name, (host, in_idle) in phases.items():
            self.host[name] = self.host.get(name, 0.0) + host
            self.in_idle[name] = self.in_idle.get(name, 0.0) + in_idle

    def table(self) -> list[dict]:
        """Ranked by GPU-idle time, then host time: µs per step."""
        n = max(self.steps, 1)
        rows = [{"phase": p, "host_us_per_step": self.host[p] / n / 1e3,
                 "gpu_idle_us_per_step": self.in_idle.get(p, 0.0) / n / 1e3,
                 "share_of_gpu_idle": self.in_idle.get(p, 0.0) / self.idle_ns if self.idle_ns else 0.0}
                for p in self.host]
        return sorted(rows, key=lambda r: (-r["gpu_idle_us_per_step"], -r["host_us_per_step"]))

    def summary(self) -> dict:
        n = max(self.steps, 1)
        return {"attributed_steps": self.steps, "window_us_per_step": self.window_ns / n / 1e3,
                "gpu_idle_us_per_step": self.idle_ns / n / 1e3, "phases": self.table()}


def parse_phases(cell: str) -> dict[str, tuple[float, float]]:
    out = {}
    for item in cell.split(","):
        parts = item.split(":")
        if len(parts) == 3:
            out[parts[0]] = (float(parts[1]), float(parts[2]))
    return out


def pool_phases(steps: Sequence) -> dict:
    """Per-step µs by phase over trace steps (``phases`` in µs, ``gpu_idle_us``), ranked."""
    totals = PhaseTotals()
    for s in steps:
        if s.phases:
            own = [(h, i) for k, (h, i) in s.phases.items() if not k.startswith("@")]
            # Window and idle time as the phases cover them (clipped to the step window).
            totals.add(sum(h for h, _ in own) * 1e3, sum(i for _, i in own) * 1e3,
                       {k: (h * 1e3, i * 1e3) for k, (h, i) in s.phases.items()})
    return totals.summary() if totals.steps else {}


# --- the clock ---------------------------------------------------------------------

class PhaseClock:
    """Exclusive per-phase segments on one thread (see the module docstring)."""

    def __init__(self, thread_id: int | None = None, now=time.perf_counter_ns):
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.now = now
        self.stack: list[str] = []
        self.segments: list[tuple[str, int, int]] = []
        self.started = 0
        self.calls = 0
        self.call_ns = 0.0  # measured cost of one timed call through the installed chain
        self.pass_ns = 0.0  # and of one that passes through it untimed
        self.marker = None  # called with the time of every phase transition (GPU markers, audit)

    def enter(self, phase: str) -> None:
        now = self.now()
        if self.stack:
            self.segments.append((self.stack[-1], self.started, now))
        self.stack.append(phase)
        self.started = now
        self.calls += 1
        if self.marker is not None:
            self.marker(now)

    def exit(self) -> None:
        now = self.now()
        if not self.stack:  # unbalanced (armed mid-call): a measurement never raises into serving
            return
        self.segments.append((self.stack.pop(), self.started, now))
        self.started = now
        if self.marker is not None:
            self.marker(now)

    def take(self) -> list[tuple[str, int, int]]:
        """The segments so far (an open phase is cut at now and goes on)."""
        now = self.now()
        if self.stack:
            self.segments.append((self.stack[-1], self.started, now))
            self.started = now
        out, self.segments = self.segments, []
        return out

    def calibrate(self, n: int = 1000, repeats: int = 3) -> None:
        """Per-call cost of a timed call (``call_ns``) and of a passing one (``pass_ns``) through
        the chain a phase target is installed with, on this thread, now (best of ``repeats``)."""
        global _clock
        noop = lambda: None  # noqa: E731
        chained = installed_chain(make_hook("calibrate"), noop)

        def loop(fn) -> int:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            return time.perf_counter_ns() - t0

        saved = self.segments, self.stack, self.calls, self.thread_id, _clock
        self.segments, self.stack, self.thread_id = [], [], threading.get_ident()
        try:
            bare, timed, passing = [], [], []
            for _ in range(repeats):
                bare.append(loop(noop))
                _clock = self
                timed.append(loop(chained))
                self.segments = []
                _clock = None
                passing.append(loop(chained))
            self.call_ns = max(0.0, (min(timed) - min(bare)) / n)
            self.pass_ns = max(0.0, (min(passing) - min(bare)) / n)
        finally:
            self.segments, self.stack, self.calls, self.thread_id, _clock = saved


def installed_chain(hook, fn):
    """``fn`` behind ``hook`` as the installer puts a timing target in place: the slot's gate,
    then SGLang's AROUND wrapper (the calibration times this, not the hook alone)."""
    from ..installer import InstallState, compose_function

    gated = compose_function(InstallState(active={"audit"}), [("audit", hook, True)])
    try:
        from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    except ImportError:  # no SGLang (a unit test): the gate alone
        return lambda *a, **k: gated(fn, *a, **k)
    return _wrap_fn(fn, gated, HookType.AROUND)


_armed: PhaseClock | None = None  # the audit's clock, timing or not
_clock: PhaseClock | None = None  # the clock while it times a window (what the hooks read)


def arm(thread_id: int | None = None, enabled: bool = True) -> PhaseClock | None:
    """A calibrated clock for ``thread_id``, timing from now on (None when ``enabled`` is off)."""
    global _armed, _clock
    _armed = _clock = None
    if enabled:
        clock = PhaseClock(thread_id)
        clock.calibrate()
        _armed = _clock = clock
    return _armed


def disarm() -> None:
    global _armed, _clock
    _armed = _clock = None


def clock() -> PhaseClock | None:
    """The clock while it times the current window, else None."""
    return _clock


def armed() -> PhaseClock | None:
    return _armed


def time_windows(on: bool) -> None:
    """Times the windows from now on (``on``) or lets the hooks pass through."""
    global _clock
    _clock = _armed if on else None


def run_as(phase: str, fn, *args):
    """``fn(*args)``, timed as ``phase`` while the clock times this window on this thread: for a
    stock call a slot moved out of the function whose phase held it (``ngram_late_wait``'s wait)."""
    c = _clock
    if c is None or threading.get_ident() != c.thread_id:
        return fn(*args)
    c.enter(phase)
    try:
        return fn(*args)
    finally:
        c.exit()


def phase_every(env) -> int:
    from ..config import env_count

    return env_count(ENV_PHASE_EVERY, DEFAULT_PHASE_EVERY, env,
                     hint="use a positive number of steps (1 times every step)")


def make_hook(phase: str):
    get_ident, now = threading.get_ident, time.perf_counter_ns

    def phase_hook(original, *args, **kwargs):
        c = _clock
        if c is None or get_ident() != c.thread_id:
            return original(*args, **kwargs)
        # PhaseClock.enter / exit inlined: this runs for every timed call on the scheduler thread.
        t, stack = now(), c.stack
        if stack:
            c.segments.append((stack[-1], c.started, t))
        stack.append(phase)
        c.started = t
        c.calls += 1
        mark = c.marker
        if mark is not None:
            mark(t)
        try:
            return original(*args, **kwargs)
        finally:
            t = now()
            if stack:  # unbalanced (armed mid-call): never raises into serving
                c.segments.append((stack.pop(), c.started, t))
                c.started = t
                if mark is not None:
                    mark(t)

    phase_hook.__name__ = f"phase_{phase}"
    return phase_hook


def phase_targets(table: tuple[tuple[str, str], ...]) -> tuple:
    """One timing-only target per ``(phase, function)``: each calls its original unchanged, so
    no source is pinned, and each composes with a slot that hooks the same function."""
    return tuple(HookTarget(path, TargetKind.FUNCTION, hook=make_hook(name), observer=True) for name, path in table)


def clock_off_warning(env) -> str | None:
    """For the tool slots that add timers: ``SGLANG_HOSTSYNC_AUDIT_PHASES=0`` stops the clock they feed."""
    try:
        on = enabled(env)
    except ValueError:  # a bad value: the audit's own precheck reports it
        return None
    return None if on else f"{ENV_PHASES}=0 turns the audit's phase clock off: these timers only pass through"


def enabled(env) -> bool:
    from ..config import env_bool

    return env_bool(ENV_PHASES, True, env)
