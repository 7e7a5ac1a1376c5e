"""Slot ``dspark_step_graph`` (opt-in): a DSpark v2 decode step replayed as one CUDA
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

In the catalogue after the upstream switches (``slots.OWNED_LATE``), in no preset; ``auto``'s pick for
DSpark on triton at page > 1 (``choice.ROWS``). Hook targets:
``DSparkWorkerV2._forward_decode``, ``FullCudaGraphBackend.capture_one`` and
``FullCudaGraphBackend.replay`` (AROUND; the last two are ``eagle_step_graph``'s and
``dflash_step_graph``'s targets too, both inert wherever this slot acts, and the reverse).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from dataclasses import dataclass

import torch

from ..checks import file_pins
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from . import dflash_step_graph as dsg
from . import eagle_step_graph as es
from . import step_graph_core as core
from .dflash_step_graph import (
    gather,
    install,
    owners,
    present,
    record_stream,
    stray_input,
)
from .draft_extend_glue_graph import run_check
from .eagle_step_graph import (
    Capture,
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
    from sglang.srt.speculative.dspark_components import dspark_draft

    worker._proposer.draft_block_ids_view(bs=bs, device=device)
    dspark_draft._zero(device)  # (a cached device scalar: built under a capture it would hold a never-filled block)


def presize_for(worker, batch, bs: int) -> None:
    presize(worker, bs, batch.seq_lens.device)


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
        return core.output(self.result, CLONED)


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


def fingerprint(result, worker, locs) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal), and the draft KV rows
    the step committed in the verify window ``locs`` (``step_graph_core.draft_kv_rows``)."""
    return core.fingerprint(result, CLONED, core.draft_kv_rows(worker, locs, result.accept_lens))


# ``eagle_step_graph``'s per-process state, logging under this slot's name.
Route = functools.partial(es.Route, name=NAME)
_route = Route()


# --- rules ---


def ineligible(worker, batch, coordination_plan) -> str | None:
    """Why this step must run SGLang's eager function, or None (``step_graph_core.ineligible``)."""
    return core.ineligible(batch, coordination_plan, "a DP prefill coordination plan")


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
    return core.runners_unsupported(worker, metadata_glue)


def metadata_glue(which, runner) -> str | None:
    graphs = runner.decode_cuda_graph_runner
    if graphs is not None and graphs._metadata_glue is not None:
        return f"the {which} runner's metadata glue graph (its own replay inside the step)"
    return None


def unsupported(worker) -> str | None:
    """Server-wide settings under which the step decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale (``step_graph_core.server_unsupported``, plus
    token-count staging), then the worker's rules."""
    from sglang.srt.model_executor.forward_batch_info import enable_num_token_non_padded

    why = core.server_unsupported()
    if why:
        return why
    if enable_num_token_non_padded():
        return "token-count staging (EP, an all-to-all backend, DP gather: a pinned H2D copy in the draft step)"
    return worker_unsupported(worker)


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
    lazy = lazy_state(worker)
    published: dict = {}
    cap = Capture(r.pool, new_graph=new_graph)
    before = None
    r.capture = cap
    try:
        install(objs, slots)  # (on the scheduler's stream, before the capture)
        before = reserved()
        result = es.run_captured(r, cap, lambda: original(worker, batch, recorder(published), None, None),
                                   side_stream(r.stream), draw_outside(worker))
        changed = changed_state(lazy)
        if changed:
            raise RuntimeError(f"SGLang built {', '.join(changed)} during the capture (the step's first use of "
                               "it); put back, built again by an eager step")
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
        restore_state(lazy)
        forget_staged_params(worker)
        if before is not None:
            r.pool_bytes += max(0, reserved() - before)
    es.captured(r, NAME, bs, cap, CHILDREN, present(objs))
    return StepGraph(bs, slots, result, cap.parts, parent, exe, pool=cap.pool, state=worker_state(worker),
                     held=tuple(value for _, _, value in lazy), publish=published)


def launch(worker, sg: StepGraph, batch, copies, on_publish):
    r = _route
    record_stream(batch.seq_lens)  # before the copy reads it
    worker._verify_executor.begin_simulated_step()  # (SGLang's draw and fill_ on this stream; else a no-op)
    torch._foreach_copy_(*copies)
    es.launch_graph(r, sg.exe, stream_handle())
    forget_staged_params(worker)
    es.replayed(r, NAME)
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


_THIS = sys.modules[__name__]


def step_hook(original, self, batch, on_publish=None, grammar_barrier=None, coordination_plan=None):
    return core.step_hook(_THIS, original, self, batch, on_publish, grammar_barrier, coordination_plan)


def replay_hook(original, self, shape_key, static_forward_batch, **kwargs):
    return core.replay_hook(_route, original, self, shape_key, static_forward_batch, **kwargs)


def keep_hook(original, self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
    return core.keep_hook(_route, original, self, shape_key, forward_fn, capture_inputs, post_warmup_hook)


# --- startup ---


def inert(f: ServingFacts) -> str | None:
    from ..switches import env_value

    if not (f.speculative_algorithm and f.is_dspark()):
        return not_speculative(f, "only DSpark's v2 worker runs this step (DFlash's is another function)", False)
    # The same rules as ``unsupported``, which the scheduler applies again to SGLang's resolved settings.
    mode = env_value("SGLANG_RAGGED_VERIFY_MODE", f.env)
    observers = observer_envs(f.env)
    return core.startup_rules(f, (
        (mode != "static", f"SGLANG_RAGGED_VERIFY_MODE={mode} (the verify budget and layout are planned from host "
         "reads)"),
        (not env_value("SGLANG_DSPARK_FOLDED_PROPOSAL", f.env), "SGLANG_DSPARK_FOLDED_PROPOSAL=0 (the Markov proposal "
         "runs eagerly, outside the draft graph)"),
        (env_value("SGLANG_OPT_DSV41_TARGET_METADATA_EARLY", f.env), "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY (an "
         "event and a glue graph on a side stream)"),
        (observers, f"{', '.join(observers)} (DSpark's step observers: host bookkeeping per step)"),
    ))  # (simulated acceptance: any length; its draw runs outside the graph)


def observer_envs(env) -> list[str]:
    """The ``OBSERVER_ENVS`` that turn one of DSpark's step observers on under ``env`` (the online
    block-accept log only at a positive interval: create_block_accept_estimate_recorder)."""
    from ..switches import env_value

    return [name for name in OBSERVER_ENVS
            if (env_value(name, env) > 0 if name == "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL"
                else env_value(name, env))]


def prepare(facts) -> str:
    return core.prepare(_route)


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
