"""Slot ``flashinfer_certified_plan`` (experimental; NOT REGISTERED until a GPU run verifies it): an
EAGLE-family topk-1 FlashInfer step skips ``FutureMap.resolve_seq_lens_cpu``'s D2H and stream
synchronize whenever the host can prove, without them, that FlashInfer plans what stock SGLang plans;
other steps run stock's resolve.

Not in ``slots/__init__.py``'s catalogue (like ``ngram_device_draft``): no preset, ``all`` included,
can select it, and the doctor does not list it. Its module, ``SLOT`` and tests stay; a run that wants it
registers ``SLOT`` through the third-party entry-point group (``sglang_hostsync.slots``;
``tests/test_flashinfer_certified_plan.py``'s ``write_cert_dist`` writes such a package, which the GPU
test puts on ``PYTHONPATH``). Registering it in the catalogue waits on
``tests/test_gpu_flashinfer_certified_plan.py`` passing on a GPU: the port against FlashInfer's own
planner first of all.

Stock SGLang 0.5.23 under overlap: FlashInfer does not opt out of ``needs_cpu_seq_lens``, so every
spec-v2 decode step starts with ``resolve_seq_lens_cpu`` (``managers/overlap_utils.py`` ~587): a pinned
D2H of the committed lengths behind the previous step's publish and ``Stream.synchronize`` (the host
waits for the previous verify). FlashInfer's CUDA-graph replays plan on the host from them: the verify
(``fast_prefill_plan`` under ``flashinfer_verify_host_plan``), the draft extend (``fast_prefill_plan``)
and the multi-step draft (``fast_decode_plan`` with ``flashinfer_draft_host_indptr``).
docs/flashinfer-bound-plan.md (its section 6.1 is this slot) shows why a bound cannot simply replace
them: a plan from longer lengths is wrong for query widths over 1, or reorders the reduction.

What bit-identity rests on: the CPU port of FlashInfer 0.7.2's planner (``flashinfer_split``) matching
FlashInfer's own planner. A skipped step hands FlashInfer the ``hi`` lengths where the port says the plan
is the same as at every length of the window; if the port is wrong there, FlashInfer plans from the
wrong lengths. The self-check (step 4) compares the port with FlashInfer on every planner call of the
first ``CHECK_ALL`` (1000) calls, then on every ``CHECK_EVERY``-th (8th) only: a port error that shows
on a later, unchecked call is not caught. The GPU port tests (tests/test_gpu_flashinfer_certified_plan.py)
are the precondition for registering the slot.

Mechanism, one decode step:

1. Window (``Scheduler.get_next_batch_to_run``, after SGLang picked the batch). Under overlap the host
   processes step N-1's result after launching step N, so request r's committed length on the device
   is ``c = kv_committed_len`` if none of its forwards is unprocessed; ``c + a``, ``1 <= a <= W``
   (``W`` = draft tokens, the most a verify accepts), if it is in the one decode batch still in the
   result queue; exactly ``c`` if that batch is a plain prefill (``EAGLEWorkerV2._forward_prefill_batch``
   publishes ``batch.seq_lens``, which SGLang's extend allocation also wrote into ``kv_committed_len``).
   Any other unprocessed batch (mixed, or more than one), or a ``hi`` past ``kv_allocated_len`` (the
   reserve SGLang allocated ahead), makes the step stock's.
2. Certificate. Each FlashInfer planner call of the step is predicted from a template of the same
   batch size, recorded in an earlier stock step (its non-length arguments, each row's length offset
   from the committed length, the padding rows). The ported planner (``flashinfer_split.SplitSite``)
   is run at every request's ``lo`` and at its ``hi``; the chunk size and each row's chunk count are
   monotone in every length, so equal keys mean the plan is the same for every length in the box: the
   one stock would make, as far as the port is FlashInfer. If every call is certified, the step skips
   the read: the scheduler's ``FutureMap.needs_cpu_seq_lens`` is False for that one resolve, which then
   runs SGLang's own GPU-only branch (event wait, device gather; ``seq_lens_cpu`` and ``seq_lens_sum``
   None). Back-off: after ``BACKOFF_AFTER`` (8) uncertain decisions in a row at one batch size the
   keys are not computed there for the next ``BACKOFF_FIRST`` (16) decisions at that size, then one is
   tried; each further miss doubles the pause, up to ``BACKOFF_MAX`` (1024); a certified step ends it.
   (A decision costs 2 keys per planner call at least: 46 µs at bs 16 and 163 µs at bs 64 on the CPU
   box, where the port's model predicts almost no certified step. A fixed batch-size cap was not taken:
   where the certificate stops paying depends on the KV heads (the split budget is 2 * SMs / KV
   heads), the query widths, the lengths and the device, so one cap would either forbid steps that
   certify on other shapes or keep paying where none do; the back-off measures it in this server and
   bounds the waste to about one decision in a thousand.)
3. The batch then runs SGLang's device-length path, the one it takes under triton: nothing outside
   FlashInfer's planning sees a bound (the draft extend's prefix lengths come from the device lengths
   through SGLang's fused layout; ``prepare_for_draft``'s read table and the FULL_MASK tree mask size
   from the length sum fall back as SGLang's comments say: the mask is sized from
   ``bs * max_context_len``, wider, the same bits where read). Only the two FlashInfer functions that
   hand host lengths to the planner get the ``hi`` lengths, laid out as the graph runners lay them
   out (their padding rows as recorded): ``FlashInferIndicesUpdaterPrefill.update_single_wrapper``
   (verify, draft extend) and ``FlashInferMultiStepDraftBackend.common_template`` (draft decode).
   What else they size from those lengths (``kv_indices`` allocations, gather tilings, the packed
   verify mask's per-request regions, which its packing and the kernel both read from the same host
   indptr) only grows; no value read changes. One thing outside the forward does change: SGLang's
   decode metrics (``metrics_reporter._decode_total_seq_lens``, the decode log line's and
   ``decode_sum_seq_lens``' token count) sum ``seq_lens_cpu`` when the batch has it and otherwise
   ``req.seqlen`` of every request (prompt plus output ids: the host's count, which lags the device by
   the unprocessed verify): on a skipped step they switch to that second definition, as they do under
   triton; outputs are not affected.
4. Every planner call is watched (``PlanProbe`` stands in for the wrapper's ``_cached_module``): in a
   skipped step the call's own arguments must be certified (the prediction, or the port run again on
   them); otherwise it is rescued: the exact lengths are read back (a blocking ``.cpu()`` of the
   step's device lengths) and the call is made with them. Calls are self-checked (see above): the
   port's plan for the call's arguments against FlashInfer's plan_info and the arrays it wrote into
   the pinned buffer (``flashinfer_split.compare``). A mismatch turns the slot off for the process
   (stock's resolve every step after; the call at hand is rescued) and is logged with the fields that
   differ. An error inside the watch itself also turns the slot off, and the call goes to FlashInfer
   with the arguments it came with (in a skipped step the ``hi`` lengths the decision certified): the
   watch never raises into the forward and never adds a blocking read on that path.
5. The window is checked on every step. A stock step compares it with the exact lengths it read. A
   skipped step, at its first FlashInfer site (on the forward stream, behind SGLang's device gather),
   queues a copy of its device lengths into a pinned buffer with an event behind it; a later decision
   reads the buffer once the event has fired (``query()``, never a wait; at most ``WINDOW_DEPTH``
   copies in flight, a step beyond that goes unchecked and is counted). A length outside its window
   turns the slot off for the process.
6. The step ends after its draft extend's site (``EAGLEWorkerV2.forward_batch_generation``: draft,
   verify, draft extend; pinned): a planner call after that, e.g. a CUDA-graph recapture after a weight
   update between two steps, sees no step and runs as SGLang made it.

Counted and logged after checks 1, 10, 100 and every 1000th (``hostsync: flashinfer_certified_plan
check: N checks, M mismatches; S of D decode steps skipped ...``, the line the e2e benchmark collects):
skipped and stock steps with their reasons, rescues, window checks.

It needs SGLang's two FlashInfer host-plan switches, the slots ``flashinfer_verify_host_plan`` and
``flashinfer_draft_host_indptr``: without their flags the verify and the draft read the lengths back
themselves and the slot keeps stock's resolve (logged once). It does not ``require`` them (a selection
like ``all,-flashinfer_verify_host_plan`` stays valid). It requires ``flashinfer_plan_guard``: once the
step's read is gone nothing drains the stream between two plans of a wrapper, the pinned-buffer
write-after-read hazard that slot's docstring describes.

Inert (by rule, before launch): other algorithms, topk != 1 (unresolved topk: decided at the
refinement), no overlap, CUDA graphs off, attention DP, two-batch overlap, TP > 1 (not checked),
adaptive steps, and wherever ``flashinfer_verify_host_plan`` or ``flashinfer_draft_host_indptr`` is
inert. At run time the scheduler stays on stock's resolve (logged once) for: the two switches' SGLang
flags off, forward-pass metrics (``--enable-forward-pass-metrics``) for an algorithm whose result has
no decode snapshot (``metrics_reporter._SPEC_DECODE_SNAPSHOT_ALGORITHMS``: STANDALONE is not in it, and
``_build_scheduled_request_metrics`` iterates ``batch.seq_lens_cpu`` of every decode batch without
one), mixed chunked prefill, PP, disaggregation, HiSparse, M-RoPE / encoder-decoder / hybrid (mamba)
models, a sliding-window or cross-attention FlashInfer wrapper, a draft window, another backend in the
loop. Never certified: a site planned on CUDA cores (FlashInfer's decode planner sizes its grid from
kernel occupancy, which the CPU cannot know), an eager (non-graph) site, a batch size without a
template. NGRAM is inert (its mask sizing reads ``seq_lens_cpu``).

Hook targets (AROUND): ``Scheduler.get_next_batch_to_run``,
``FlashInferIndicesUpdaterPrefill.update_single_wrapper``,
``FlashInferMultiStepDraftBackend.common_template``. SGLang code it relies on beyond them is pinned
(``PINS``).
"""

from __future__ import annotations

import collections
import logging
import weakref
from dataclasses import dataclass, field

import torch

from .. import flashinfer_split as fs
from ..checks import pinned_sources
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .flashinfer_plan_guard import FB, NAME as PLAN_GUARD
from .upstream_host_plans import draft_host_indptr_inert, verify_host_plan_inert

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "flashinfer_certified_plan"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
NEXT_BATCH = f"{SCHEDULER}.get_next_batch_to_run"
PREFILL_UPDATE = f"{FB}.FlashInferIndicesUpdaterPrefill.update_single_wrapper"
DRAFT_TEMPLATE = f"{FB}.FlashInferMultiStepDraftBackend.common_template"
METRICS = "sglang.srt.managers.scheduler_components.metrics_reporter"
WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
# What the slot relies on beyond its targets (owner, attribute, source sha).
PINS = (
    # GPU-only branch when needs_cpu_seq_lens is False; the D2H + synchronize otherwise.
    ("sglang.srt.managers.overlap_utils.FutureMap", "resolve_seq_lens_cpu", "f7d9d6e12fc4040c"),
    # get_next_batch_to_run, run_batch, then the previous batch's result: one batch in the queue.
    (SCHEDULER, "event_loop_overlap", "c093eb14e50c1ac6"),
    # kv_committed_len += the accepted run (the device adds accept_lens).
    ("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor",
     "_resolve_spec_v2_tokens", "d79752842869a4d7"),
    # kv_allocated_len: committed + the reserve, page-aligned.
    ("sglang.srt.speculative.eagle_utils", "eagle_prepare_for_decode", "a7054af5ba19aa6e"),
    # A plain prefill publishes batch.seq_lens (= kv_committed_len): window [c, c].
    (WORKER, "_forward_prefill_batch", "d98e2fbfef949bee"),
    # A decode step: draft, verify, draft extend (the step ends after the draft extend's site).
    (WORKER, "forward_batch_generation", "e41ad8d8053cf2c0"),
    # Forward-pass metrics read seq_lens_cpu of a decode batch that has no spec snapshot.
    (f"{METRICS}.SchedulerMetricsReporter", "_build_scheduled_request_metrics", "be900dce54b7f316"),
    # The planner's arguments from the host lengths; the verify mask packed per host length.
    (FB, "fast_prefill_plan", "e3a929a17b4d76f4"),
    (FB, "_build_draft_indptr_host", "6782291a32b0904f"),
    (f"{FB}.FlashInferIndicesUpdaterDecode", "call_begin_forward", "c9359382e9a29312"),
    # Without host lengths the draft extend's prefix lengths stay on the device (fused layout).
    ("sglang.srt.speculative.eagle_worker_common", "prepare_for_draft_extend", "10d99587687d599e"),
)
KINDS = ("draft_decode", "verify", "draft_extend")
LOG_AT = (1, 10, 100)
# The self-check (about 40 µs of host time per planner call on a slow CPU) runs on every call of the
# first CHECK_ALL calls, then on every CHECK_EVERY-th.
CHECK_ALL, CHECK_EVERY = 1000, 8
# Back-off per batch size (module docstring, step 2).
BACKOFF_AFTER, BACKOFF_FIRST, BACKOFF_MAX = 8, 16, 1024
# Skipped steps' window copies in flight at most (module docstring, step 5).
WINDOW_DEPTH = 4


# ---------------------------------------------------------------------------
# 1. The window
# ---------------------------------------------------------------------------
def request_window(committed: int, allocated: int, pending: str | None, width: int) -> tuple[int, int] | None:
    """Where request r's device length can be, from the host's bookkeeping alone: ``pending`` is None
    (none of its forwards unprocessed: exactly ``committed``), "decode" (in the unprocessed decode
    batch: its verify accepts 1 to ``width`` tokens) or "prefill" (in an unprocessed plain prefill,
    which publishes the length SGLang's extend allocation wrote into ``kv_committed_len``: exactly
    ``committed``). None when ``hi`` passes the KV SGLang allocated for it."""
    lo = committed + 1 if pending == "decode" else committed
    hi = committed + width if pending == "decode" else committed
    return (lo, hi) if hi <= allocated else None


def pending_kind(batch) -> str | None:
    """"decode", "prefill" (a plain extend, not mixed), or None (any other batch: no window)."""
    mode = batch.forward_mode
    if mode.is_decode():
        return "decode"
    return "prefill" if getattr(mode, "name", None) == "EXTEND" else None


def step_window(reqs, pending_batches, width: int) -> tuple[list[int], list[int]] | None:
    """Every request's window for the batch about to run, or None (stock's resolve)."""
    if len(pending_batches) > 1:
        return None  # a lag of two steps: never seen under event_loop_overlap
    where: dict[int, str] = {}
    for b in pending_batches:
        kind = pending_kind(b)
        if kind is None:
            return None
        for r in b.reqs:
            where[id(r)] = kind
    lo, hi = [], []
    for r in reqs:
        w = request_window(r.kv.kv_committed_len, r.kv.kv_allocated_len, where.get(id(r)), width)
        if w is None:
            return None
        lo.append(w[0])
        hi.append(w[1])
    return lo, hi


# ---------------------------------------------------------------------------
# 2. Templates: one stock step's planner calls, as functions of the committed lengths
# ---------------------------------------------------------------------------
@dataclass
class SiteRecord:
    """What SGLang handed one FlashInfer site: its padded batch size, each real row's host length
    minus the committed length, and the padding rows."""

    kind: str
    bs: int
    offset: int
    padded: tuple[int, ...]

    def lens(self, seq) -> list[int]:
        return [s + self.offset for s in seq] + list(self.padded)


@dataclass
class CallTemplate:
    """One planner call: its non-length arguments and its KV rows as ``committed + offset`` (real rows)
    and the padding rows."""

    wrapper: weakref.ref
    call: fs.PlannerCall
    offset: int
    padded: tuple[int, ...]
    site: fs.SplitSite

    def lens(self, seq) -> list[int]:
        return [s + self.offset for s in seq] + list(self.padded)

    def certify(self, lo, hi) -> bool:
        key = self.site.key(self.lens(hi))
        return key is not None and key == self.site.key(self.lens(lo))


@dataclass
class Template:
    sites: dict  # kind -> SiteRecord
    calls: list  # CallTemplate, in call order


@dataclass
class Recording:
    """A stock step being recorded; ``why`` says why it cannot become a template."""

    sites: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)
    why: str | None = None


@dataclass
class Step:
    batch: object
    raw: int
    lo: list | None = None
    hi: list | None = None
    skipped: bool = False
    template: Template | None = None
    recording: Recording | None = None
    ncall: int = 0
    site: tuple | None = None  # (kind, bs, basis) of the FlashInfer site being planned; basis "hi" / "exact"
    seq_dev: object = None  # the batch's device lengths (skipped step), for a rescue and the window check
    exact: list | None = None
    checked_window: bool = False


@dataclass
class Backoff:
    """One batch size's back-off (module docstring, step 2)."""

    run: int = 0  # uncertain decisions in a row
    skip: int = 0  # decisions left that take stock's read without computing a key
    length: int = BACKOFF_FIRST  # the next pause


@dataclass
class WindowCopy:
    """A skipped step's device lengths on their way to the host (module docstring, step 5)."""

    buf: torch.Tensor
    event: object
    lo: list
    hi: list


@dataclass
class Stats:
    decode_steps: int = 0
    skipped: int = 0
    stock: collections.Counter = field(default_factory=collections.Counter)
    checks: int = 0
    mismatches: int = 0
    plans: int = 0
    unpredicted: int = 0
    rescues: int = 0
    window_checks: int = 0
    window_misses: int = 0
    window_unchecked: int = 0  # skipped steps whose copy found WINDOW_DEPTH copies in flight
    backoffs: int = 0

    def line(self) -> str:
        reasons = ", ".join(f"{k} {v}" for k, v in self.stock.most_common()) or "none"
        return (f"{self.checks} checks, {self.mismatches} mismatches; {self.skipped} of {self.decode_steps} decode "
                f"steps skipped the seq-lens read (stock: {reasons}); {self.rescues} rescues, {self.unpredicted} "
                f"unpredicted calls; window checked {self.window_checks}x, {self.window_misses} misses, "
                f"{self.window_unchecked} unchecked; {self.backoffs} back-offs")


class PlanProbe:
    """Stands in for a FlashInfer wrapper's ``_cached_module``: its ``plan`` goes through the engine,
    every other attribute is the module's."""

    __slots__ = ("module", "wrapper", "kv_bytes")

    def __init__(self, module, wrapper, kv_bytes: int):
        self.module = module
        self.wrapper = weakref.ref(wrapper)
        self.kv_bytes = kv_bytes

    def __getattr__(self, name):
        return getattr(self.module, name)

    def plan(self, *args):
        return ENGINE.on_plan(self, args)


def install_probe(wrapper, kv_dtype) -> None:
    module = getattr(wrapper, "_cached_module", None)
    if module is not None and not isinstance(module, PlanProbe):
        size = kv_dtype.itemsize if isinstance(kv_dtype, torch.dtype) else 2
        wrapper._cached_module = PlanProbe(module, wrapper, size)


def _uses(wrapper, name: str) -> bool:
    """A CUDA-graph wrapper whose ``begin_forward`` is the sync-free plan ``name``."""
    func = getattr(getattr(wrapper, "begin_forward", None), "func", None)
    return bool(getattr(wrapper, "is_cuda_graph_enabled", False)) and getattr(func, "__name__", None) == name


def _cuda_event():
    return torch.cuda.Event() if torch.cuda.is_available() else None


def _pinned(n: int, dtype) -> torch.Tensor:
    return torch.empty(n, dtype=dtype, pin_memory=torch.cuda.is_available())


# ---------------------------------------------------------------------------
# The engine: decisions, the two injection points, the probe
# ---------------------------------------------------------------------------
class Engine:
    name = NAME  # in the log lines

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.stats = Stats()
        self.templates: dict[int, Template] = {}
        self.step: Step | None = None  # the step whose FlashInfer sites are still to come
        self.ended: Step | None = None  # the last step, its sites done; finished at the next decision
        self.fm = None  # weakref to the scheduler's FutureMap
        self.stock_flag = True
        self.reason: str | None = None  # why this scheduler stays on stock's resolve (runtime rule)
        self.disabled: str | None = None  # a self-check or window miss turned the slot off
        self.device: fs.Device | None = None
        self.width = 0
        self.backoff: dict[int, Backoff] = {}
        self.copies: collections.deque = collections.deque()  # WindowCopy, oldest first
        self.spare: list = []  # pinned buffers whose copies were read
        self.spare_events: list = []  # their events, recorded again (no allocation per skipped step)
        self.make_event = _cuda_event  # (tests: a stand-in event)

    @property
    def last_step(self) -> Step | None:
        return self.step or self.ended

    # -- decisions -----------------------------------------------------------------------------------
    def begin(self, scheduler, batch) -> tuple[object, Step] | None:
        """The decision's common part: stock's flag back on the FutureMap, and for a decode step that may
        skip the read (no runtime rule, a window, the slot on) its FutureMap and its step; else None."""
        self.finish_step()
        self.poll_window_copies()
        fm = getattr(scheduler, "future_map", None)
        if fm is None:
            return None
        if self.fm is None or self.fm() is not fm:
            self.fm = weakref.ref(fm)
            self.stock_flag = fm.needs_cpu_seq_lens
            self.reason = self.runtime_reason(scheduler, fm)
            self.width = self.max_accept(scheduler.server_args)
            if self.reason:
                logger.info("hostsync: %s: stock's seq-lens read every step (%s)", self.name, self.reason)
        fm.needs_cpu_seq_lens = self.stock_flag
        if self.reason or batch is None or not batch.forward_mode.is_decode() or not batch.reqs \
                or getattr(batch.spec_info, "future_indices", None) is None:
            return None  # (SGLang's resolve returns at once without a draft input's future indices)
        self.stats.decode_steps += 1
        step = Step(batch, len(batch.reqs))
        self.step = step
        window = step_window(batch.reqs, [b for b, _ in getattr(scheduler, "result_queue", ())], self.width)
        if window is None:
            return self._stock(step, "window")
        step.lo, step.hi = window
        if self.disabled:
            return self._stock(step, "off")
        return fm, step

    def runtime_reason(self, scheduler, fm) -> str | None:
        return runtime_reason(scheduler, fm)

    @staticmethod
    def max_accept(server_args) -> int:
        """The most tokens one verify commits (topk 1: the draft tokens)."""
        return int(getattr(server_args, "speculative_num_draft_tokens", 0) or 0)

    @staticmethod
    def site_kind(spec_info) -> str | None:
        """The plan site a prefill update is ("verify", "draft_extend"), or None (not one of the step's)."""
        return _spec_kind(spec_info)

    def decide(self, scheduler, batch) -> None:
        begun = self.begin(scheduler, batch)
        if begun is None:
            return
        fm, step = begun
        template = self.templates.get(step.raw)
        if template is not None and any(c.wrapper() is None for c in template.calls):
            del self.templates[step.raw]  # its wrappers are gone (graphs captured again): record anew
            template = None
        if template is None:
            step.recording = Recording()
            return self._stock(step, "no template")
        backoff = self.backoff.get(step.raw)
        if backoff is not None and backoff.skip > 0:
            backoff.skip -= 1
            return self._stock(step, "back-off")
        if not all(c.certify(step.lo, step.hi) for c in template.calls):
            self._uncertain(step.raw)
            return self._stock(step, "uncertain")
        self.backoff.pop(step.raw, None)
        step.skipped, step.template = True, template
        fm.needs_cpu_seq_lens = False  # this step's resolve runs SGLang's GPU-only branch
        self.stats.skipped += 1

    def _stock(self, step: Step, why: str) -> None:
        self.stats.stock[why] += 1

    def _uncertain(self, bs: int) -> None:
        b = self.backoff.setdefault(bs, Backoff())
        b.run += 1
        if b.run >= BACKOFF_AFTER:
            b.skip, b.length = b.length, min(2 * b.length, BACKOFF_MAX)
            b.run = BACKOFF_AFTER - 1  # after the pause, one more uncertain decision pauses again
            self.stats.backoffs += 1

    def end_step(self) -> None:
        """The step's last FlashInfer site (its draft extend) is done: later planner calls (a CUDA-graph
        recapture between two steps, say) see no step."""
        if self.step is not None:
            self.ended, self.step = self.step, None

    def finish_step(self) -> None:
        step = self.step or self.ended
        self.step = self.ended = None
        rec = step.recording if step is not None else None
        if rec is None or self.disabled or step.raw in self.templates:
            return
        kinds = {k for k in rec.sites}
        if rec.why is None and kinds != set(KINDS) and kinds != set(KINDS) - {"draft_decode"}:
            rec.why = f"sites seen: {sorted(kinds)}"
        if rec.why is None and rec.calls:
            self.templates[step.raw] = Template(rec.sites, rec.calls)

    def disable(self, why: str) -> None:
        if not self.disabled:
            self.disabled = why
            logger.warning("hostsync: %s: off for this process (%s); stock's seq-lens read from now on", self.name,
                           why)

    # -- the exact lengths -----------------------------------------------------------------------------
    def exact(self, step: Step) -> list[int]:
        """The step's committed lengths: stock's resolve gave them to the batch; a skipped step reads
        them back (blocking), once."""
        if step.exact is None:
            if step.skipped:
                dev = step.seq_dev if step.seq_dev is not None else step.batch.seq_lens
                step.exact = [int(x) for x in dev[: step.raw].cpu().tolist()]
            else:
                step.exact = [int(x) for x in step.batch.seq_lens_cpu[: step.raw].tolist()]
            self._check_window(step.lo, step.exact, step.hi, step)
        return step.exact

    def _check_window(self, lo, exact, hi, step: Step | None = None) -> None:
        if lo is None or (step is not None and step.checked_window):
            return
        if step is not None:
            step.checked_window = True
        self.stats.window_checks += 1
        if not all(a <= e <= b for a, e, b in zip(lo, exact, hi)):
            self.stats.window_misses += 1
            self.disable(f"window miss: committed lengths {exact[:8]} outside [{lo[:8]}, {hi[:8]}]")

    # -- the skipped steps' window check, off the critical path ------------------------------------------
    def queue_window_copy(self, step: Step) -> None:
        """At a skipped step's first site, on the forward stream: its device lengths into a pinned
        buffer, an event behind the copy. Read by a later decision once the event fired."""
        if step.checked_window:
            return
        if len(self.copies) >= WINDOW_DEPTH:
            self.stats.window_unchecked += 1  # (a rescue's exact read still checks it)
            return
        step.checked_window = True
        dev = step.seq_dev[: step.raw]
        buf = next((b for b in self.spare if b.numel() >= step.raw and b.dtype == dev.dtype), None)
        if buf is not None:
            self.spare.remove(buf)
        else:  # (rare: the first copies, a larger batch) one too small goes, so at most WINDOW_DEPTH + 1 exist
            if self.spare:
                self.spare.pop(0)
            buf = _pinned(1 << max(4, (step.raw - 1).bit_length()), dev.dtype)
        buf[: step.raw].copy_(dev, non_blocking=True)
        event = self.spare_events.pop() if self.spare_events else self.make_event()
        if event is not None:
            event.record()
        self.copies.append(WindowCopy(buf, event, step.lo, step.hi))

    def poll_window_copies(self) -> None:
        """The copies whose event fired, oldest first; stops at the first still in flight (no wait)."""
        while self.copies:
            copy = self.copies[0]
            if copy.event is not None and not copy.event.query():
                return
            self.copies.popleft()
            exact = [int(x) for x in copy.buf[: len(copy.lo)].tolist()]
            self.spare.append(copy.buf)
            if copy.event is not None:
                self.spare_events.append(copy.event)
            self._check_window(copy.lo, exact, copy.hi)

    # -- injection: the site's host lengths ----------------------------------------------------------------
    def site_lens(self, kind: str, bs: int, seq_lens_cpu, seq_lens_sum, fill: int, offset: int):
        """What a FlashInfer site gets: in a skipped step the ``hi`` lengths laid out as recorded (or, never
        expected, the exact ones by SGLang's rule); in a stock step stock's, recorded for the template."""
        step = self.step
        if step is None:
            return seq_lens_cpu, seq_lens_sum
        step.site = (kind, bs, "exact")
        if step.skipped and seq_lens_cpu is None:
            if step.seq_dev is None:
                step.seq_dev = step.batch.seq_lens
                self.queue_window_copy(step)
            rec = step.template.sites.get(kind)
            if rec is not None and rec.bs == bs and bs >= step.raw:
                step.site = (kind, bs, "hi")
                lens = rec.lens(step.hi)
            else:  # never expected: the exact lengths, laid out by SGLang's rule
                self.stats.unpredicted += 1
                self.stats.rescues += 1
                lens = [e + offset for e in self.exact(step)] + [fill] * (bs - step.raw)
            return torch.tensor(lens, dtype=torch.int64), int(sum(lens))
        if not step.skipped and seq_lens_cpu is not None and step.recording is not None:
            self._record_site(step, kind, bs, seq_lens_cpu, seq_lens_sum)
        elif not step.skipped and seq_lens_cpu is not None:
            self.exact(step)  # checks the window against stock's lengths
        return seq_lens_cpu, seq_lens_sum

    def _record_site(self, step: Step, kind: str, bs: int, seq_lens_cpu, seq_lens_sum) -> None:
        rec = step.recording
        got = [int(x) for x in seq_lens_cpu[:bs].tolist()]
        exact = self.exact(step)
        offsets = {g - e for g, e in zip(got, exact)}
        if len(got) < step.raw or len(offsets) != 1 or (seq_lens_sum is not None and seq_lens_sum != sum(got)):
            rec.why = f"{kind}: host lengths not committed + a constant"
            return
        rec.sites[kind] = SiteRecord(kind, bs, offsets.pop(), tuple(got[step.raw:]))

    def site_done(self, kind: str) -> None:
        if self.step is not None:
            self.step.site = None
            if kind == "draft_extend":
                self.end_step()

    def unprobed_site(self, kind: str) -> None:
        """A site planned without a watched fast plan (eager, or CUDA cores): no template from this step."""
        step = self.step
        if step is not None and step.recording is not None:
            step.recording.why = f"{kind}: not a watched CUDA-graph plan"

    # -- the probe -------------------------------------------------------------------------------------
    def on_plan(self, probe: PlanProbe, args):
        """Never raises into the forward: an error in the watch turns the slot off and the call goes to
        FlashInfer with the arguments it came with; FlashInfer's own errors are stock's."""
        step = self.step
        bounded = step is not None and step.skipped and step.site is not None and step.site[2] == "hi"
        try:
            call, plan_args, rescued = self._before_plan(probe, args, step, bounded)
        except Exception as exc:  # noqa: BLE001 (a bug here must not take the forward down)
            self.disable(f"the planner watch raised {type(exc).__name__}: {exc}")
            call, plan_args, rescued = None, args, False
        info = probe.module.plan(*plan_args)
        try:
            return self._after_plan(probe, step, call, plan_args, info, bounded, rescued)
        except Exception as exc:  # noqa: BLE001
            self.disable(f"the planner watch raised {type(exc).__name__}: {exc}")
            return info

    def _before_plan(self, probe: PlanProbe, args, step: Step | None, bounded: bool):
        """``bounded``: the call's real rows are this skipped step's ``hi`` lengths plus the site's offset.
        The call (None: not the fa2 prefill planner's), the arguments to plan with, whether rescued."""
        try:
            call = fs.PlannerCall.from_args(args)
        except ValueError:
            call = None
        if bounded and not self._certified(step, probe, call):
            args = self._rescue(step, args)
            return (fs.PlannerCall.from_args(args) if call is not None else None), args, True
        if step is not None and step.skipped and not bounded:
            self.stats.unpredicted += 1  # exact rows already (or a call outside the watched sites)
        return call, args, False

    def _after_plan(self, probe: PlanProbe, step: Step | None, call, args, info, bounded: bool, rescued: bool):
        self.stats.plans += 1
        due = self.stats.plans <= CHECK_ALL or self.stats.plans % CHECK_EVERY == 0
        if call is not None and due and not self._self_check(probe, call, args, info) and bounded and not rescued:
            info = probe.module.plan(*self._rescue(step, args))
        if step is not None and step.recording is not None and step.recording.why is None:
            self._record_call(step, probe, call)
        return info

    def _certified(self, step: Step, probe: PlanProbe, call) -> bool:
        if call is None or self.disabled:
            return False
        index, step.ncall = step.ncall, step.ncall + 1
        calls = step.template.calls
        pred = calls[index] if index < len(calls) else None
        if pred is not None and pred.wrapper() is probe.wrapper() and pred.call.fixed() == call.fixed() \
                and list(call.kv_lens) == pred.lens(step.hi):
            return True  # certified at the decision
        self.stats.unpredicted += 1
        try:
            site = fs.SplitSite(call, self.device_now(), probe.kv_bytes)
        except ValueError:
            return False
        kv = list(call.kv_lens)
        if len(kv) < step.raw:
            return False
        lo = [k - (h - l) for k, h, l in zip(kv, step.hi, step.lo)] + kv[step.raw:]
        key = site.key(kv)
        return key is not None and key == site.key(lo)

    def _rescue(self, step: Step, args):
        """The call with the exact lengths: the hi rows less (hi - exact)."""
        self.stats.rescues += 1
        exact = self.exact(step)
        at = fs.KV_INDPTR if len(args) == fs.PREFILL_PLAN_ARGS else 3  # CUDA-core decode planner: indptr third
        indptr = [int(x) for x in args[at].tolist()]
        lens = [indptr[i + 1] - indptr[i] for i in range(len(indptr) - 1)]
        lens = [k - (h - e) for k, h, e in zip(lens, step.hi, exact)] + lens[step.raw:]
        new = [0]
        for n in lens:
            new.append(new[-1] + n)
        args = list(args)
        args[at] = torch.tensor(new, dtype=args[at].dtype)
        if at == fs.KV_INDPTR:
            args[fs.KV_LENS] = torch.tensor(lens, dtype=args[fs.KV_LENS].dtype)
        return tuple(args)

    def device_now(self) -> fs.Device:
        if self.device is None:
            self.device = fs.Device.current()
        return self.device

    def _self_check(self, probe: PlanProbe, call, args, info) -> bool:
        """The port's plan of this very call against what FlashInfer returned and wrote."""
        self.stats.checks += 1
        try:
            diffs = fs.compare(fs.plan_call(call, self.device_now(), probe.kv_bytes), list(info), args[2],
                               call.batch_size)
        except ValueError as exc:  # the port refuses what FlashInfer planned
            diffs = [f"the port refuses the call ({exc})"]
        except Exception as exc:  # noqa: BLE001 (e.g. plan_info of another shape)
            diffs = [f"the check raised {type(exc).__name__}: {exc}"]
        if diffs:
            self.stats.mismatches += 1
            logger.warning("hostsync: %s check: %d checks, %d mismatches (the port differs from FlashInfer's "
                           "planner: %s)", NAME, self.stats.checks, self.stats.mismatches, "; ".join(diffs[:4]))
            self.disable("self-check mismatch")
        elif self.stats.checks in LOG_AT or self.stats.checks % 1000 == 0:
            logger.info("hostsync: %s check: %s", NAME, self.stats.line())
        return not diffs

    def _record_call(self, step: Step, probe: PlanProbe, call) -> None:
        rec = step.recording
        if call is None or step.site is None:
            rec.why = "a planner call the port does not cover" if call is None else "a planner call outside a site"
            return
        exact = self.exact(step)
        kv = list(call.kv_lens)
        offsets = {k - e for k, e in zip(kv, exact)}
        if len(kv) < step.raw or len(offsets) != 1:
            rec.why = "planner rows not committed + a constant"
            return
        try:
            site = fs.SplitSite(call, self.device_now(), probe.kv_bytes)
        except ValueError as exc:
            rec.why = f"planner call outside the port ({exc})"
            return
        rec.calls.append(CallTemplate(probe.wrapper, call, offsets.pop(), tuple(kv[step.raw:]), site))


ENGINE = Engine()


def runtime_reason(scheduler, fm, topk_one: bool = True) -> str | None:
    """Why this scheduler must keep stock's resolve: what the server facts could not rule out. ``topk_one``:
    topk > 1 is a reason (the certified plan covers topk 1 only)."""
    import sglang.srt.layers.attention.flashinfer_backend as fb

    from sglang.srt.environ import envs

    args = scheduler.server_args
    if not fm.needs_cpu_seq_lens:
        return "SGLang does not read the seq lens back here"
    topk = int(args.speculative_eagle_topk or 1)
    if not ((envs.SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN.get() or topk > 1)
            and envs.SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR.get()):
        return ("SGLang's FlashInfer host plans are off: select flashinfer_verify_host_plan and "
                "flashinfer_draft_host_indptr beside it (the flashinfer preset has both)")
    if not getattr(scheduler, "enable_overlap", False):
        return "no overlap scheduling"
    if getattr(scheduler, "enable_fpm", False):
        from sglang.srt.managers.scheduler_components import metrics_reporter

        algorithm = getattr(scheduler, "spec_algorithm", None)
        if algorithm not in metrics_reporter._SPEC_DECODE_SNAPSHOT_ALGORITHMS:
            return (f"forward-pass metrics under {getattr(algorithm, 'name', algorithm)}: SGLang's "
                    "_build_scheduled_request_metrics reads seq_lens_cpu of every decode batch that has no "
                    "spec-decode snapshot")
    checks = (
        (args.enable_mixed_chunk, "mixed chunked prefill (its decode tails read the host lengths)"),
        (int(args.pp_size or 1) > 1, "pipeline parallelism"),
        (str(args.disaggregation_mode or "null") != "null", "disaggregation"),
        (bool(getattr(args, "enable_hisparse", False)), "HiSparse"),
        (bool(args.enable_two_batch_overlap), "two-batch overlap"),
        (topk_one and topk != 1, "topk > 1"),
        (bool(args.speculative_adaptive), "adaptive speculative steps"),
        (getattr(scheduler.req_to_token_pool, "mamba_pool", None) is not None, "a hybrid (mamba) model"),
    )
    for on, what in checks:
        if on:
            return what
    config = scheduler.tp_worker.model_runner.model_config
    if getattr(config, "model_is_mrope", False) or getattr(config, "is_encoder_decoder", False):
        return "an M-RoPE or encoder-decoder model (host-length positions)"
    backends = getattr(scheduler.draft_worker, "spec_v2_attn_backends", ())
    if len(backends) != 3:
        return "not an EAGLE v2 worker"
    target, draft, extend = backends
    for b in (target, extend):
        if not isinstance(b, fb.FlashInferAttnBackend) or b.dispatch_reason is not None:
            return "a target or draft-extend backend other than single-wrapper FlashInfer"
    if not isinstance(draft, fb.FlashInferMultiStepDraftBackend) or draft.draft_window_size \
            or any(b.dispatch_reason is not None for b in draft.attn_backends):
        return "a draft backend other than FlashInfer's multi-step one without a window"
    return None


# ---------------------------------------------------------------------------
# Hooks
# ---------------------------------------------------------------------------
def run_next_batch(engine: Engine, original, self, running_batch, last_batch):
    plan = original(self, running_batch, last_batch)
    try:
        engine.decide(self, plan.batch_to_run)
    except Exception as exc:  # noqa: BLE001 (never into the scheduler loop)
        engine.step = engine.ended = None
        fm = getattr(self, "future_map", None)
        if fm is not None:
            fm.needs_cpu_seq_lens = engine.stock_flag
        engine.disable(f"decision raised {type(exc).__name__}: {exc}")
    return plan


def next_batch_hook(original, self, running_batch, last_batch):
    return run_next_batch(ENGINE, original, self, running_batch, last_batch)


def _spec_kind(spec_info) -> str | None:
    from sglang.srt.speculative.spec_info import SpecInputType

    kind = getattr(spec_info, "spec_input_type", None)
    if kind == SpecInputType.EAGLE_VERIFY and getattr(spec_info, "topk", 1) == 1:
        return "verify"
    if kind == SpecInputType.EAGLE_DRAFT_EXTEND:
        return "draft_extend"
    return None


def run_prefill_update(engine: Engine, install, original, self, req_pool_indices, seq_lens, seq_lens_cpu,
                       seq_lens_sum, prefix_lens, prefill_wrappers, use_ragged, encoder_lens, spec_info,
                       fixed_split_size, multi_item_params, cross_attention_custom_mask, extend_prefix_lens_cpu,
                       custom_kv_indices, *, plan):
    """``update_single_wrapper`` with the step's host lengths from ``engine`` and ``install(wrapper, kv_dtype)``
    on a wrapper replanned by ``fast_prefill_plan``."""
    kind = engine.site_kind(spec_info) if engine.step is not None else None
    if kind is not None:
        wrapper = prefill_wrappers[0]
        if _uses(wrapper, "fast_prefill_plan"):
            install(wrapper, self.data_type)
        else:
            engine.unprobed_site(kind)
        fill = self.attn_backend.get_cuda_graph_seq_len_fill_value()
        offset = spec_info.num_tokens_per_req if kind == "draft_extend" else 0
        seq_lens_cpu, seq_lens_sum = engine.site_lens(kind, len(seq_lens), seq_lens_cpu, seq_lens_sum, fill, offset)
    try:
        return original(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens, prefill_wrappers,
                        use_ragged, encoder_lens, spec_info, fixed_split_size, multi_item_params,
                        cross_attention_custom_mask, extend_prefix_lens_cpu, custom_kv_indices, plan=plan)
    finally:
        if kind is not None:
            engine.site_done(kind)


def prefill_update_hook(original, self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens,
                        prefill_wrappers, use_ragged, encoder_lens, spec_info, fixed_split_size=None,
                        multi_item_params=None, cross_attention_custom_mask=None, extend_prefix_lens_cpu=None,
                        custom_kv_indices=None, *, plan):
    return run_prefill_update(ENGINE, install_probe, original, self, req_pool_indices, seq_lens, seq_lens_cpu,
                              seq_lens_sum, prefix_lens, prefill_wrappers, use_ragged, encoder_lens, spec_info,
                              fixed_split_size, multi_item_params, cross_attention_custom_mask,
                              extend_prefix_lens_cpu, custom_kv_indices, plan=plan)


def run_draft_template(engine: Engine, install, original, self, forward_batch, kv_indices_buffer, call_fn):
    """``common_template`` with the step's host lengths from ``engine`` and ``install(wrapper, kv_dtype)`` on
    each CUDA-graph wrapper replanned by ``fast_decode_plan``."""
    step = engine.step
    if step is None:
        return original(self, forward_batch, kv_indices_buffer, call_fn)
    graph = kv_indices_buffer is getattr(self, "cuda_graph_kv_indices", None)
    bs = forward_batch.batch_size
    for backend in self.attn_backends:
        wrappers = backend.decode_cuda_graph_metadata.get(bs, ()) if graph else ()
        for w in wrappers:
            if _uses(w, "fast_decode_plan"):
                install(w, backend.indices_updater_decode.data_type)
        if not wrappers or not all(_uses(w, "fast_decode_plan") for w in wrappers):
            engine.unprobed_site("draft_decode")
    held = (forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum)
    fill = self.attn_backends[0].get_cuda_graph_seq_len_fill_value()
    forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum = engine.site_lens("draft_decode", bs, *held, fill, 0)
    try:
        return original(self, forward_batch, kv_indices_buffer, call_fn)
    finally:
        forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum = held
        engine.site_done("draft_decode")


def draft_template_hook(original, self, forward_batch, kv_indices_buffer, call_fn):
    return run_draft_template(ENGINE, install_probe, original, self, forward_batch, kv_indices_buffer, call_fn)


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------
def precheck_upstream() -> str | None:
    """The port tracks FlashInfer 0.7.2 (SGLang 0.5.23's pin): another installed version is refused.
    Without FlashInfer (a CPU box) only SGLang's pinned sources are checked."""
    if have := fs.other_flashinfer():
        return (f"flashinfer {have} installed; the planner port tracks flashinfer {fs.FLASHINFER_VERSION} "
                "(SGLang 0.5.23's pin)")
    return pinned_sources(PINS, "what the certified plan relies on")


def inert(f: ServingFacts) -> str | None:
    if f.topk is not None and f.topk != 1 and f.speculative_algorithm and f.is_eagle_family():
        return f"inert because --speculative-eagle-topk is {f.topk}; the certified plan covers topk 1"
    # The plan sites' host plans are SGLang's two switches: where either is inert, so is this slot.
    return step_rules_inert(f) or verify_host_plan_inert(f) or draft_host_indptr_inert(f)


def step_rules_inert(f: ServingFacts) -> str | None:
    """What keeps a spec-v2 EAGLE step's resolve on every server (the rules before SGLang resolves)."""
    if reason := not_speculative(f, "only the EAGLE-family step plans FlashInfer from seq_lens this way",
                                 bool(f.speculative_algorithm) and f.is_eagle_family()):
        return reason
    for on, what in ((f.disable_overlap_schedule, "--disable-overlap-schedule is set (no per-step resolve)"),
                     (f.dp_attention, "attention DP is on (DP reads the host lengths)"),
                     (f.two_batch_overlap, "two-batch overlap is on (it splits by the host lengths)"),
                     (f.tp_size > 1, f"--tp-size is {f.tp_size} (not checked beyond one rank)"),
                     (f.speculative_adaptive, "adaptive speculative steps are on")):
        if on:
            return f"inert because {what}"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (FlashInfer plan certified from host windows of seq_lens)",
    summary="experimental, not registered: EAGLE topk-1 FlashInfer steps skip the seq-lens D2H + synchronize "
            "when the ported planner proves FlashInfer's plan is the same for every length the host cannot rule "
            "out",
    default=False,
    seq_lens_read="skipped on the topk-1 decode steps its certificate covers",
    # Without the step's read nothing drains the stream between two plans of a wrapper: the pinned
    # plan buffer's write-after-read hazard (flashinfer_plan_guard's docstring).
    requires=(PLAN_GUARD,),
    precheck=config_precheck(None, precheck_upstream),
    inert=inert,
    targets=(
        HookTarget(NEXT_BATCH, TargetKind.FUNCTION, hook=next_batch_hook,
                   params=("self", "running_batch", "last_batch"), source_sha="34f30fd4dfb13d74"),
        HookTarget(PREFILL_UPDATE, TargetKind.FUNCTION, hook=prefill_update_hook,
                   params=("self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "prefix_lens",
                           "prefill_wrappers", "use_ragged", "encoder_lens", "spec_info", "fixed_split_size",
                           "multi_item_params", "cross_attention_custom_mask", "extend_prefix_lens_cpu",
                           "custom_kv_indices", "plan"),
                   source_sha="04fb3c4863eec4a2"),
        HookTarget(DRAFT_TEMPLATE, TargetKind.FUNCTION, hook=draft_template_hook,
                   params=("self", "forward_batch", "kv_indices_buffer", "call_fn"), source_sha="aa0db6aa10f8ebaa"),
    ),
)
