"""Slot ``dflash_step_graph`` (not registered yet): a DFlash v2 decode step replayed as one CUDA
graph launch (design: docs/dflash-step-graph.md; the machinery is ``eagle_step_graph``'s).

SGLang 0.5.23's ``DFlashWorkerV2.forward_batch_generation`` runs two CUDA graphs per decode step
(the draft block, the target verify) and, around them, a few milliseconds of Python: the draft
block's prep kernels, the compact-cache rebuild, the verify input and metadata, the greedy
accept, the draft KV append, the next draft input. This slot runs the decode branch once per
batch size under CUDA graph capture, in segments cut at the two runners' replays, and joins the
segments and SGLang's own runner graphs (as child nodes, unchanged) into one graph per batch
size and input layout. Each later step of that key:

- marks ``batch.seq_lens`` as used on the current stream (stock's ``record_stream``, W:2481: the
  overlap scheduler's ``resolve_seq_lens_cpu`` allocates it on another stream), then copies this
  step's input tensors (``ScheduleBatch``, its ``DFlashDraftInputV2`` and sampling info; the
  ``*_INPUTS`` names below) into the tensors the capture read, in one ``_foreach_copy_``;
- launches the joined graph on the current stream (one driver call);
- returns the captured ``GenerationBatchResult`` with its host-read tensors cloned (next tokens,
  accept lengths, new lengths: the scheduler reads them on its copy stream while the next step
  runs) and calls ``on_publish`` after the launch (stock publishes mid-step, before the KV append).

Rules. A step stays on SGLang's eager path (counted by reason; once capturing is off, before any
other rule is read) unless every Python decision of the branch is fixed by the batch size:
decode (not idle, not extend), greedy, no logprobs / hidden states / grammar / penalties / logit
bias / watermark / custom logit processor / sampling masks / hisparse / mamba tracking /
multimodal inputs, no host copy of the lengths (``batch.seq_lens_cpu`` is None) but the draft
input's host KV bound present (``nxt_kv_lens_cpu``: what triton and FA3 receive and ignore), and
no CUDA tensor on those three objects besides the named inputs and the ``*_IGNORED`` ones
(present, never read: rebound before any read, or zero-width), each input with the shape it had
at capture. Server-wide, checked in the scheduler before each capture against SGLang's resolved
settings and the live worker: PP, tensor parallelism or attention DP, no overlap scheduling,
``--speculative-adaptive``, two-batch overlap, per-step capture outputs (routed experts, indexer
top-k), expert distribution recording, a decode CUDA-graph backend other than ``full``
(``--cuda-graph-config``: under ``breakable`` the runners' replays are not
``FullCudaGraphBackend.replay``, so no capture could cut at them), the memory saver's pausable
graph capture (``--enable-memory-saver`` with ``SGLANG_MEMORY_SAVER_CUDA_GRAPH``: the runner
graphs' pool would be paused and restored under a joined graph whose own pool is not), a mamba
target, a selector / LiLiCorr / Domino draft head, a draft greedy head outside the draft graph,
the compact draft cache without its Triton rebuild, a translated KV pool (its read table is
sized from host lengths), and attention other than triton or FA3 (without a KV shard pool) for
target and draft alike. At startup (``inert``): DFLASH only (DSpark's step is
another function), CUDA graphs on, tp 1, no attention DP, two-batch overlap, pdmux, LoRA or MoE
count staging, overlap scheduling on, no adaptive steps, no capture outputs or expert recording,
no eager draft head, triton or FA3 (not FlashInfer), and simulated acceptance only when its draw
is constant (``eagle_step_graph.simulated_draw``).

DFlash-specific hazards. (1) Buffers that grow: a graph keeps raw pointers, so on a key's first
eligible step (before its warm-ups, so that the warm-ups and the capture run on the same buffers)
the draft block buffers are sized to the target's largest decode graph batch size and the fused
KV helper's workspace, which prefill shares (FK:361-386 sizes it by token count), to the larger
of that times the block size and one prefill batch's tokens (``--chunked-prefill-size``; without
chunked prefill ``--max-prefill-tokens``, which a lone longer first request may still pass). Their
data pointers are part of a graph's staleness check (``worker_state``): a buffer that grew later
(an eager step past that size; a prefill past the workspace) drops, on the next step that finds
it, every graph captured before the change, which are then captured again. (2) SGLang's
``try/except`` fallbacks turn a worker flag off for good on an error (``FLAGS``): the flags are
snapshotted before a capture; a flag that changed during it fails the capture and is put back (an
eager step that turns one off later drops the graphs, as a grown buffer does).
(3) The accept outputs ping-pong between two buffer slots per call: a capture would freeze one,
which an eager step (a warm-up, the check, another batch size) also writes while the copy stream
may still read it. Each graph gets its own accept buffers (SGLang's allocation at its batch size,
of which the graph keeps slot 0 alone, the one its capture writes; the worker's own set and slot
are put back after the capture) and the host-read ones are cloned per replay.

Each key's first two eligible steps run eagerly, the third is captured, then replayed; failed
captures, the graph limit, the eager self-check and a runner capture after startup (dropping every
graph) behave as in ``eagle_step_graph`` and share its settings.

Memory: as ``eagle_step_graph``'s (a private pool outside ``--mem-fraction-static``, the graph
and pool growth logged at each capture), plus per graph its accept buffers (bs x block size
int64 and a few bs-long vectors) and, once, the draft block buffers at the largest decode graph
batch size and the fused KV workspace at one prefill batch's tokens (draft layers x that many
tokens x (the K/V projection width + 2 x KV heads x head dim) in the draft's dtype): SGLang's own
buffers, grown earlier than a server whose prompts stay shorter would grow them.

Settings: ``SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=N`` (default 0, off) and
``SGLANG_HOSTSYNC_STEP_GRAPH_MAX=N`` (default 16), read as ``eagle_step_graph`` reads them (only
one of the two slots acts in a server). The check also compares the draft KV rows the step
committed, which the next step reads and the scheduler never does.

Not registered (``slots/__init__.py``) until its GPU tests pass. Hook targets, when registered:
``DFlashWorkerV2.forward_batch_generation``, ``FullCudaGraphBackend.capture_one`` and
``FullCudaGraphBackend.replay`` (AROUND; the last two are ``eagle_step_graph``'s targets too,
which is inert wherever this slot acts, and the reverse).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch

from ..checks import file_pins
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from . import eagle_step_graph as es
from .draft_extend_glue_graph import run_check
from .eagle_step_graph import (
    Capture,
    Driver,
    _restore,
    _snapshot,
    new_graph,
    on_device,
    reserved,
    side_output,
    side_stream,
    simulated_draw,
    stream_handle,
)

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "dflash_step_graph"
WORKER = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
CHILDREN = 2  # runner graphs per step: the draft block, the target verify

# The tensors a decode step reads from the scheduler's objects (batch, draft input, sampling
# info), copied into the graph's slots every step.
BATCH_INPUTS = ("req_pool_indices", "seq_lens", "orig_seq_lens")
DRAFT_INPUTS = ("bonus_tokens", "future_indices")
SAMPLING_INPUTS = es.SAMPLING_INPUTS
INPUTS = (BATCH_INPUTS, DRAFT_INPUTS, SAMPLING_INPUTS)
# Present on those objects but never read by the decode branch, so neither copied nor a reason to
# stay eager: the batch's ``input_ids`` and ``out_cache_loc`` (the branch sets both before
# anything reads them: ``DFlashVerifyInput.prepare_for_verify``, the verify window's locations);
# the draft input's ``new_seq_lens`` and the zero-width EAGLE-shaped ``topk_p`` / ``topk_index`` /
# ``hidden_states`` (``make_draft_input_v2``), and its ``prepare_for_decode`` scratch on the device.
BATCH_IGNORED = ("input_ids", "out_cache_loc")
DRAFT_IGNORED = ("new_seq_lens", "topk_p", "topk_index", "hidden_states", "_prepare_cur_kv_lens_gpu_buf",
                 "_prepare_nxt_kv_lens_gpu_buf")
IGNORED = (BATCH_IGNORED, DRAFT_IGNORED, ())
# Read on the host or on the copy stream after the next step was launched: cloned per step.
CLONED = ("next_token_ids", "accept_lens", "new_seq_lens")

# Worker buffers that grow with the batch size (``_ensure_draft_block_buffers``), on the device.
BLOCK_BUFFERS = ("_draft_block_ids_buf", "_draft_block_positions_buf", "_draft_block_tokens_buf",
                 "_draft_verify_out_cache_loc_buf", "_draft_block_end_buf")
WORKSPACES = ("_proj_workspace", "_k_workspace", "_v_workspace")  # FusedKVMaterializeHelper's
# The worker's accept outputs (``_ensure_accept_bonus_buffers``): one buffer, four ping-pong pairs
# (lists of 2), their capacity and the slot the next call takes.
ACCEPT_BUFFER = "_accept_len_buf"
ACCEPT_PAIRS = ("_commit_lens_bufs", "_bonus_id_bufs", "_out_tokens_bufs", "_new_seq_lens_bufs")
ACCEPT_CAP, ACCEPT_SLOT = "_accept_bonus_buffer_cap", "_accept_bonus_buffer_slot"
ACCEPT_STATE = (ACCEPT_BUFFER, *ACCEPT_PAIRS, ACCEPT_CAP, ACCEPT_SLOT)
# Set once at init, turned off for good by an exception the branch swallows (W:2529, W:2250,
# W:1962/2000); the helper's own ``_mm_out_supported`` likewise (FK:431-436).
FLAGS = ("_use_triton_prepare_block", "_use_triton_accept_bonus", "_use_fused_kv_materialize", "_fused_kv_helper",
         "_use_triton_compact_rebuild")
HELPER_FLAGS = ("_mm_out_supported",)

# Upstream code the rules rely on beyond the hooked functions (read from the module files).
PINS = (
    (f"{WORKER}._accept_block", "d06ac1b8f8de12b1"),
    (f"{WORKER}._ensure_draft_block_buffers", "129cc7d289028584"),
    (f"{WORKER}._ensure_accept_bonus_buffers", "c127cb302d276777"),
    (f"{WORKER}._next_accept_bonus_buffers", "2780597b7c47ec52"),
    (f"{WORKER}._append_target_hidden_to_draft_kv_by_loc", "fae12d81a6e1bb85"),
    ("sglang.kernels.ops.speculative.fused_kv_materialize.FusedKVMaterializeHelper.materialize", "17b9d0ecab77110e"),
    ("sglang.kernels.ops.speculative.fused_kv_materialize.FusedKVMaterializeHelper._ensure_workspace",
     "9ebb8d74df7cb7ba"),
    ("sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu", "f7d9d6e12fc4040c"),
    ("sglang.srt.layers.attention.triton_backend.TritonAttnBackend._update_target_verify_buffers",
     "e37fbbefcd82e396"),
    ("sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend._apply_cuda_graph_metadata",
     "001fe20be539df74"),
    ("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator.build_iteration_table", "db1f215dcfd41f88"),
    # The decode backend from ``cuda_graph_config`` (FULL when unset); the memory saver's graph capture.
    ("sglang.srt.model_executor.runner_backend.utils.resolve_decode_backend", "29a030e3c164d133"),
    (f"{es.BACKEND}.__init__", "137904e6ae16b6bb"),
    # The scheduler's chunk size (-1 / None: no chunked prefill), which bounds a prefill's tokens.
    ("sglang.srt.managers.scheduler.Scheduler.init_chunked_prefill", "a391d7a53ace87d8"),
)


def upstream_pins() -> str | None:
    return file_pins(PINS, "the step graph's rules rely on it")


# --- the step's inputs ---


def owners(batch) -> tuple:
    return batch, batch.spec_info, batch.sampling_info


_INPUT_SETS = tuple(frozenset(n) | frozenset(i) for n, i in zip(INPUTS, IGNORED))


def stray_input(objs) -> str | None:
    """A CUDA tensor on ``objs`` that is neither a named input nor ignored (the step might read it),
    or None. Every step: ``type(v) is Tensor`` first, as ``eagle_step_graph`` does."""
    tensor = torch.Tensor
    for obj, names in zip(objs, _INPUT_SETS):
        state = vars(obj)
        for key in [k for k, v in state.items() if type(v) is tensor]:
            if key not in names and on_device(state[key]):
                return f"{type(obj).__name__}.{key}"
    return None


def named(objs):
    """(object, name, value or None) for every named input, in ``INPUTS`` order."""
    for obj, names in zip(objs, INPUTS):
        for name in names:
            yield obj, name, getattr(obj, name, None)


def gather(objs) -> tuple[tuple, list]:
    """This step's inputs: their layout (None or (shape, dtype) per name, part of a graph's key)
    and the tensors present, in name order."""
    layout, tensors = [], []
    for _, _, value in named(objs):
        if value is None:
            layout.append(None)
        else:
            layout.append((value.shape, value.dtype))
            tensors.append(value)
    return tuple(layout), tensors


def present(objs) -> list[str]:
    return [f"{name}{list(value.shape)}" for _, name, value in named(objs) if value is not None]


def install(objs, tensors) -> None:
    """Put ``tensors`` (in ``gather``'s order) in place of the inputs present on ``objs``."""
    it = iter(tensors)
    for obj, name, value in list(named(objs)):
        if value is not None:
            setattr(obj, name, next(it))


# --- the worker's buffers and flags ---


def largest_bs(worker, bs: int) -> int:
    """The largest batch size a step graph can be captured at: the target's decode graphs' (a bigger
    batch runs the verify eagerly, so it is never captured)."""
    runner = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
    return max(int(bs), int(getattr(runner, "max_bs", 0) or 0))


def fused_helper(worker):
    return worker._fused_kv_helper if worker._use_fused_kv_materialize else None


def prefill_tokens() -> int:
    """The most tokens one prefill batch hands the draft KV append (the fused workspace's token
    count): ``--chunked-prefill-size``, which bounds a prefill batch's extend tokens. Without chunked
    prefill (-1 or None; the scheduler also turns it off for a multimodal model on the Transformers
    backend, S:1358-1373, which only a prefill past this size then shows), ``--max-prefill-tokens``:
    the scheduler admits a lone first request past it (schedule_policy's "allow the first request
    even above the input cap"), whose prefill still grows the workspace and drops the graphs."""
    from sglang.srt.runtime_context import get_schedule

    schedule = get_schedule()
    chunked = schedule.chunked_prefill_size
    if chunked is not None and chunked > 0:
        return int(chunked)
    return int(schedule.max_prefill_tokens or 0)


def workspace_tokens(worker, bs: int) -> int:
    """The fused KV workspace's size, in tokens: a decode step's (bs x block) or a prefill's."""
    return max(int(bs) * int(worker.block_size), prefill_tokens())


def presize(worker, bs: int) -> None:
    """Grow the buffers the branch sizes by its batch size to ``bs`` now (SGLang's own growth), and
    the workspace prefill shares to a prefill's size, so a capture does not hold pointers the next
    larger step or prefill frees."""
    worker._ensure_draft_block_buffers(bs)
    helper = fused_helper(worker)
    if helper is not None:
        helper._ensure_workspace(workspace_tokens(worker, bs), helper.flat_kv_weight_t.dtype)


def buffer_pointers(worker) -> tuple:
    """Where the growing buffers a graph reads and writes by address are now."""
    ptrs = [getattr(worker, name).data_ptr() for name in BLOCK_BUFFERS]
    helper = fused_helper(worker)
    if helper is not None:
        ptrs += [getattr(helper, name).data_ptr() for name in WORKSPACES]
    return tuple(ptrs)


def worker_state(worker) -> tuple:
    """What a graph took from the worker at capture and a later eager step may change: the growing
    buffers' addresses and the flags that pick the branch's paths."""
    return buffer_pointers(worker) + tuple(value for _, _, value in worker_flags(worker))


def worker_flags(worker) -> list[tuple[object, str, object]]:
    """(owner, flag, value) for the flags a swallowed error turns off."""
    flags = [(worker, name, getattr(worker, name)) for name in FLAGS]
    helper = worker._fused_kv_helper
    if helper is not None:
        flags += [(helper, name, getattr(helper, name)) for name in HELPER_FLAGS]
    return flags


def changed_flags(flags) -> list[str]:
    return [name for owner, name, value in flags if getattr(owner, name) is not value]


def restore_flags(flags) -> None:
    for owner, name, value in flags:
        setattr(owner, name, value)


def own_accept_buffers(worker, bs: int) -> dict:
    """Install a fresh set of the worker's accept buffers (SGLang's allocation at ``bs``) for one
    graph alone, and return it; the caller puts the worker's own state back after the capture.
    SGLang allocates both slots of each pair; the capture takes slot 0 (one call per step), so each
    pair keeps that slot alone and slot 1 goes back to the allocator now (a second call within the
    captured step would find no slot 1 and fail the capture, never share slot 0)."""
    setattr(worker, ACCEPT_CAP, 0)
    worker._ensure_accept_bonus_buffers(bs)
    setattr(worker, ACCEPT_SLOT, 0)
    for name in ACCEPT_PAIRS:
        setattr(worker, name, getattr(worker, name)[:1])
    return {name: getattr(worker, name) for name in (ACCEPT_BUFFER, *ACCEPT_PAIRS)}


def put_back(worker, saved: dict) -> None:
    for name, value in saved.items():
        setattr(worker, name, value)


# --- the graph ---


@dataclass
class StepGraph(es.StepGraph):
    state: tuple = ()  # ``worker_state`` at capture
    accept: dict | None = None  # this graph's own accept buffers (its kernels write them)

    def current(self, worker) -> bool:
        """The runners still hold the graphs this one was joined from, and the worker's buffers and
        flags are the capture's."""
        return super().current() and self.state == worker_state(worker)

    def output(self):
        """A result for the scheduler: the captured one, host-read tensors cloned."""
        out = copy.copy(self.result)
        for name in CLONED:
            setattr(out, name, getattr(self.result, name).clone())
        out.next_draft_input = copy.copy(self.result.next_draft_input)
        out.extra_keep_alive_refs = list(self.result.extra_keep_alive_refs or ())
        return out


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.clone() if not t.is_floating_point() else t.contiguous().view(_BITS[t.element_size()]).clone()


def draft_kv_rows(worker, result) -> list[torch.Tensor]:
    """The draft KV rows this step committed, as raw bits (the verify window's first ``accept_lens``
    slots of each draft layer's K and V; the others zeroed), which the next step reads and the
    scheduler never does. The window's slots are the worker's buffer, which the step just wrote."""
    lens = result.accept_lens
    bs = lens.shape[0]
    locs = worker._draft_verify_out_cache_loc_buf[:bs]
    keep = torch.arange(locs.shape[1], device=locs.device)[None, :] < lens[:, None].to(locs.device)
    pool = worker.draft_model_runner.token_to_kv_pool
    rows = []
    for layer in worker.draft_model.layers:
        lid = layer.self_attn.attn.layer_id
        for buf in (pool.get_key_buffer(lid), pool.get_value_buffer(lid)):
            got = buf[locs]
            if got.is_floating_point():
                got = got.view(_BITS[got.element_size()])
            rows.append(torch.where(keep.view(*keep.shape, *[1] * (got.dim() - 2)), got, torch.zeros_like(got)))
    return rows


def fingerprint(result, worker) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal)."""
    out = [getattr(result, name) for name in CLONED] + [result.next_draft_input.bonus_tokens]
    return [_bits(t) for t in out if t is not None] + draft_kv_rows(worker, result)


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


def ineligible(worker, batch, pp_proxy_tensors) -> str | None:
    """Why this step must run SGLang's eager branch, or None."""
    mode = batch.forward_mode
    if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or not mode.is_decode():
        return "not a decode step"
    spec, info = batch.spec_info, batch.sampling_info
    if spec is None or info is None or pp_proxy_tensors is not None:
        return "no draft input or sampling info (or PP proxy tensors)"
    if batch.return_logprob or batch.return_hidden_states:
        return "logprobs or hidden states requested"
    if batch.has_grammar:
        return "a grammar"
    if not info.is_all_greedy:
        return "non-greedy sampling"
    if info.has_custom_logit_processor:
        return "a custom logit processor"
    if (info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None
            or getattr(info, "acc_linear_penalties", None) is not None  # (read by U:236; no field in 0.5.23)
            or info.logit_bias is not None or info.has_watermark_candidates):
        return "penalties, logit bias or watermark"
    if info.sampling_mask_batch_indices is not None or info.grammar_mask is not None:
        return "sampling masks"
    if batch.hisparse_coordinator is not None or batch.mamba_track_indices is not None:
        return "hisparse or mamba state"
    if batch.seq_lens_cpu is not None:  # (the host bound becomes committed + block, W:2625/2841)
        return "host sequence lengths (seq_lens_cpu)"
    if spec.nxt_kv_lens_cpu is None:  # (else a loop over batch.reqs, W:2634)
        return "no host KV bound (nxt_kv_lens_cpu)"
    if any(mm is not None for mm in batch.multimodal_inputs or ()):
        return "multimodal inputs"
    return None


def attention_kind(backend) -> set[str]:
    """What kinds of attention a runner's backend (or its hybrid halves) is: 'triton', 'fa3' or
    another name."""
    halves = [getattr(backend, n, None) for n in ("prefill_backend", "decode_backend")]
    if any(h is not None for h in halves):
        return set().union(*(attention_kind(h) for h in halves if h is not None))
    name = type(backend).__name__
    if name == "TritonAttnBackend":
        return {"triton"}
    if name == "FlashAttentionBackend":
        if getattr(backend, "_kv_shard_pool", None) is not None:
            return {"FA3 with a KV shard pool"}
        return {"fa3"} if getattr(backend, "fa_impl_ver", 3) == 3 else {f"fa{backend.fa_impl_ver}"}
    return {name}


def worker_unsupported(worker) -> str | None:
    """What of the live worker makes the branch decide on values a graph would freeze."""
    if worker._need_mamba_verify_commit:
        return "a mamba target (the verify commits its state per step)"
    if worker.selector is not None or worker.lilicorr is not None or worker._is_domino:
        return "a selector, LiLiCorr or Domino draft head"
    if worker._draft_sampler is None:
        return "the draft's greedy head runs outside the draft graph (growing buffers, host branches)"
    if worker.use_compact_draft_cache and not worker._use_triton_compact_rebuild:
        return "the compact draft cache without its Triton rebuild (host syncs)"
    runners = (("target", worker.model_runner), ("draft", worker.draft_model_runner))
    for which, runner in runners:
        if runner.kv_index_translator.is_translating:
            return f"the {which}'s translated KV pool (its read table is sized from host lengths)"
    kinds = set().union(*(attention_kind(runner.attn_backend) for _, runner in runners))
    if kinds not in ({"triton"}, {"fa3"}):
        return (f"attention {', '.join(sorted(kinds))}: the step graph is built for triton or FA3, target and "
                "draft alike")
    return None


def unsupported(worker) -> str | None:
    """Server-wide settings under which the branch decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale."""
    from sglang.srt.runtime_context import get_exec, get_parallel, get_schedule, get_spec

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
    return es.runner_graphs_unsupported() or worker_unsupported(worker)


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
    flags = worker_flags(worker)
    own = {name: getattr(worker, name) for name in ACCEPT_STATE}
    cap = Capture(r.pool, new_graph=new_graph)
    before = None
    r.capture = cap
    try:
        # On the scheduler's stream, before the capture: this graph's accept buffers, then the input
        # slots in place (the growing buffers were sized on this key's first eligible step).
        accept = own_accept_buffers(worker, bs)
        install(objs, slots)
        before = reserved()
        with side_stream(r.stream):
            try:
                cap.open()
                result = original(worker, batch, None, None, None)
                cap.close()
            except BaseException:
                cap.abort(r.driver)  # on the capture's stream: torch ends a capture only there
                raise
        changed = changed_flags(flags)
        if changed:
            raise RuntimeError(f"SGLang turned {', '.join(changed)} off during the capture (a fallback swallowed "
                               "an error); the flags are put back")
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
        put_back(worker, own)
        restore_flags(flags)
        if before is not None:
            r.pool_bytes += max(0, reserved() - before)
    logger.info("hostsync: %s: bs %d step captured: %d segments around the %d runner graphs; inputs %s; %s", NAME,
                bs, len(cap.parts) - CHILDREN, CHILDREN, ", ".join(present(objs)), r.held(new=1))
    return StepGraph(bs, slots, result, cap.parts, parent, exe, state=worker_state(worker), accept=accept)


def record_stream(t: torch.Tensor) -> None:
    """``t`` is used on the current stream (its memory is not reused until the work queued there is
    done): stock's ``batch.seq_lens.record_stream`` (W:2481), since ``resolve_seq_lens_cpu``
    allocates it on another stream."""
    t.record_stream(torch.cuda.current_stream())


def launch(sg: StepGraph, batch, copies, on_publish):
    r = _route
    record_stream(batch.seq_lens)  # before the copy reads it
    torch._foreach_copy_(*copies)
    r.driver.launch(sg.exe, stream_handle())
    r.replays += 1
    if r.replays in (1, 100) or r.replays % 10000 == 0:
        logger.info("hostsync: %s: %d steps replayed (%s); eager: %s", NAME, r.replays, r.held(), r.eager or "none")
    out = sg.output()
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


def checked(original, worker, batch, sg: StepGraph, copies, on_publish):
    """The replay, then SGLang's eager step over the same (untouched) batch; their outputs and the
    draft KV rows each committed compared on the device. Serving gets SGLang's result."""
    results = [launch(sg, batch, copies, None)]
    run_check(_route, NAME, "step outputs", sg.bs, lambda: fingerprint(results[-1], worker),
              lambda: results.append(original(worker, batch, None, None, None)))
    out = results[-1]
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


def step_hook(original, self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
    r = _route
    if r.capture is not None:
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    if r.disabled:  # (before the per-step rules and the stray scan: none of them matters any more)
        r.count_eager("capture off")
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    reason = ineligible(self, batch, pp_proxy_tensors)
    if not reason:
        stray = stray_input(owners(batch))
        reason = stray and f"the step reads {stray}"
    if reason:
        r.count_eager(reason)
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    bs = len(batch.seq_lens)
    if bs in r.skip:
        r.count_eager(f"bs {bs} has no step graph")
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    layout, tensors = gather(owners(batch))
    key = (bs, layout)
    if r.failures.get(key, 0) >= es.MAX_FAILURES:
        r.count_eager(f"bs {bs}: its capture failed {es.MAX_FAILURES} times")
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    sg = r.graphs.get(key)
    if sg is not None and not sg.current(self):  # a runner re-captured, or a buffer grew: capture again
        drop_stale(self)
        sg = None
    if sg is None:
        if len(r.graphs) >= r.max_graphs:
            r.count_eager(f"{r.max_graphs} step graphs held already ({es.ENV_MAX})")
            return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
        r.warm[key] = r.warm.get(key, 0) + 1
        if r.warm[key] == 1:  # (before the warm-ups: they run on the buffers the capture records)
            presize(self, largest_bs(self, bs))
        if r.warm[key] > es.WARMUPS:
            sg = capture(original, self, batch, tensors, key)
            if sg is None:
                r.warm[key] = 0  # (a failed capture: try again after as many eager steps, not on every one)
        if sg is None:
            return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
        r.graphs[key] = sg
    copies = (sg.slots, tensors)
    if r.check and (r.replays + 1) % r.check == 0:
        return checked(original, self, batch, sg, copies, on_publish)
    return launch(sg, batch, copies, on_publish)


def drop_stale(worker) -> None:
    """Destroy every graph that is not current (``worker_state`` is the whole worker's: a grown
    buffer or a flag turned off makes every graph captured before it stale, not only the one whose
    key came up); their keys warm up again."""
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


def _is_dflash(f: ServingFacts) -> bool:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return bool(f.speculative_algorithm) and SpeculativeAlgorithm.from_string(f.speculative_algorithm).is_dflash()


def inert(f: ServingFacts) -> str | None:
    from sglang.srt.server_args import DRAFT_ATTENTION_BACKEND_CHOICES

    from ..switches import env_value

    if not _is_dflash(f):
        return not_speculative(f, "only DFlash's v2 worker runs this step (DSpark's is another function)", False)
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
    for on, why in ((f.disable_overlap_schedule, "--disable-overlap-schedule (the step stages the host sequence "
                     "lengths)"),
                    (f.speculative_adaptive, "--speculative-adaptive (the verify width changes at run time)"),
                    (f.returns_capture_outputs, "--enable-return-routed-experts / --enable-return-indexer-topk "
                     "(per-step capture outputs)"),
                    (f.expert_distribution, "expert distribution recording or EPLB (per-forward host bookkeeping)"),
                    (env_value("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER", f.env),
                     "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 (the draft's greedy head runs outside its graph)")):
        if on:
            return f"inert because of {why}"
    return simulated_draw(f.env)


def prepare(facts) -> str:
    _route.check, _route.max_graphs = es.settings()
    notes = [f"at most {_route.max_graphs} step graphs"]
    if _route.check:
        notes.append(f"eager check every {_route.check} replayed steps")
    return "; ".join(notes)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (DFlash v2 decode step as one CUDA graph), eagle_step_graph's machinery",
    summary="DFlash v2 decode step as one CUDA graph launch (SGLang's draft and verify graphs joined with the glue)",
    default=False,
    precheck=config_precheck(es.settings, upstream=upstream_pins),
    inert=inert,
    prepare=prepare,
    # SGLang 0.5.23 forces the glue graph off for the DFlash family (GR:549-556); kept should that change.
    unsafe_with=(("metadata_glue_graph", es.UNSAFE),),
    targets=(
        HookTarget(f"{WORKER}.forward_batch_generation", TargetKind.FUNCTION, hook=step_hook,
                   params=("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"),
                   source_sha="f42a3bb18adba2a5"),
        HookTarget(f"{es.BACKEND}.capture_one", TargetKind.FUNCTION, hook=keep_hook,
                   params=("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
                   source_sha="b11da397ea881b30"),
        HookTarget(f"{es.BACKEND}.replay", TargetKind.FUNCTION, hook=replay_hook,
                   params=("self", "shape_key", "static_forward_batch", "kwargs"), source_sha="cf7508aca9e2b4ae"),
    ),
)
