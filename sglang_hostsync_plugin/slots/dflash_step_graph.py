"""Slot ``dflash_step_graph`` (opt-in): a DFlash v2 decode step replayed as one CUDA
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

In the catalogue after the upstream switches (``slots.OWNED_LATE``), in no preset; ``auto``'s pick for
DFlash on triton at page > 1 (``choice.ROWS``). Hook targets:
``DFlashWorkerV2.forward_batch_generation``, ``FullCudaGraphBackend.capture_one`` and
``FullCudaGraphBackend.replay`` (AROUND; the last two are ``eagle_step_graph``'s targets too,
which is inert wherever this slot acts, and the reverse).
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass

import torch

from ..checks import file_pins
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from . import eagle_step_graph as es
from . import step_graph_core as core
from .draft_extend_glue_graph import run_check
from .eagle_step_graph import (
    Capture,
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
from .step_graph_core import _BITS, _bits, attention_kind, largest_bs  # noqa: F401 (this module's names too)

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
    """A CUDA tensor on ``objs`` that is neither a named input nor ignored (the step might read it), or None."""
    return es.stray_input(objs, _INPUT_SETS, on_device)


def named(objs):
    return es.named(objs, INPUTS)


def gather(objs) -> tuple[tuple, list]:
    return es.gather(objs, INPUTS)


def present(objs) -> list[str]:
    return es.present(objs, INPUTS)


def install(objs, tensors) -> None:
    es.install(objs, tensors, INPUTS)


# --- the worker's buffers and flags ---


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


def presize_for(worker, batch, bs: int) -> None:
    presize(worker, bs)


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
        return core.output(self.result, CLONED)


def draft_kv_rows(worker, result) -> list[torch.Tensor]:
    """The draft KV rows this step committed (``step_graph_core.draft_kv_rows``): the verify
    window's slots are the worker's buffer, which the step just wrote."""
    lens = result.accept_lens
    return core.draft_kv_rows(worker, worker._draft_verify_out_cache_loc_buf[:lens.shape[0]], lens)


def fingerprint(result, worker) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal)."""
    return core.fingerprint(result, CLONED, draft_kv_rows(worker, result))


# ``eagle_step_graph``'s per-process state, logging under this slot's name.
Route = functools.partial(es.Route, name=NAME)
_route = Route()


# --- rules ---


def ineligible(worker, batch, pp_proxy_tensors) -> str | None:
    """Why this step must run SGLang's eager branch, or None (``step_graph_core.ineligible``)."""
    return core.ineligible(batch, pp_proxy_tensors, "PP proxy tensors")


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
    return core.runners_unsupported(worker)


def unsupported(worker) -> str | None:
    """Server-wide settings under which the branch decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale."""
    return core.server_unsupported() or worker_unsupported(worker)


# --- capture and replay ---


def capture(original, worker, batch, tensors, key) -> StepGraph | None:
    """Capture this step (nothing runs on the GPU); None where it cannot be, after which the
    caller runs SGLang's step."""
    r = _route
    bs = len(batch.seq_lens)
    if not es.begin(r, NAME, unsupported(worker)):
        return None
    objs = owners(batch)
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
        result = es.run_captured(r, cap, lambda: original(worker, batch, None, None, None), side_stream(r.stream))
        changed = changed_flags(flags)
        if changed:
            raise RuntimeError(f"SGLang turned {', '.join(changed)} off during the capture (a fallback swallowed "
                               "an error); the flags are put back")
        joined = es.join(r, NAME, cap, result, bs, CHILDREN, side_output)
        if joined is None:
            return None
        parent, exe = joined
    except Exception as exc:  # noqa: BLE001 (any failure leaves this step, and this key for a while, to SGLang)
        es.failed(r, NAME, key, bs, exc)
        return None
    finally:
        r.capture = None
        _restore(saved)
        put_back(worker, own)
        restore_flags(flags)
        if before is not None:
            r.pool_bytes += max(0, reserved() - before)
    es.captured(r, NAME, bs, cap, CHILDREN, present(objs))
    return StepGraph(bs, slots, result, cap.parts, parent, exe, pool=cap.pool, state=worker_state(worker),
                     accept=accept)


def record_stream(t: torch.Tensor) -> None:
    """``t`` is used on the current stream (its memory is not reused until the work queued there is
    done): stock's ``batch.seq_lens.record_stream`` (W:2481), since ``resolve_seq_lens_cpu``
    allocates it on another stream."""
    t.record_stream(torch.cuda.current_stream())


def launch(worker, sg: StepGraph, batch, copies, on_publish):
    r = _route
    record_stream(batch.seq_lens)  # before the copy reads it
    torch._foreach_copy_(*copies)
    es.launch_graph(r, sg.exe, stream_handle())
    es.replayed(r, NAME)
    out = sg.output()
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


def checked(original, worker, batch, sg: StepGraph, copies, on_publish):
    """The replay, then SGLang's eager step over the same (untouched) batch; their outputs and the
    draft KV rows each committed compared on the device. Serving gets SGLang's result."""
    results = [launch(worker, sg, batch, copies, None)]
    run_check(_route, NAME, "step outputs", sg.bs, lambda: fingerprint(results[-1], worker),
              lambda: results.append(original(worker, batch, None, None, None)))
    out = results[-1]
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


_THIS = sys.modules[__name__]


def step_hook(original, self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
    return core.step_hook(_THIS, original, self, batch, on_publish, grammar_barrier, pp_proxy_tensors)


def replay_hook(original, self, shape_key, static_forward_batch, **kwargs):
    return core.replay_hook(_route, original, self, shape_key, static_forward_batch, **kwargs)


def keep_hook(original, self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
    return core.keep_hook(_route, original, self, shape_key, forward_fn, capture_inputs, post_warmup_hook)


# --- startup ---


def _is_dflash(f: ServingFacts) -> bool:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return bool(f.speculative_algorithm) and SpeculativeAlgorithm.from_string(f.speculative_algorithm).is_dflash()


def inert(f: ServingFacts) -> str | None:
    from ..switches import env_value

    if not _is_dflash(f):
        return not_speculative(f, "only DFlash's v2 worker runs this step (DSpark's is another function)", False)
    eager_head = env_value("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER", f.env)
    why = core.startup_rules(f, ((eager_head, "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 (the draft's greedy head runs "
                                  "outside its graph)"),))
    return why or simulated_draw(f.env)


def prepare(facts) -> str:
    return core.prepare(_route)


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
