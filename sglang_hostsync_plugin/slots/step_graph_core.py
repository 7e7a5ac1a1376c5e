"""What ``dflash_step_graph`` and ``dspark_step_graph`` share (not a slot: no ``SLOT``, not listed in
``slots/__init__.py``): the per-step and server-wide rules both apply, the runners' attention and
KV-pool rules, the step hook's routing (keys, warm-up, pre-sizing, staleness, graph limit, check),
the check's raw bits and committed draft KV rows, and the runner hooks. The capture's steps (start,
segments, joining, failures, log lines) are ``eagle_step_graph``'s, which all three step graphs use.
Each slot keeps its own rules, inputs, capture body, launch and ``SLOT``.

The routing functions take the slot's module and read its attributes at call time (``_route``,
``ineligible``, ``stray_input``, ``owners``, ``gather``, ``capture``, ``launch``, ``checked``,
``presize_for``), so a test that replaces one of them on the slot module is heard here."""

from __future__ import annotations

import copy
import logging

import torch

from . import eagle_step_graph as es

logger = logging.getLogger("sglang.srt.plugins.hostsync")


# --- rules ---


def ineligible(batch, other, other_what: str) -> str | None:
    """Why this step must run SGLang's eager step, or None: the DFlash-family rules (``other`` is
    the hooked function's extra argument that must be None: PP proxy tensors, a DP prefill
    coordination plan, described by ``other_what``)."""
    mode = batch.forward_mode
    if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or not mode.is_decode():
        return "not a decode step"
    spec, info = batch.spec_info, batch.sampling_info
    if spec is None or info is None or other is not None:
        return f"no draft input or sampling info (or {other_what})"
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
            # (DFlash's dflash_utils and DSpark's verify_logits_adjustments_are_noop read it)
            or (penalizer is not None and penalizer.is_required)
            or info.logit_bias is not None or info.has_watermark_candidates):
        return "penalties, logit bias or watermark"
    if info.sampling_mask_batch_indices is not None or info.grammar_mask is not None:
        return "sampling masks"
    if batch.hisparse_coordinator is not None or batch.mamba_track_indices is not None:
        return "hisparse or mamba state"
    # (DFlash: the host bound becomes committed + block, W:2625/2841; DSpark: the window's and the
    # draft's host bounds, DW:1022, DD:593)
    if batch.seq_lens_cpu is not None:
        return "host sequence lengths (seq_lens_cpu)"
    if spec.nxt_kv_lens_cpu is None:  # (DFlash: else a loop over batch.reqs, W:2634; DSpark: raises, DD:600)
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


def runners_unsupported(worker, per_runner=None) -> str | None:
    """The target and draft runners' rules: ``per_runner(which, runner)`` first (the slot's own, or
    None), a translated KV pool, then attention other than triton or FA3 for both alike."""
    runners = (("target", worker.model_runner), ("draft", worker.draft_model_runner))
    for which, runner in runners:
        why = per_runner(which, runner) if per_runner is not None else None
        if why:
            return why
        if runner.kv_index_translator.is_translating:
            return f"the {which}'s translated KV pool (its read table is sized from host lengths)"
    kinds = set().union(*(attention_kind(runner.attn_backend) for _, runner in runners))
    if kinds not in ({"triton"}, {"fa3"}):
        return (f"attention {', '.join(sorted(kinds))}: the step graph is built for triton or FA3, target and "
                "draft alike")
    return None


def server_unsupported() -> str | None:
    """Server-wide settings under which the step decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale (the worker's rules are the slot's own)."""
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
    return es.unified_memory_unsupported() or es.runner_graphs_unsupported()


def startup_rules(f, extra=()) -> str | None:
    """The startup rules both slots have (``inert``, after its algorithm check), then ``extra``
    ((on, why) pairs, the slot's own); the same rules as ``server_unsupported``, which the
    scheduler applies again to SGLang's resolved settings."""
    from sglang.srt.server_args import DRAFT_ATTENTION_BACKEND_CHOICES

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
    for on, why in ((f.disable_overlap_schedule, "--disable-overlap-schedule (the step stages the host sequence "
                     "lengths)"),
                    (f.speculative_adaptive, "--speculative-adaptive (the verify width changes at run time)"),
                    (f.returns_capture_outputs, "--enable-return-routed-experts / --enable-return-indexer-topk "
                     "(per-step capture outputs)"),
                    (f.expert_distribution, "expert distribution recording or EPLB (per-forward host bookkeeping)"),
                    *extra):
        if on:
            return f"inert because of {why}"
    return None


def largest_bs(worker, bs: int) -> int:
    """The largest batch size a step graph can be captured at: the target's decode graphs' (a bigger
    batch runs the verify eagerly, so it is never captured)."""
    runner = getattr(worker.model_runner, "decode_cuda_graph_runner", None)
    return max(int(bs), int(getattr(runner, "max_bs", 0) or 0))


# --- the check ---


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.clone() if not t.is_floating_point() else t.contiguous().view(_BITS[t.element_size()]).clone()


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
                got = got.view(_BITS[got.element_size()])
            rows.append(torch.where(keep.view(*keep.shape, *[1] * (got.dim() - 2)), got, torch.zeros_like(got)))
    return rows


def fingerprint(result, cloned, rows) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal), then ``rows``."""
    out = [getattr(result, name) for name in cloned] + [result.next_draft_input.bonus_tokens]
    return [_bits(t) for t in out if t is not None] + rows


# --- the graph ---


def output(result, cloned):
    """A result for the scheduler: the captured one, its ``cloned`` host-read tensors cloned."""
    out = copy.copy(result)
    for name in cloned:
        setattr(out, name, getattr(result, name).clone())
    out.next_draft_input = copy.copy(result.next_draft_input)
    out.extra_keep_alive_refs = list(result.extra_keep_alive_refs or ())
    return out


# --- capture and replay ---


def step_hook(mod, original, self, batch, on_publish, grammar_barrier, other):
    """The step hook of slot module ``mod`` (``other``: the hooked function's last argument)."""
    r = mod._route
    if r.capture is not None:
        return original(self, batch, on_publish, grammar_barrier, other)
    if r.disabled:  # (before the per-step rules and the stray scan: none of them matters any more)
        r.count_eager("capture off")
        return original(self, batch, on_publish, grammar_barrier, other)
    reason = mod.ineligible(self, batch, other)
    if not reason:
        stray = mod.stray_input(mod.owners(batch))
        reason = stray and f"the step reads {stray}"
    if reason:
        r.count_eager(reason)
        return original(self, batch, on_publish, grammar_barrier, other)
    bs = len(batch.seq_lens)
    if bs in r.skip:
        r.count_eager(f"bs {bs} has no step graph")
        return original(self, batch, on_publish, grammar_barrier, other)
    layout, tensors = mod.gather(mod.owners(batch))
    key = (bs, layout)
    if r.failures.get(key, 0) >= es.MAX_FAILURES:
        r.count_eager(f"bs {bs}: its capture failed {es.MAX_FAILURES} times")
        return original(self, batch, on_publish, grammar_barrier, other)
    sg = r.graphs.get(key)
    if sg is not None and not sg.current(self):  # a runner re-captured, or the worker changed: capture again
        drop_stale(r, self)
        sg = None
    if sg is None:
        if len(r.graphs) >= r.max_graphs:
            drop_stale(r, self)  # (graphs a grown buffer made stale hold their slots until their key comes up)
        if len(r.graphs) >= r.max_graphs:
            r.count_eager(f"{r.max_graphs} step graphs held already ({es.ENV_MAX})")
            return original(self, batch, on_publish, grammar_barrier, other)
        r.warm[key] = r.warm.get(key, 0) + 1
        if r.warm[key] == 1:  # (before the warm-ups: they run on the buffers the capture records)
            mod.presize_for(self, batch, largest_bs(self, bs))
        if r.warm[key] > es.WARMUPS:
            sg = mod.capture(original, self, batch, tensors, key)
            if sg is None:
                r.warm[key] = 0  # (a failed capture: try again after as many eager steps, not on every one)
        if sg is None:
            return original(self, batch, on_publish, grammar_barrier, other)
        r.graphs[key] = sg
    copies = (sg.slots, tensors)
    if r.check and (r.replays + 1) % r.check == 0:
        return mod.checked(original, self, batch, sg, copies, on_publish)
    return mod.launch(self, sg, batch, copies, on_publish)


def drop_stale(r, worker) -> None:
    """Destroy every graph that is not current (``worker_state`` is the whole worker's: a grown
    buffer, a flag turned off or a rebuilt object makes every graph captured before it stale, not
    only the one whose key came up); their keys warm up again."""
    for key, sg in list(r.graphs.items()):
        if not sg.current(worker):
            del r.graphs[key]
            r.driver.destroy(sg.parent, sg.exe)
            r.warm[key] = 0


def replay_hook(r, original, self, shape_key, static_forward_batch, **kwargs):
    cap = r.capture
    if cap is None:
        return original(self, shape_key, static_forward_batch, **kwargs)
    cap.cut(self, shape_key)
    return self._outputs[shape_key]


def keep_hook(r, original, self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
    # A runner capturing after startup (a weight update with recapture_cuda_graph): the slot's graphs
    # go, with what they hold. eagle_step_graph's hook then keeps the runner's graph (its own route is
    # empty wherever this slot acts, so its drop is a no-op).
    r.drop("a runner is capturing its graphs")
    return es.keep_hook(original, self, shape_key, forward_fn, capture_inputs, post_warmup_hook)


def prepare(r) -> str:
    r.check, r.max_graphs = es.settings()
    notes = [f"at most {r.max_graphs} step graphs"]
    if r.check:
        notes.append(f"eager check every {r.check} replayed steps")
    return "; ".join(notes)
