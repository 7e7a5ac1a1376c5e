"""Slot ``dspark_step_graph`` (not registered yet): a DSpark v2 decode step replayed as one CUDA
graph launch (design: docs/dflash-step-graph.md; the machinery is ``eagle_step_graph``'s, the
structure ``dflash_step_graph``'s).

SGLang 0.5.23's ``DSparkWorkerV2._forward_decode`` (DW:961-1344, called positionally by
``forward_batch_generation`` for every non-extend step) runs two CUDA graphs per decode step (the
draft block, whose tail folds the Markov proposal; the target verify) and, around them, the
verify window and its KV plan, the draft's ``ForwardBatch``, the verify input and metadata, the
greedy accept, the draft context-KV commit and the next draft input. This slot runs that function
once per batch size under CUDA graph capture, in segments cut at the two runners' replays, and
joins the segments and SGLang's own runner graphs (as child nodes, unchanged) into one graph per
batch size and input layout. Each later step of that key:

- marks ``batch.seq_lens`` as used on the current stream (stock's ``record_stream``, DW:1007);
- calls SGLang's ``TargetVerifyExecutor.begin_simulated_step`` (below), then copies this step's
  input tensors (``ScheduleBatch``, its ``DFlashDraftInputV2``, its sampling info: the same names
  as ``dflash_step_graph``'s, whose gather / install / stray scan are reused) into the tensors the
  capture read, in one ``_foreach_copy_``;
- launches the joined graph on the current stream (one driver call);
- returns the captured ``GenerationBatchResult`` with its host-read tensors cloned (next tokens,
  accept lengths, new lengths and DSpark's ``block_accept_lens``: the scheduler copies them D2H on
  its copy stream while the next step runs, DW:1411 and ``GenerationBatchResult.copy_to_cpu``),
  and calls ``on_publish`` after the launch with what the captured step passed it (its
  ``confidence`` keyword included; stock publishes mid-step).

Rules. A step stays on SGLang's eager path (counted by reason; once capturing is off, before any
other rule is read) unless every Python decision of the function is fixed by the batch size:
decode (not idle, not extend), no DP prefill coordination plan, greedy, no logprobs / hidden
states / grammar / penalties (a required penalizer included: ``verify_logits_adjustments_are_noop``
reads it) / logit bias / watermark / custom logit processor / sampling masks / hisparse / mamba
tracking / multimodal inputs, no host copy of the lengths (``batch.seq_lens_cpu`` None) but the
draft input's host KV bound present (``nxt_kv_lens_cpu``), and no CUDA tensor on those three
objects besides the named inputs and ``dflash_step_graph``'s ignore list, each input with the
shape it had at capture. Server-wide, checked in the scheduler before each capture against
SGLang's resolved settings and the live worker: ``dflash_step_graph``'s list (PP, tensor
parallelism or attention DP, no overlap scheduling, adaptive steps, two-batch overlap, capture
outputs, expert recording, a decode CUDA-graph backend other than ``full``, the memory saver's
pausable graph capture), token-count staging (``enable_num_token_non_padded``: a pinned H2D copy
in the draft step a graph would replay from freed memory), a mamba target, a verify mode other
than ``static`` or a verify budget planner (host reads of confidence and layouts), no folded
proposal (``_draft_sampler`` None: the Markov proposal runs eagerly outside the draft graph), a
verify epilogue (DeepSeek V4.1 static or compact: the accept, commit, relay and engram fold
into the verify graph; the sampling-accept graph and the deferred context-KV commit come only
with it), the early target metadata (an event and a glue-graph replay on a side stream), a
runner with a metadata glue graph (its own replay inside the step), the engram hasher, any of
DSpark's step observers or recorders (``DsparkStepObservers``: host bookkeeping per step), a
DeepSeek V4.1 target (a per-step host bound over the requests), a translated KV pool, and
attention other than triton or FA3 (without a KV shard pool) for target and draft alike. At
startup (``inert``): DSPARK only (DFlash's step is another function), and the startup rules
``dflash_step_graph`` has, plus SGLang's env settings behind the rules above
(``SGLANG_RAGGED_VERIFY_MODE``, ``SGLANG_DSPARK_FOLDED_PROPOSAL``,
``SGLANG_OPT_DSV41_TARGET_METADATA_EARLY``, the observers' and recorders' settings).

Simulated acceptance (``SGLANG_SIMULATE_ACC_LEN``, benchmarks only) works at any length and
method: DSpark draws the length on the host and ``fill_``s a persistent one-element buffer
(``TargetVerifyExecutor.begin_simulated_step``), which the accept then reads on the device. Under
capture that call is shadowed by a no-op (nothing of it is captured); every replay makes it
before the launch, on the same stream, so each step draws as stock does, and a checked step's
eager rerun reads the replay's draw (shadowed again) instead of drawing a second one.

DSpark-specific hazards. (1) The proposer's ``_draft_block_ids_buf`` is re-created at exactly the
new batch size when a step outgrows it (DD:544-555): on a key's first eligible step (before its
warm-ups) it is sized to the target's largest decode graph batch size, and its address is part of
a graph's staleness check, as ``dflash_step_graph`` does with its buffers. DSpark's accept outputs
are fresh per step (no ping-pong pair, unlike DFlash's): under capture they come from the graph's
private pool and stay the graph's. (2) The decode path has no ``try/except`` fallback that turns
a flag off (the tests scan for one), but it builds three objects lazily on first use that a graph
then reads by address or by path: the draft model's fused KV-write bundle and stacked KV
projection (``_fused_kv_write_cache``, ``_stacked_ctx_kv_cache``) and the executor's backend
answer (``_verify_backend_self_adds_seq_lens_cache``). They are snapshotted before a capture; one
set or replaced during it fails the capture and is put back; their identities are part of the
staleness check (a graph keeps them alive, so an identity is not reused). (3) The proposer stages
the draft sampler's parameters only when the temperature / top-k tensor objects change (DD:633);
a replay restages rows ``[:bs]`` from its own slots, so the proposer's memo is cleared after every
capture and replay (the next eager step restages).

Each key's first two eligible steps run eagerly, the third is captured, then replayed; failed
captures, the graph limit, the eager self-check (which also compares the committed draft-KV rows
of the verify window) and a runner capture after startup (dropping every graph) behave as in
``eagle_step_graph`` and share its settings (``SGLANG_HOSTSYNC_STEP_GRAPH_CHECK``,
``SGLANG_HOSTSYNC_STEP_GRAPH_MAX``). Memory: as ``eagle_step_graph``'s, plus the proposer's draft
block ids at the largest decode graph batch size (int64, block + 1 columns).

Unsafe beside the ``dspark_mega`` switches that replay a graph of their own inside the step
(``target_verify_metadata_glue``, ``target_metadata_early``) or fold work into the verify
epilogue or carry it to the next step (``post_fold``, ``post_forward_graph``,
``fused_accept_tail``, ``defer_context_kv``, ``one_launch_commit_stage``); the worker rules above
keep the step eager where they take effect anyway. Not listed: ``sampling_accept_graph`` (its
graph runs only for all-sampled batches, which stay eager, and only beside the epilogue),
``mid_fold`` (the draft graph's tail writes the verify ids into a persistent buffer),
``prepare_inputs_once``, ``skip_prefilled_inputs``, ``draft_prep_fork`` (inside the draft
runner's own graph), ``sim_draw_ahead`` (the draw is shadowed wherever it is made),
``blockwise_rejection`` (sampled accepts only) and the non-DSpark ones.

Not registered (``slots/__init__.py``) until its GPU test passes. Hook targets, when registered:
``DSparkWorkerV2._forward_decode``, ``FullCudaGraphBackend.capture_one`` and
``FullCudaGraphBackend.replay`` (AROUND; the last two are ``eagle_step_graph``'s and
``dflash_step_graph``'s targets too, both inert wherever this slot acts, and the reverse).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass

import torch

from ..checks import file_pins
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from . import dflash_step_graph as dsg
from . import eagle_step_graph as es
from .dflash_step_graph import (
    _bits,
    attention_kind,
    gather,
    install,
    largest_bs,
    owners,
    present,
    record_stream,
    stray_input,
)
from .draft_extend_glue_graph import run_check
from .eagle_step_graph import (
    Capture,
    Driver,
    _restore,
    _snapshot,
    new_graph,
    reserved,
    side_stream,
    stream_handle,
)

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "dspark_step_graph"
MODULE = "sglang.srt.speculative.dspark_components"
WORKER = f"{MODULE}.dspark_worker_v2.DSparkWorkerV2"
CHILDREN = 2  # runner graphs per step: the draft block, the target verify

# The same scheduler objects as DFlash's step (the batch, a ``DFlashDraftInputV2``, the sampling
# info) and the same reads of them: ``dflash_step_graph``'s lists, which its gather / install /
# stray scan (reused here) read.
INPUTS, IGNORED = dsg.INPUTS, dsg.IGNORED
# Read on the host or on the copy stream after the next step was launched: cloned per step.
CLONED = ("next_token_ids", "accept_lens", "new_seq_lens", "block_accept_lens")
# The rest of what the scheduler reads of a result: a captured step returning one turns the slot off.
SIDE_OUTPUTS = tuple(n for n in es.SIDE_OUTPUTS if n not in CLONED)

# Built lazily on first use, then read by a graph (by address, or as the path it picked):
# (owner attribute of the worker, attribute).
LAZY_STATE = (("draft_model", "_fused_kv_write_cache"), ("draft_model", "_stacked_ctx_kv_cache"),
              ("_verify_executor", "_verify_backend_self_adds_seq_lens_cache"))
_MISSING = object()  # an attribute not set yet (``_stacked_ctx_kv_cache`` before its first use)

# SGLang's env settings behind the worker rules, read at startup (``inert``).
OBSERVER_ENVS = ("SGLANG_DSPARK_DEBUG_DUMP", "SGLANG_DSPARK_ENABLE_SPS_RECORD", "SGLANG_DSPARK_STS_COLLECT_PATH",
                 "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL",
                 "SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS")

# Upstream code the rules rely on beyond the hooked functions (read from the module files).
PINS = (
    (f"{WORKER}.forward_batch_generation", "3a76113b3cdb30a0"),  # decode -> _forward_decode, positionally
    (f"{WORKER}._block_accept_lens", "c0cac043397eae3c"),
    (f"{MODULE}.dspark_draft.DraftBlockProposer.propose", "f4b3593cefe9646a"),
    (f"{MODULE}.dspark_draft.DraftBlockProposer._run_forward", "e56e2d2b49917e21"),
    (f"{MODULE}.dspark_draft.DraftBlockProposer.draft_block_ids_view", "6e7b10238b570007"),
    (f"{MODULE}.dspark_draft.DraftBlockProposer._stage_sampling_params", "e350438df0247a83"),
    (f"{MODULE}.dspark_verify.TargetVerifyExecutor.begin_simulated_step", "12e77ad5f057b43a"),
    (f"{MODULE}.dspark_verify.TargetVerifyExecutor.run_non_compact", "7fc7c0dd16991286"),
    (f"{MODULE}.dspark_verify.TargetVerifyExecutor.accept_and_finalize", "c12a2d0e08b7fd02"),
    (f"{MODULE}.dspark_verify.TargetVerifyExecutor.commit_hidden", "6ff90c2c524e8890"),
    (f"{MODULE}.dspark_planner.alloc_verify_window", "87d91a0bb9bed9ec"),
    (f"{MODULE}.dspark_planner.DSparkVerifyPlanner.schedule_layout", "a20eada4c24fdd44"),
    (f"{MODULE}.dspark_planner.DSparkVerifyPlanner.resolve_verify_token_budget", "14384937092ba5e7"),
    (f"{MODULE}.dspark_observability.DsparkStepObservers.observe_verify_step", "d7a92a7a88c1e836"),
    ("sglang.srt.model_executor.forward_batch_info.enable_num_token_non_padded", "7721a4ade5670e54"),
    ("sglang.srt.managers.overlap_utils.FutureMap.publish", "864f5b019ed83b32"),
    # dflash_step_graph's rules, shared: the target verify input, the decode backend, the saver's capture.
    ("sglang.srt.layers.attention.triton_backend.TritonAttnBackend._update_target_verify_buffers",
     "e37fbbefcd82e396"),
    ("sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend._apply_cuda_graph_metadata",
     "001fe20be539df74"),
    ("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator.build_iteration_table", "db1f215dcfd41f88"),
    ("sglang.srt.model_executor.runner_backend.utils.resolve_decode_backend", "29a030e3c164d133"),
    (f"{es.BACKEND}.__init__", "137904e6ae16b6bb"),
)


def upstream_pins() -> str | None:
    return file_pins(PINS, "the step graph's rules rely on it")


# --- the worker's buffers and lazily built state ---


def presize(worker, bs: int, device) -> None:
    """Grow the proposer's draft block ids to ``bs`` rows now (SGLang's own growth, on the device
    the step passes it: the batch's), so a capture does not hold the pointer a larger step frees."""
    worker._proposer.draft_block_ids_view(bs=bs, device=device)


def buffer_pointers(worker) -> tuple:
    buf = worker._proposer._draft_block_ids_buf
    return (0 if buf is None else buf.data_ptr(),)


def lazy_state(worker) -> list[tuple[object, str, object]]:
    """(owner, attribute, value or ``_MISSING``) for ``LAZY_STATE``."""
    out = []
    for owner_name, name in LAZY_STATE:
        owner = getattr(worker, owner_name)
        out.append((owner, name, getattr(owner, name, _MISSING)))
    return out


def changed_state(state) -> list[str]:
    return [name for owner, name, value in state if getattr(owner, name, _MISSING) is not value]


def restore_state(state) -> None:
    for owner, name, value in state:
        if value is _MISSING:
            if name in vars(owner):
                delattr(owner, name)
        else:
            setattr(owner, name, value)


def worker_state(worker) -> tuple:
    """What a graph took from the worker at capture and a later eager step may change: the growing
    buffer's address and the lazily built objects' identities (the graph keeps them alive)."""
    return buffer_pointers(worker) + tuple(id(value) for _, _, value in lazy_state(worker))


def forget_staged_params(worker) -> None:
    """The proposer stages the draft sampler's parameters again at its next eager step (a capture
    or a replay wrote rows ``[:bs]`` from the graph's slots, behind its memo's back)."""
    worker._proposer._staged_params_key = None


def _no_draw() -> None:
    return None


@contextlib.contextmanager
def draw_outside(worker):
    """SGLang's simulated-acceptance draw (host draw, ``fill_``) shadowed by a no-op on the executor
    instance: under capture (a replay draws before its launch) and in a checked step's rerun (which
    reads the replay's draw)."""
    executor = worker._verify_executor
    state = vars(executor)
    had, old = "begin_simulated_step" in state, state.get("begin_simulated_step")
    executor.begin_simulated_step = _no_draw
    try:
        yield
    finally:
        if had:
            executor.begin_simulated_step = old
        else:
            del executor.begin_simulated_step


def recorder(into: dict):
    """An ``on_publish`` that keeps the keywords the step passes (``confidence``)."""

    def publish(new_seq_lens, **kwargs):
        into.clear()
        into.update(kwargs)

    return publish


# --- the graph ---


@dataclass
class StepGraph(es.StepGraph):
    state: tuple = ()  # ``worker_state`` at capture
    held: tuple = ()  # the lazily built objects at capture, kept alive (their ids are in ``state``)
    publish: dict | None = None  # the keywords the captured step passed ``on_publish``

    def current(self, worker) -> bool:
        """The runners still hold the graphs this one was joined from, and the worker's buffer and
        lazily built objects are the capture's."""
        return super().current() and self.state == worker_state(worker)

    def output(self):
        """A result for the scheduler: the captured one, host-read tensors cloned."""
        out = copy.copy(self.result)
        for name in CLONED:
            setattr(out, name, getattr(self.result, name).clone())
        out.next_draft_input = copy.copy(self.result.next_draft_input)
        out.extra_keep_alive_refs = list(self.result.extra_keep_alive_refs or ())
        return out


def side_output(result) -> str | None:
    """An output of the captured step, besides the cloned ones, that the scheduler reads, or None."""
    for name in SIDE_OUTPUTS:
        if getattr(result, name, None) is not None:
            return name
    logits = getattr(result, "logits_output", None)
    for name in es.LOGITS_SIDE_OUTPUTS:
        if getattr(logits, name, None) is not None:
            return f"logits_output.{name}"
    return None


def verify_window(worker, batch) -> torch.Tensor:
    """The verify window's KV slots ``[bs, W]`` (the target's ``req_to_token`` at the lengths the
    step starts from: what ``alloc_verify_window`` plans on a plain pool, where the draft's write
    ids are the same)."""
    lens, rows = batch.seq_lens, batch.req_pool_indices
    cols = lens[:, None].to(torch.int64) + torch.arange(worker.verify_num_draft_tokens, device=lens.device)
    return worker.model_runner.req_to_token_pool.req_to_token[rows[:, None].to(torch.int64), cols].to(torch.int64)


def draft_kv_rows(worker, locs: torch.Tensor, accept_lens: torch.Tensor) -> list[torch.Tensor]:
    """The draft KV rows the step committed, as raw bits: the verify window's first ``accept_lens``
    slots of each draft layer's K and V (the others zeroed), which the next step reads and the
    scheduler never does."""
    keep = torch.arange(locs.shape[1], device=locs.device)[None, :] < accept_lens[:, None].to(locs.device)
    pool = worker.draft_model_runner.token_to_kv_pool
    rows = []
    for layer in worker.draft_model.layers:
        lid = layer.self_attn.attn.layer_id
        for buf in (pool.get_key_buffer(lid), pool.get_value_buffer(lid)):
            got = buf[locs]
            if got.is_floating_point():
                got = got.view(dsg._BITS[got.element_size()])
            rows.append(torch.where(keep.view(*keep.shape, *[1] * (got.dim() - 2)), got, torch.zeros_like(got)))
    return rows


def fingerprint(result, worker, locs) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal)."""
    out = [getattr(result, name) for name in CLONED] + [result.next_draft_input.bonus_tokens]
    return [_bits(t) for t in out if t is not None] + draft_kv_rows(worker, locs, result.accept_lens)


@dataclass
class Route(es.Route):
    """``eagle_step_graph``'s per-process state, logging under this slot's name."""

    def count_eager(self, reason: str) -> None:
        n = self.eager.get(reason, 0) + 1
        self.eager[reason] = n
        if n in (1, 100) or n % 10000 == 0:
            logger.info("hostsync: %s: %d steps stayed eager: %s (%d replayed so far)", NAME, n, reason, self.replays)

    def drop(self, why: str) -> None:
        if not self.graphs and not self.warm:
            return
        logger.info("hostsync: %s: %s: dropping %s", NAME, why, self.held())
        for sg in self.graphs.values():
            self.driver.destroy(sg.parent, sg.exe)
        self.graphs.clear()
        self.warm.clear()
        self.skip.clear()
        self.pool, self.pool_bytes = None, 0


_route = Route()


# --- rules ---


def ineligible(worker, batch, coordination_plan) -> str | None:
    """Why this step must run SGLang's eager function, or None."""
    mode = batch.forward_mode
    if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or not mode.is_decode():
        return "not a decode step"
    spec, info = batch.spec_info, batch.sampling_info
    if spec is None or info is None or coordination_plan is not None:
        return "no draft input or sampling info (or a DP prefill coordination plan)"
    if batch.return_logprob or batch.return_hidden_states:
        return "logprobs or hidden states requested"
    if batch.has_grammar:
        return "a grammar"
    if not info.is_all_greedy:
        return "non-greedy sampling"
    if info.has_custom_logit_processor:
        return "a custom logit processor"
    penalizer = getattr(info, "penalizer_orchestrator", None)
    if (info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None
            or getattr(info, "acc_linear_penalties", None) is not None  # (read by U:236; no field in 0.5.23)
            or (penalizer is not None and penalizer.is_required)  # (verify_logits_adjustments_are_noop)
            or info.logit_bias is not None or info.has_watermark_candidates):
        return "penalties, logit bias or watermark"
    if info.sampling_mask_batch_indices is not None or info.grammar_mask is not None:
        return "sampling masks"
    if batch.hisparse_coordinator is not None or batch.mamba_track_indices is not None:
        return "hisparse or mamba state"
    if batch.seq_lens_cpu is not None:  # (the window's and the draft's host bounds, DW:1022, DD:593)
        return "host sequence lengths (seq_lens_cpu)"
    if spec.nxt_kv_lens_cpu is None:  # (else the draft raises, DD:600)
        return "no host KV bound (nxt_kv_lens_cpu)"
    if any(mm is not None for mm in batch.multimodal_inputs or ()):
        return "multimodal inputs"
    return None


def observers_on(worker) -> str | None:
    """A DSpark step observer or recorder that does host work per step, or None."""
    from sglang.srt.environ import envs

    obs = worker._observers
    if obs._info_dumper.enabled:
        return "the DSpark info dumper (SGLANG_DSPARK_DEBUG_DUMP / SGLANG_DSPARK_ENABLE_SPS_RECORD)"
    if obs._block_accept_recorder is not None:
        return "the block-accept estimator (SGLANG_DSPARK_BLOCK_ACCEPT_*)"
    if obs._sts_collect_path:
        return "STS collection (SGLANG_DSPARK_STS_COLLECT_PATH)"
    if envs.SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS.get():
        return "the confidence metrics probe (SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS)"
    return None


def worker_unsupported(worker) -> str | None:
    """What of the live worker makes the step decide on values a graph would freeze, or run work a
    step capture cannot hold."""
    if worker._need_mamba_verify_commit or worker._target_is_mambaish:
        return "a mamba target (the verify commits its state per step)"
    planner = worker._verify_planner
    if planner.mode_value != "static" or planner.schedules_verify_budget:
        return (f"SGLANG_RAGGED_VERIFY_MODE={planner.mode_value} (the verify budget and layout are planned from "
                "host reads)")
    if worker._draft_sampler is None:
        return "no folded proposal (the Markov proposal runs eagerly, outside the draft graph)"
    if worker._verify_epilogue is not None or worker._sampling_accept_graph is not None:
        return "the verify epilogue (accept, commit and relay folded into the verify graph)"
    if worker._proposer.deferred_commit is not None:
        return "the deferred context-KV commit (host state from step to step)"
    if worker._verify_inputs_ready is not None:
        return "the early target metadata (an event and a glue graph on a side stream)"
    if worker._verify_executor._target_is_dsv41:
        return "a DeepSeek V4.1 target (a host bound over the requests per step)"
    if worker.model_runner.ngram_embedding_manager.engram_hasher is not None:
        return "the engram hasher (its history commit after the verify)"
    why = observers_on(worker)
    if why:
        return why
    runners = (("target", worker.model_runner), ("draft", worker.draft_model_runner))
    for which, runner in runners:
        graphs = runner.decode_cuda_graph_runner
        if graphs is not None and graphs._metadata_glue is not None:
            return f"the {which} runner's metadata glue graph (its own replay inside the step)"
        if runner.kv_index_translator.is_translating:
            return f"the {which}'s translated KV pool (its read table is sized from host lengths)"
    kinds = set().union(*(attention_kind(runner.attn_backend) for _, runner in runners))
    if kinds not in ({"triton"}, {"fa3"}):
        return (f"attention {', '.join(sorted(kinds))}: the step graph is built for triton or FA3, target and "
                "draft alike")
    return None


def unsupported(worker) -> str | None:
    """Server-wide settings under which the step decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale (``dflash_step_graph.unsupported``'s server
    part, which calls its own worker rules, plus token-count staging)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.model_executor.forward_batch_info import enable_num_token_non_padded
    from sglang.srt.runtime_context import get_exec, get_parallel, get_schedule, get_spec
    from sglang.srt.utils import get_bool_env_var

    par = get_parallel()
    if par.pp_size > 1:
        return "pipeline parallelism"
    if par.tp_size > 1 or par.attn_dp_enabled:
        return "tensor parallelism or attention DP (collectives and DP guards in the step)"
    if get_schedule().disable_overlap_schedule:
        return "--disable-overlap-schedule (the step stages the host sequence lengths)"
    if get_spec().speculative_adaptive:
        return "--speculative-adaptive (the verify width changes at run time)"
    if get_exec().overlap.enable_two_batch_overlap:
        return "two-batch overlap"
    features = get_exec().features
    if features.enable_return_routed_experts or features.enable_return_indexer_topk:
        return "--enable-return-routed-experts / --enable-return-indexer-topk (per-step capture outputs)"
    if get_exec().moe.expert_distribution_recorder_mode is not None:
        return "expert distribution recording or EPLB (per-forward host bookkeeping)"
    graph = get_exec().graph.cuda_graph_config
    backend = graph.decode.backend if graph is not None else Backend.FULL  # (resolve_decode_backend's default)
    if backend != Backend.FULL:
        return (f"the decode CUDA-graph backend is {backend!r}, not 'full' (the runners' replays this slot cuts at "
                "are FullCudaGraphBackend's)")
    if features.enable_memory_saver and get_bool_env_var("SGLANG_MEMORY_SAVER_CUDA_GRAPH"):
        return ("--enable-memory-saver with SGLANG_MEMORY_SAVER_CUDA_GRAPH (the runner graphs are captured into "
                "the saver's pausable memory; a joined graph's own pool is not)")
    if enable_num_token_non_padded():
        return "token-count staging (EP, an all-to-all backend, DP gather: a pinned H2D copy in the draft step)"
    return worker_unsupported(worker)


# --- capture and replay ---


def capture(original, worker, batch, tensors, key) -> StepGraph | None:
    """Capture this step (nothing runs on the GPU); None where it cannot be, after which the
    caller runs SGLang's step."""
    r = _route
    bs = len(batch.seq_lens)
    r.disabled = unsupported(worker) or ""
    if r.disabled:
        logger.info("hostsync: %s: no step graph: %s", NAME, r.disabled)
        return None
    objs = owners(batch)
    if r.driver is None:
        try:
            r.driver, r.stream = Driver(), torch.cuda.Stream()
        except Exception as exc:  # noqa: BLE001 (no driver graph API: SGLang's step, never a failed server)
            r.driver, r.disabled = None, f"the CUDA driver's graph API is not reachable: {type(exc).__name__}: {exc}"
            logger.warning("hostsync: %s: %s; SGLang's eager step from now on", NAME, r.disabled)
            return None
    if r.pool is None:
        r.pool = torch.cuda.graph_pool_handle()
    slots = [t.clone() for t in tensors]
    saved = _snapshot(objs)
    lazy = lazy_state(worker)
    published: dict = {}
    cap = Capture(r.pool, new_graph=new_graph)
    before = None
    r.capture = cap
    try:
        install(objs, slots)  # (on the scheduler's stream, before the capture)
        before = reserved()
        with side_stream(r.stream), draw_outside(worker):
            try:
                cap.open()
                result = original(worker, batch, recorder(published), None, None)
                cap.close()
            except BaseException:
                cap.abort(r.driver)  # on the capture's stream: torch ends a capture only there
                raise
        changed = changed_state(lazy)
        if changed:
            raise RuntimeError(f"SGLang built {', '.join(changed)} during the capture (the step's first use of "
                               "it); put back, built again by an eager step")
        children = sum(p[0] == "child" for p in cap.parts)
        if children != CHILDREN:
            # A runner ran eagerly (its graph cannot take this batch): leave this batch size to SGLang.
            r.skip.add(bs)
            r.count_eager(f"bs {bs}: {children} of the {CHILDREN} runner graphs replayed")
            return None
        side = side_output(result)
        if side:
            r.disabled = f"the step returns {side}, which a replay would hand out as the capture step's"
            logger.warning("hostsync: %s: %s; SGLang's eager step from now on", NAME, r.disabled)
            return None
        handles = [p[-1].raw_cuda_graph() for p in cap.parts]
        parent, exe = r.driver.chain([h for h in handles if r.driver.nodes(h)])
    except Exception as exc:  # noqa: BLE001 (any failure leaves this step, and this key for a while, to SGLang)
        r.failures[key] = n = r.failures.get(key, 0) + 1
        r.failed += 1
        r.pool = None  # the next capture takes a fresh pool, whatever torch left routed to this one
        if r.failed >= es.MAX_FAILED:
            r.disabled = f"{r.failed} captures failed, the last: {type(exc).__name__}: {exc}"
        logger.warning("hostsync: %s: capturing the bs %d step failed (%d of %d for its layout, %d in all); %s",
                       NAME, bs, n, es.MAX_FAILURES, r.failed,
                       "capturing is off" if r.disabled else "SGLang's eager step for it", exc_info=True)
        return None
    finally:
        r.capture = None
        _restore(saved)
        restore_state(lazy)
        forget_staged_params(worker)
        if before is not None:
            r.pool_bytes += max(0, reserved() - before)
    logger.info("hostsync: %s: bs %d step captured: %d segments around the %d runner graphs; inputs %s; %s", NAME,
                bs, len(cap.parts) - CHILDREN, CHILDREN, ", ".join(present(objs)), r.held(new=1))
    return StepGraph(bs, slots, result, cap.parts, parent, exe, state=worker_state(worker),
                     held=tuple(value for _, _, value in lazy), publish=published)


def launch(worker, sg: StepGraph, batch, copies, on_publish):
    r = _route
    record_stream(batch.seq_lens)  # before the copy reads it
    worker._verify_executor.begin_simulated_step()  # (SGLang's draw and fill_ on this stream; else a no-op)
    torch._foreach_copy_(*copies)
    r.driver.launch(sg.exe, stream_handle())
    forget_staged_params(worker)
    r.replays += 1
    if r.replays in (1, 100) or r.replays % 10000 == 0:
        logger.info("hostsync: %s: %d steps replayed (%s); eager: %s", NAME, r.replays, r.held(), r.eager or "none")
    out = sg.output()
    if on_publish is not None:
        on_publish(out.new_seq_lens, **(sg.publish or {}))
    return out


def checked(original, worker, batch, sg: StepGraph, copies, on_publish):
    """The replay, then SGLang's eager step over the same (untouched) batch, on the replay's simulated
    draw; their outputs and the draft KV rows each committed compared on the device. Serving gets
    SGLang's result."""
    locs = verify_window(worker, batch)
    results = [launch(worker, sg, batch, copies, None)]
    published: dict = {}

    def rerun():
        with draw_outside(worker):
            results.append(original(worker, batch, recorder(published), None, None))

    run_check(_route, NAME, "step outputs", sg.bs, lambda: fingerprint(results[-1], worker, locs), rerun)
    out = results[-1]
    if on_publish is not None:
        on_publish(out.new_seq_lens, **published)
    return out


def step_hook(original, self, batch, on_publish=None, grammar_barrier=None, coordination_plan=None):
    r = _route
    if r.capture is not None:
        return original(self, batch, on_publish, grammar_barrier, coordination_plan)
    if r.disabled:  # (before the per-step rules and the stray scan: none of them matters any more)
        r.count_eager("capture off")
        return original(self, batch, on_publish, grammar_barrier, coordination_plan)
    reason = ineligible(self, batch, coordination_plan)
    if not reason:
        stray = stray_input(owners(batch))
        reason = stray and f"the step reads {stray}"
    if reason:
        r.count_eager(reason)
        return original(self, batch, on_publish, grammar_barrier, coordination_plan)
    bs = len(batch.seq_lens)
    if bs in r.skip:
        r.count_eager(f"bs {bs} has no step graph")
        return original(self, batch, on_publish, grammar_barrier, coordination_plan)
    layout, tensors = gather(owners(batch))
    key = (bs, layout)
    if r.failures.get(key, 0) >= es.MAX_FAILURES:
        r.count_eager(f"bs {bs}: its capture failed {es.MAX_FAILURES} times")
        return original(self, batch, on_publish, grammar_barrier, coordination_plan)
    sg = r.graphs.get(key)
    if sg is not None and not sg.current(self):  # a runner re-captured, or the worker changed: capture again
        drop_stale(self)
        sg = None
    if sg is None:
        if len(r.graphs) >= r.max_graphs:
            r.count_eager(f"{r.max_graphs} step graphs held already ({es.ENV_MAX})")
            return original(self, batch, on_publish, grammar_barrier, coordination_plan)
        r.warm[key] = r.warm.get(key, 0) + 1
        if r.warm[key] == 1:  # (before the warm-ups: they run on the buffer the capture records)
            presize(self, largest_bs(self, bs), batch.seq_lens.device)
        if r.warm[key] > es.WARMUPS:
            sg = capture(original, self, batch, tensors, key)
            if sg is None:
                r.warm[key] = 0  # (a failed capture: try again after as many eager steps, not on every one)
        if sg is None:
            return original(self, batch, on_publish, grammar_barrier, coordination_plan)
        r.graphs[key] = sg
    copies = (sg.slots, tensors)
    if r.check and (r.replays + 1) % r.check == 0:
        return checked(original, self, batch, sg, copies, on_publish)
    return launch(self, sg, batch, copies, on_publish)


def drop_stale(worker) -> None:
    """Destroy every graph that is not current (``worker_state`` is the whole worker's: a grown
    buffer or a rebuilt object makes every graph captured before it stale); their keys warm up again."""
    r = _route
    for key, sg in list(r.graphs.items()):
        if not sg.current(worker):
            del r.graphs[key]
            r.driver.destroy(sg.parent, sg.exe)
            r.warm[key] = 0


def replay_hook(original, self, shape_key, static_forward_batch, **kwargs):
    cap = _route.capture
    if cap is None:
        return original(self, shape_key, static_forward_batch, **kwargs)
    cap.cut(self, shape_key)
    return self._outputs[shape_key]


def keep_hook(original, self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
    # A runner capturing after startup (a weight update with recapture_cuda_graph): this slot's graphs
    # go, with what they hold. eagle_step_graph's hook then keeps the runner's graph (its own route is
    # empty wherever this slot acts, so its drop is a no-op).
    _route.drop("a runner is capturing its graphs")
    return es.keep_hook(original, self, shape_key, forward_fn, capture_inputs, post_warmup_hook)


# --- startup ---


def inert(f: ServingFacts) -> str | None:
    from sglang.srt.server_args import DRAFT_ATTENTION_BACKEND_CHOICES

    from ..switches import env_value

    if not (f.speculative_algorithm and f.is_dspark()):
        return not_speculative(f, "only DSpark's v2 worker runs this step (DFlash's is another function)", False)
    if f.disable_cuda_graph:
        return "inert because --disable-cuda-graph is set (no runner graphs to join)"
    if f.dp_attention or f.tp_size > 1:
        return "inert because attention DP or tensor parallelism is on (not built for collectives in the step)"
    for on, what in ((f.two_batch_overlap, "two-batch overlap"), (f.enable_pdmux, "pdmux"), (f.enable_lora, "LoRA"),
                     (f.moe_counts, "an MoE setting that stages token counts (EP, all-to-all, dense TP, elastic EP)")):
        if on:
            return f"inert because {what} is on"
    prefill, decode = f.attention_backends
    draft = f.draft_attention_backend or prefill
    if draft is not None and draft not in DRAFT_ATTENTION_BACKEND_CHOICES:
        draft = "flashinfer"  # (resolve_draft_worker_attention_backend's CUDA fallback)
    backends = {prefill, decode, draft}
    if None not in backends and backends not in ({"triton"}, {"fa3"}):
        return (f"inert because the attention backends are {', '.join(sorted(backends))}; the step graph is built "
                "for triton or FA3, target and draft alike")
    # The same rules as ``unsupported``, which the scheduler applies again to SGLang's resolved settings.
    mode = env_value("SGLANG_RAGGED_VERIFY_MODE", f.env)
    observers = observer_envs(f.env)
    for on, why in ((f.disable_overlap_schedule, "--disable-overlap-schedule (the step stages the host sequence "
                     "lengths)"),
                    (f.speculative_adaptive, "--speculative-adaptive (the verify width changes at run time)"),
                    (f.returns_capture_outputs, "--enable-return-routed-experts / --enable-return-indexer-topk "
                     "(per-step capture outputs)"),
                    (f.expert_distribution, "expert distribution recording or EPLB (per-forward host bookkeeping)"),
                    (mode != "static", f"SGLANG_RAGGED_VERIFY_MODE={mode} (the verify budget and layout are planned "
                     "from host reads)"),
                    (not env_value("SGLANG_DSPARK_FOLDED_PROPOSAL", f.env), "SGLANG_DSPARK_FOLDED_PROPOSAL=0 (the "
                     "Markov proposal runs eagerly, outside the draft graph)"),
                    (env_value("SGLANG_OPT_DSV41_TARGET_METADATA_EARLY", f.env), "SGLANG_OPT_DSV41_TARGET_METADATA_"
                     "EARLY (an event and a glue graph on a side stream)"),
                    (observers, f"{', '.join(observers)} (DSpark's step observers: host bookkeeping per step)")):
        if on:
            return f"inert because of {why}"
    return None  # (simulated acceptance: any length; its draw runs outside the graph)


def observer_envs(env) -> list[str]:
    """The ``OBSERVER_ENVS`` that turn one of DSpark's step observers on under ``env`` (the online
    block-accept log only at a positive interval: create_block_accept_estimate_recorder)."""
    from ..switches import env_value

    return [name for name in OBSERVER_ENVS
            if (env_value(name, env) > 0 if name == "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL"
                else env_value(name, env))]


def prepare(facts) -> str:
    _route.check, _route.max_graphs = es.settings()
    notes = [f"at most {_route.max_graphs} step graphs"]
    if _route.check:
        notes.append(f"eager check every {_route.check} replayed steps")
    return "; ".join(notes)


OWN_GRAPH = "replays a graph of its own inside the step, which a step capture cannot hold"
EPILOGUE = "folds work into the verify graph's epilogue, which this slot keeps eager"
DEFERRED = "carries the draft context-KV commit from step to step (host state a replay skips)"

SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (DSpark v2 decode step as one CUDA graph), eagle_step_graph's machinery",
    summary="DSpark v2 decode step as one CUDA graph launch (SGLang's draft and verify graphs joined with the glue)",
    default=False,
    precheck=config_precheck(es.settings, upstream=upstream_pins),
    inert=inert,
    prepare=prepare,
    unsafe_with=(("target_verify_metadata_glue", OWN_GRAPH), ("target_metadata_early", OWN_GRAPH),
                 ("post_fold", EPILOGUE), ("post_forward_graph", EPILOGUE), ("fused_accept_tail", EPILOGUE),
                 ("defer_context_kv", DEFERRED), ("one_launch_commit_stage", DEFERRED),
                 # SGLang forces the glue graph off for the DFlash family (GR:549-556); kept should that change.
                 ("metadata_glue_graph", es.UNSAFE)),
    targets=(
        HookTarget(f"{WORKER}._forward_decode", TargetKind.FUNCTION, hook=step_hook,
                   params=("self", "batch", "on_publish", "grammar_barrier", "coordination_plan"),
                   source_sha="ec8afef40bb075bb"),
        HookTarget(f"{es.BACKEND}.capture_one", TargetKind.FUNCTION, hook=keep_hook,
                   params=("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
                   source_sha="b11da397ea881b30"),
        HookTarget(f"{es.BACKEND}.replay", TargetKind.FUNCTION, hook=replay_hook,
                   params=("self", "shape_key", "static_forward_batch", "kwargs"), source_sha="cf7508aca9e2b4ae"),
    ),
)
