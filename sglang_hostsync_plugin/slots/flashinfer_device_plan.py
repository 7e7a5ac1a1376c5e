"""Slot ``flashinfer_device_plan`` (opt-in; in ``auto``'s FlashInfer topk > 1 pick): an
EAGLE-family FlashInfer decode step (topk 1 or more) skips ``FutureMap.resolve_seq_lens_cpu``'s D2H and stream
synchronize, and FlashInfer's CUDA-graph plans of that step are made on the GPU from the lengths FlashInfer's
kernels read, by ``flashinfer_device_plan.prefill_plan`` / ``decode_plan`` (docs/flashinfer-bound-plan.md,
section 8): stock's plan exactly, with no host lengths.

On a GPU: ``tests/test_gpu_flashinfer_device_plan.py`` (the kernel against FlashInfer's planners, attention
bit for bit) and ``tests/test_gpu_flashinfer_device_plan_slot.py`` (real servers: outputs, syncs, run-ahead).

One decode step, on top of ``flashinfer_certified_plan``'s machinery (its window, runtime rules, window
check and the same three hook targets; read its docstring, steps 1, 3, 5 and 6):

1. Decision (``Scheduler.get_next_batch_to_run``): where the certified plan's window exists (every
   request's device length within ``[lo, hi]``, ``hi`` within the KV SGLang allocated) and no runtime rule
   keeps stock's read, the step's resolve runs SGLang's GPU-only branch (``needs_cpu_seq_lens`` False): no
   certificate, no template. Only at a batch size where one earlier stock step (the first at that size, a
   probe) ran all three sites through the installed CUDA-graph planners: a size whose probe saw a site
   planned otherwise (an eager batch, whose draft extend reads the host lengths) keeps stock's read.
2. Sites (``update_single_wrapper`` for verify and draft extend, ``common_template`` for the draft
   decode) get the ``hi`` lengths laid out as SGLang lays out its host lengths there (plus the site's
   offset; CUDA-graph padding rows as ``fill + offset``). They only size what SGLang sizes from host
   lengths (index buffers, gather tilings, the packed mask's per-request regions, which its packing and the
   kernel both read from the same indptr); the plan does not come from them.
3. Planner (the CUDA-graph wrappers' ``_cached_module.plan``, which SGLang's ``fast_prefill_plan`` and
   FlashInfer's ``fast_decode_plan`` call after the wrapper's device buffers hold this step's indptrs): in
   such a step the plan is written on the stream into the wrapper's int workspace from those device
   buffers, and the capture's ``plan_info`` is returned (under CUDA graphs no field of it moves with the
   lengths). FlashInfer's own planner, and its pinned-buffer copy, do not run. A call the device plan does
   not cover (decided per wrapper at its first planner call: a fixed split size, no split KV, a sliding
   window, another backend, a budget above the captured padded size), or one whose device plan raises
   (which turns the slot off), goes to FlashInfer with the exact lengths read back from the wrapper's own
   indptr buffer (blocking, counted as a rescue); that batch size keeps stock's read afterwards.
4. The verify's tree mask (topk > 1, ``build_eagle_verify_input``): without host lengths SGLang sizes its
   FULL_MASK from ``bs * max_context_len`` and fills it every step; in a skipped step the batch's
   ``seq_lens_sum`` is the window's upper sum for that call only (SGLang's comment there: only the size
   reads it, over-size is safe).

Cost: one Triton launch per planner call in place of FlashInfer's host planner and its pinned copy (not
measured yet); the kernel is compiled once per power-of-two bucket of planner rows above 16, at the first
skipped step that needs it (Triton's on-disk cache keeps it for later processes). Every argument of a wrapper's
launch is bound once (tensors and ints), so with ``triton_replay_launch`` (in ``eagle_host``) its later launches
are SGLang's ``replay_launches`` relaunches, without Triton's JIT dispatch (not run on a GPU yet).

Counted and logged after device plans 1, 10, 100 and every 1000th (``hostsync: flashinfer_device_plan
check: ...``, the line the e2e benchmark collects): skipped steps, stock steps with their reasons, device
plans, rescues, window checks. A window miss turns the slot off for the process (stock's read every step
after), as in the certified plan.

Inert (by rule, before launch): as ``flashinfer_certified_plan`` (overlap, CUDA graphs, one rank, SGLang's
draft host-indptr switch), with the verify's host plan SGLang's switch at topk 1 and
``flashinfer_tree_verify_plan`` above; the same runtime rules, topk > 1 allowed.

Hook targets (AROUND): ``Scheduler.get_next_batch_to_run``,
``FlashInferIndicesUpdaterPrefill.update_single_wrapper``,
``FlashInferMultiStepDraftBackend.common_template`` (the certified plan's three) and
``eagle_worker_common.build_eagle_verify_input``; pinned beyond them: the certified plan's ``PINS``.
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from .. import flashinfer_split as fs
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck
from . import flashinfer_certified_plan as cert, flashinfer_tree_verify_plan as tree_verify
from .upstream_host_plans import draft_host_indptr_inert, verify_host_plan_inert
from .flashinfer_plan_guard import NAME as PLAN_GUARD
from .triton_replay_launch import replayed

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "flashinfer_device_plan"
VERIFY_INPUT = "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input"
LOG_AT = (1, 10, 100)


@dataclass
class Stats:
    decode_steps: int = 0
    skipped: int = 0
    stock: collections.Counter = field(default_factory=collections.Counter)
    device_plans: int = 0
    rescues: int = 0
    window_checks: int = 0
    window_misses: int = 0
    window_unchecked: int = 0

    def line(self) -> str:
        reasons = ", ".join(f"{k} {v}" for k, v in self.stock.most_common()) or "none"
        return (f"{self.device_plans} device plans, {self.rescues} rescues; {self.skipped} of {self.decode_steps} "
                f"decode steps skipped the seq-lens read (stock: {reasons}); window checked {self.window_checks}x, "
                f"{self.window_misses} misses, {self.window_unchecked} unchecked")


class DevicePlanner:
    """Stands in for a CUDA-graph wrapper's ``_cached_module``: ``plan`` goes through the engine, every
    other attribute is the module's. ``launch``: None until the wrapper's first planner call in a skipped
    step decides it (``device_plan_for``): then the device plan, ready to run, or why there is none."""

    __slots__ = ("module", "wrapper", "launch")

    def __init__(self, module, wrapper):
        self.module = module
        self.wrapper = weakref.ref(wrapper)
        self.launch: Callable[[], None] | str | None = None

    def __getattr__(self, name):
        return getattr(self.module, name)

    def plan(self, *args):
        return ENGINE.on_plan(self, args)


def install_planner(wrapper) -> None:
    module = getattr(wrapper, "_cached_module", None)
    if module is not None and not isinstance(module, DevicePlanner):
        wrapper._cached_module = DevicePlanner(module, wrapper)


@replayed
def launch_plan(*args) -> None:
    """``flashinfer_device_plan.launch_plan``: with ``triton_replay_launch`` applied, a wrapper's every later
    launch (the same tensors and ints) relaunches the recorded kernel without Triton's JIT dispatch."""
    from ..flashinfer_device_plan import launch_plan as launch

    launch(*args)


def device_plan_for(wrapper, args, device: fs.Device) -> Callable[[], None] | str:
    """This wrapper's device plan, its arguments bound (every one is fixed by the wrapper's capture: its
    buffers, batch size, heads and ``plan_info``), or why the device plan does not make this call's plan."""
    from ..flashinfer_device_plan import DECODE_PLAN_INFO_FIELDS, decode_args, prefill_args

    if not wrapper.is_cuda_graph_enabled:
        return "not a CUDA-graph wrapper"
    info = [int(x) for x in (getattr(wrapper, "_plan_info", None) or ())]
    ws = wrapper._int_workspace_buffer
    if len(args) == fs.PREFILL_PLAN_ARGS:
        call = fs.PlannerCall.from_args(args)
        for bad, why in ((call.window_left >= 0, "a sliding window"), (call.fixed_split_size > 0, "a fixed split size"),
                         (call.disable_split_kv, "split KV disabled"), (call.num_colocated_ctas, "colocated CTAs"),
                         (call.uniform_q_len, "a uniform query length"), (not call.enable_cuda_graph, "no CUDA graph"),
                         (len(info) != len(fs.PLAN_INFO_FIELDS), "no captured prefill plan_info")):
            if bad:
                return why
        plan_info = dict(zip(fs.PLAN_INFO_FIELDS, info))
        budget = fs.prefill_max_batch_size_if_split(device.num_sm, call.num_kv_heads)
        for bad, why in ((not plan_info["split_kv"], "the capture planned without split KV"),
                         (budget > plan_info["padded_batch_size"], "a split budget above the captured padded size"),
                         (call.total_num_rows != plan_info["total_num_rows"], "another row count than the capture's")):
            if bad:
                return why
        return partial(launch_plan, *prefill_args(
            wrapper._qo_indptr_buf, wrapper._paged_kv_indptr_buf, ws, plan_info, batch_size=call.batch_size,
            gqa=call.num_qo_heads // call.num_kv_heads, max_batch_size_if_split=budget, page_size=call.page_size))
    if len(args) == DECODE_PLAN_ARGS:
        for bad, why in ((int(args[9]) >= 0, "a sliding window"), (not bool(args[8]), "no CUDA graph"),
                         (len(info) != len(DECODE_PLAN_INFO_FIELDS), "no captured decode plan_info")):
            if bad:
                return why
        return partial(launch_plan, *decode_args(wrapper._paged_kv_indptr_buf, ws,
                                                 dict(zip(DECODE_PLAN_INFO_FIELDS, info)),
                                                 batch_size=int(args[4]), page_size=int(args[7])))
    return f"a planner of {len(args)} arguments (fa3's prefill planner takes 16)"


# FlashInfer 0.7.2's CUDA-core decode planner (fast_decode_plan without tensor cores): its 15 arguments.
DECODE_PLAN_ARGS = 15


class Engine(cert.Engine):
    name = NAME

    def reset(self) -> None:
        super().reset()
        self.stats = Stats()
        self.stock_sizes: set[int] = set()  # batch sizes where a site was not covered: stock's read there
        self.covered_sizes: set[int] = set()  # batch sizes whose probe ran every site through a CUDA-graph plan
        self.probing: cert.Step | None = None  # the stock step probing its batch size (decide, step 1)
        self.probe_sites: set[str] = set()  # the kinds its sites were
        self.probe_eager = False  # one of them was planned by FlashInfer's plan()

    def runtime_reason(self, scheduler, fm) -> str | None:
        if self.max_accept(scheduler.server_args) < 2:
            return "no speculative steps known (the window needs the most a verify commits)"
        return cert.runtime_reason(scheduler, fm, topk_one=False)

    @staticmethod
    def max_accept(server_args) -> int:
        """The most tokens one verify commits: the tree's depth plus the bonus token, SGLang's
        ``EagleVerifyInput.max_tree_depth`` (at topk 1 the draft tokens; at topk > 1 fewer than them)."""
        steps = int(getattr(server_args, "speculative_num_steps", 0) or 0)
        return steps + 1 if steps > 0 else 0

    @staticmethod
    def site_kind(spec_info) -> str | None:
        from sglang.srt.speculative.spec_info import SpecInputType

        kind = getattr(spec_info, "spec_input_type", None)
        if kind == SpecInputType.EAGLE_VERIFY:
            return "verify"
        return "draft_extend" if kind == SpecInputType.EAGLE_DRAFT_EXTEND else None

    def unprobed_site(self, kind: str) -> None:
        """A site planned by FlashInfer's own ``plan()`` (an eager batch, or a verify without a host plan):
        it reads the lengths back itself. Steps of this batch size keep stock's read from now on."""
        step = self.step
        if step is not None and step is self.probing:
            self.probe_eager = True
        if step is not None and step.skipped and step.raw not in self.stock_sizes:
            self.stock_sizes.add(step.raw)
            logger.info("hostsync: %s: the %s of %d requests is planned by FlashInfer's plan(); stock's read for "
                        "that batch size", NAME, kind, step.raw)

    def decide(self, scheduler, batch) -> None:
        begun = self.begin(scheduler, batch)
        if begun is None:
            return
        fm, step = begun
        if step.raw in self.stock_sizes:
            return self._stock(step, "not covered")
        if step.raw not in self.covered_sizes:  # its sites may run eagerly: probe them with stock's read
            self.probing, self.probe_sites, self.probe_eager = step, set(), False
            return self._stock(step, "first at this size")
        step.skipped = True
        fm.needs_cpu_seq_lens = False  # this step's resolve runs SGLang's GPU-only branch
        self.stats.skipped += 1

    def finish_step(self) -> None:
        step = self.step or self.ended
        self.step = self.ended = None
        if step is not None and step is self.probing:
            if self.probe_eager:
                self.stock_sizes.add(step.raw)
                logger.info("hostsync: %s: a step of %d requests is planned by FlashInfer's plan(); stock's read "
                            "for that batch size", NAME, step.raw)
            elif self.probe_sites >= set(cert.KINDS):
                self.covered_sizes.add(step.raw)
        self.probing, self.probe_sites, self.probe_eager = None, set(), False

    def site_lens(self, kind: str, bs: int, seq_lens_cpu, seq_lens_sum, fill: int, offset: int):
        """In a skipped step: the ``hi`` lengths plus the site's offset, padding rows ``fill + offset``."""
        step = self.step
        if step is not None and step is self.probing:
            self.probe_sites.add(kind)
        if step is None or not step.skipped or seq_lens_cpu is not None:
            return seq_lens_cpu, seq_lens_sum
        if step.seq_dev is None:
            step.seq_dev = step.batch.seq_lens
            self.queue_window_copy(step)
        step.site = (kind, bs, "hi")
        lens = [h + offset for h in step.hi] + [fill + offset] * (bs - step.raw)
        return torch.tensor(lens, dtype=torch.int64), int(sum(lens))

    def on_plan(self, planner: DevicePlanner, args):
        step = self.step
        if step is None or not step.skipped or step.site is None:
            return planner.module.plan(*args)  # stock's plan from the exact host lengths SGLang gave
        wrapper = planner.wrapper()
        if planner.launch is None:
            try:
                planner.launch = device_plan_for(wrapper, args, self.device_now())
            except Exception as exc:  # noqa: BLE001 (decided off the forward's path: stock from here on)
                planner.launch = f"the coverage check raised {type(exc).__name__}: {exc}"
            if isinstance(planner.launch, str):
                logger.info("hostsync: %s: a %s wrapper keeps FlashInfer's planner (%s)", NAME, step.site[0],
                            planner.launch)
        if callable(planner.launch) and not self.disabled:
            try:
                planner.launch()
            except Exception as exc:  # noqa: BLE001 (e.g. a kernel that fails to compile: never into the forward)
                self.disable(f"the device plan raised {type(exc).__name__}: {exc}")
            else:
                self.stats.device_plans += 1
                if self.stats.device_plans in LOG_AT or self.stats.device_plans % 1000 == 0:
                    logger.info("hostsync: %s check: %s", NAME, self.stats.line())
                return wrapper._plan_info
        self.stock_sizes.add(step.raw)
        return planner.module.plan(*self.exact_args(wrapper, args))

    def exact_args(self, wrapper, args):
        """The planner call with the lengths FlashInfer's kernels will read: the wrapper's device indptr
        read back (blocking), row for row whatever the site's layout (topk rows per request included)."""
        self.stats.rescues += 1
        args = list(args)
        if len(args) == fs.PREFILL_PLAN_ARGS:
            bs = int(args[7])
            indptr = wrapper._paged_kv_indptr_buf[: bs + 1].to("cpu", torch.int32)
            args[fs.KV_INDPTR], args[fs.KV_LENS] = indptr, indptr[1:] - indptr[:-1]
        else:
            args[3] = wrapper._paged_kv_indptr_buf[: int(args[4]) + 1].to("cpu", torch.int32)
        return tuple(args)


ENGINE = Engine()


# ---------------------------------------------------------------------------
# Hooks: the certified plan's, with this engine and planner
# ---------------------------------------------------------------------------
def next_batch_hook(original, self, running_batch, last_batch):
    return cert.run_next_batch(ENGINE, original, self, running_batch, last_batch)


def prefill_update_hook(original, self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens,
                        prefill_wrappers, use_ragged, encoder_lens, spec_info, fixed_split_size=None,
                        multi_item_params=None, cross_attention_custom_mask=None, extend_prefix_lens_cpu=None,
                        custom_kv_indices=None, *, plan):
    return cert.run_prefill_update(ENGINE, _install, original, self, req_pool_indices, seq_lens, seq_lens_cpu,
                                   seq_lens_sum, prefix_lens, prefill_wrappers, use_ragged, encoder_lens, spec_info,
                                   fixed_split_size, multi_item_params, cross_attention_custom_mask,
                                   extend_prefix_lens_cpu, custom_kv_indices, plan=plan)


def draft_template_hook(original, self, forward_batch, kv_indices_buffer, call_fn):
    return cert.run_draft_template(ENGINE, _install, original, self, forward_batch, kv_indices_buffer, call_fn)


def _install(wrapper, kv_dtype) -> None:
    install_planner(wrapper)


def verify_input_hook(original, batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, *,
                      target_worker, topk, num_steps, num_draft_tokens, tree_mask_mode, device):
    step = ENGINE.step
    bound = step is not None and step.skipped and batch.seq_lens_sum is None and step.hi is not None
    if bound:  # (only the tree mask's size reads it here)
        batch.seq_lens_sum = int(sum(step.hi))
    try:
        return original(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs,
                        target_worker=target_worker, topk=topk, num_steps=num_steps,
                        num_draft_tokens=num_draft_tokens, tree_mask_mode=tree_mask_mode, device=device)
    finally:
        if bound:
            batch.seq_lens_sum = None


def inert(f: ServingFacts) -> str | None:
    """The certified plan's step rules; the verify's host plan is SGLang's switch at topk 1 and
    ``flashinfer_tree_verify_plan`` above it; the draft's host indptr is SGLang's switch."""
    verify = verify_host_plan_inert(f) if (f.topk or 1) == 1 else tree_verify.inert(f)
    return cert.step_rules_inert(f) or verify or draft_host_indptr_inert(f)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (FlashInfer's CUDA-graph plans made on the GPU from the device lengths)",
    summary="EAGLE-family FlashInfer decode steps skip the seq-lens D2H + synchronize; FlashInfer's "
            "CUDA-graph plans are made on the GPU from the lengths its kernels read (stock's plan exactly)",
    default=False,
    seq_lens_read=("skipped on the decode steps whose plans it makes on the GPU; kept at a batch size's first step, "
                   "where a site is not covered, without a window or under a runtime rule, and for good after a "
                   "window miss"),
    # Stock steps still plan on the host into the pinned buffer: flashinfer_plan_guard's hazard.
    requires=(PLAN_GUARD,),
    precheck=config_precheck(None, cert.precheck_upstream),
    inert=inert,
    targets=tuple(replace(t, hook=hook) for t, hook in zip(
        cert.SLOT.targets, (next_batch_hook, prefill_update_hook, draft_template_hook))) + (
        HookTarget(VERIFY_INPUT, TargetKind.FUNCTION, hook=verify_input_hook,
                   params=("batch", "draft_input", "parent_list", "top_scores_index", "draft_tokens", "draft_probs",
                           "target_worker", "topk", "num_steps", "num_draft_tokens", "tree_mask_mode", "device"),
                   source_sha="710372aeb30979fe"),),
)
