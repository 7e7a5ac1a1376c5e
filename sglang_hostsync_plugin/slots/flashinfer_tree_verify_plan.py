"""Slot ``flashinfer_tree_verify_plan``: FlashInfer's target-verify CUDA-graph replays
plan from host values where SGLang's own opt-in does not reach: EAGLE-family verify at
topk > 1, and NGRAM verify.

Stock SGLang 0.5.23 replans the verify wrapper every step with FlashInfer's
``plan()``: ``segment_packbits`` reads ``indptr[-1].item()`` for the custom mask and
``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len`` are copied to the
CPU, blocking reads that drain the queue behind the draft. SGLang ships the
sync-free replacement (``fast_prefill_plan``: host-known layout, the tree mask packed
on the GPU by ``pack_verify_mask_into``) and installs it at capture under
``SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN`` for EAGLE topk 1 only
(``FlashInferAttnBackend.init_forward_metadata_out_graph`` ~887-900; the switch
slot ``flashinfer_verify_host_plan``). Nothing in that path depends on the tree: the
verify layout is ``num_tokens_per_req`` query rows per request over ``seq_len +
num_tokens_per_req`` keys, and the packed mask is every mask bit of that window. EAGLE
(``EagleVerifyInput.generate_attn_arg_prefill``) and NGRAM
(``NgramVerifyInput.generate_attn_arg_prefill``, ``USE_FULL_MASK``) build the same one.

With the slot, the capture-time install runs under upstream's other conditions
(``seq_lens_cpu`` known at capture, the fa2 prefill path, no SWA / cross-attention
dispatch, KV bf16 / fp16 / fp8) for:

- EAGLE-family verify at topk > 1: SGLang's own ``partial(fast_prefill_plan, w)``;
  replays take SGLang's ``call_begin_forward`` host branch unchanged.
- NGRAM verify: ``call_begin_forward``'s host branch asserts that a custom mask is
  EAGLE's, so an :class:`NgramHostPlan` goes in instead (no ``.func``: the replay takes
  the plain branch and calls it with ``plan()``'s arguments). Before each verify replay
  the hook hands it the batch's ``seq_lens_cpu``; it builds the host layout exactly as
  the EAGLE host branch does (``host_layout``) and calls SGLang's ``fast_prefill_plan``.
  Without host lengths it runs the wrapper's own ``plan()``.

Topk 1 EAGLE is left to the switch. Requires ``flashinfer_plan_guard``: the host plan
makes the verify wrapper's pinned plan buffer one more that is rewritten without a sync.

Hook target: ``FlashInferAttnBackend.init_forward_metadata_out_graph`` (AROUND;
SGLang's body runs unchanged).
"""

from __future__ import annotations

from functools import partial

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_flashinfer, not_speculative
from .flashinfer_plan_guard import FB, NAME as GUARD, PRESET

NAME = "flashinfer_tree_verify_plan"
HOST_PLAN_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def _tree_verify(spec_info) -> str | None:
    """"eagle" / "ngram" for the verify inputs this slot plans on the host, else None."""
    from sglang.srt.speculative.spec_info import SpecInputType

    kind = spec_info.spec_input_type
    if kind == SpecInputType.EAGLE_VERIFY and spec_info.topk > 1:
        return "eagle"
    if kind == SpecInputType.NGRAM_VERIFY:
        return "ngram"
    return None


def eligible(backend, forward_batch) -> str | None:
    """Upstream's topk-1 install conditions, for topk > 1 EAGLE and for NGRAM: which one."""
    spec_info = forward_batch.spec_info
    if not (
        forward_batch.forward_mode.is_target_verify()
        and spec_info is not None
        and forward_batch.seq_lens_cpu is not None
        and backend.prefill_backend == "fa2"
        and backend.dispatch_reason is None
        and backend.flashinfer_kv_cache_dtype in HOST_PLAN_KV_DTYPES
    ):
        return None
    return _tree_verify(spec_info)


def host_layout(seq_lens_cpu: torch.Tensor, width: int) -> dict:
    """The host kwargs ``call_begin_forward`` gives ``fast_prefill_plan`` for an EAGLE
    verify of committed lengths ``seq_lens_cpu`` and ``width`` tokens per request."""
    kv_lens = seq_lens_cpu.to(torch.int32) + width
    bs = kv_lens.numel()
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device="cpu")
    kv_indptr[1:] = torch.cumsum(kv_lens, dim=0)
    return dict(
        qo_indptr_host=torch.arange(0, (bs + 1) * width, step=width, dtype=torch.int32, device="cpu"),
        kv_indptr_host=kv_indptr,
        kv_lens_host=kv_lens,
        max_q_len=width,
        max_kv_len=int(kv_lens.max()),
        uniform_verify_width=width,
    )


class NgramHostPlan:
    """An NGRAM verify wrapper's ``begin_forward``: ``plan()``'s signature, SGLang's
    ``fast_prefill_plan`` inside. ``host`` is set by the hook for one replay and used once."""

    def __init__(self, wrapper, stock):
        self.wrapper = wrapper
        self.stock = stock  # the wrapper's own plan()
        self.host: tuple[torch.Tensor, int] | None = None  # (seq_lens_cpu, draft_token_num)
        self.host_plans = 0

    def __call__(self, *args, custom_mask=None, **kwargs):
        host, self.host = self.host, None
        if host is None or custom_mask is None:
            return self.stock(*args, custom_mask=custom_mask, **kwargs)
        import sglang.srt.layers.attention.flashinfer_backend as fb

        self.host_plans += 1
        return fb.fast_prefill_plan(self.wrapper, *args, custom_mask=custom_mask, **kwargs, **host_layout(*host))


def _verify_wrappers(backend, forward_batch) -> list:
    return backend.prefill_cuda_graph_metadata.get(forward_batch.batch_size, ())


def capture_hook(original, self, forward_batch, in_capture=False):
    plans = ()
    if not in_capture and forward_batch.forward_mode.is_target_verify():
        plans = [w.begin_forward for w in _verify_wrappers(self, forward_batch)
                 if isinstance(w.begin_forward, NgramHostPlan)]
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if plans and seq_lens_cpu is not None:
            for p in plans:
                p.host = (seq_lens_cpu, forward_batch.spec_info.draft_token_num)
    try:
        out = original(self, forward_batch, in_capture)
    finally:
        for p in plans:
            p.host = None
    if in_capture:
        which = eligible(self, forward_batch)
        if which is not None:
            import sglang.srt.layers.attention.flashinfer_backend as fb

            for w in self.prefill_cuda_graph_metadata[forward_batch.batch_size]:
                if which == "eagle":
                    # The module's own function: call_begin_forward compares begin_forward.func to it.
                    w.begin_forward = partial(fb.fast_prefill_plan, w)
                elif not isinstance(w.begin_forward, NgramHostPlan):
                    w.begin_forward = NgramHostPlan(w, w.begin_forward)
    return out


def inert(facts) -> str | None:
    if facts.speculative_algorithm and facts.is_ngram():
        return not_flashinfer(facts)
    if not facts.speculative_algorithm or not facts.is_eagle_family():
        return not_speculative(facts, "only EAGLE-family and NGRAM verify plan a tree", False)
    if facts.topk == 1:
        return ("inert because --speculative-eagle-topk is 1; that case is SGLang's own switch "
                "(flashinfer_verify_host_plan)")
    return not_flashinfer(facts)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 fast_prefill_plan, extended to topk > 1 and NGRAM",
    summary="FlashInfer verify (EAGLE topk > 1, NGRAM) planned from host values: no indptr reads per step",
    default=True,
    requires=(GUARD,),
    presets=(PRESET,),
    inert=inert,
    targets=(
        HookTarget(
            f"{FB}.FlashInferAttnBackend.init_forward_metadata_out_graph", TargetKind.FUNCTION,
            hook=capture_hook, params=("self", "forward_batch", "in_capture"), source_sha="9a2970e34735d64d",
        ),
    ),
)
