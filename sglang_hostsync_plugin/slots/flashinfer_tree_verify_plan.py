"""Slot ``flashinfer_tree_verify_plan``: FlashInfer's EAGLE target-verify CUDA-graph
replays at topk > 1 plan from host values, as SGLang's own opt-in does at topk 1.

Stock SGLang 0.5.23 replans the verify wrapper every step with FlashInfer's
``plan()``: ``segment_packbits`` reads ``indptr[-1].item()`` for the custom mask and
``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len`` are copied to the
CPU, blocking reads that drain the queue behind the draft. SGLang ships the
sync-free replacement (``fast_prefill_plan``: host-known layout, the tree mask packed
on the GPU by ``pack_verify_mask_into``) and installs it at capture under
``SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN`` for topk 1 only
(``FlashInferAttnBackend.init_forward_metadata_out_graph`` ~887-900; the switch
slot ``flashinfer_verify_host_plan``). Nothing in that path depends on topk: the
verify layout is ``num_draft_tokens`` query rows per request over ``seq_len +
num_draft_tokens`` keys (``EagleVerifyInput.generate_attn_arg_prefill``), and the
packed mask is every tree-mask bit of that window, whatever the tree's shape.

With the slot, the same capture-time install runs for EAGLE-family verify at
topk > 1, under upstream's other conditions (``seq_lens_cpu`` known at capture, the
fa2 prefill path, no SWA / cross-attention dispatch, KV bf16 / fp16 / fp8). The
replay path is SGLang's own ``call_begin_forward`` -> ``fast_prefill_plan``
(SGLang picks it by ``begin_forward.func is fast_prefill_plan``). Topk 1 is left
to the switch. Requires ``flashinfer_plan_guard``: the host plan makes the verify
wrapper's pinned plan buffer one more that is rewritten without a sync.

Hook target: ``FlashInferAttnBackend.init_forward_metadata_out_graph`` (AROUND;
SGLang's body runs first, unchanged). Not covered: NGRAM verify (its input type
fails ``call_begin_forward``'s EAGLE-only host-plan branch).
"""

from __future__ import annotations

from functools import partial

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_flashinfer, not_speculative
from .flashinfer_plan_guard import FB, NAME as GUARD, PRESET

NAME = "flashinfer_tree_verify_plan"
HOST_PLAN_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def eligible(backend, forward_batch) -> bool:
    """Upstream's topk-1 install conditions, with topk > 1 instead."""
    from sglang.srt.speculative.spec_info import SpecInputType

    spec_info = forward_batch.spec_info
    return (
        forward_batch.forward_mode.is_target_verify()
        and spec_info is not None
        and spec_info.spec_input_type == SpecInputType.EAGLE_VERIFY
        and spec_info.topk > 1
        and forward_batch.seq_lens_cpu is not None
        and backend.prefill_backend == "fa2"
        and backend.dispatch_reason is None
        and backend.flashinfer_kv_cache_dtype in HOST_PLAN_KV_DTYPES
    )


def capture_hook(original, self, forward_batch, in_capture=False):
    out = original(self, forward_batch, in_capture)
    if in_capture and eligible(self, forward_batch):
        import sglang.srt.layers.attention.flashinfer_backend as fb

        # The module's own function: call_begin_forward compares begin_forward.func to it.
        for w in self.prefill_cuda_graph_metadata[forward_batch.batch_size]:
            w.begin_forward = partial(fb.fast_prefill_plan, w)
    return out


def inert(facts) -> str | None:
    if not facts.speculative_algorithm or not facts.is_eagle_family():
        return not_speculative(facts, "only EAGLE-family verify plans a tree", False)
    if facts.topk <= 1:
        return ("inert because --speculative-eagle-topk is 1; that case is SGLang's own switch "
                "(flashinfer_verify_host_plan)")
    return not_flashinfer(facts)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 fast_prefill_plan, extended to topk > 1 (issue 15 item 1)",
    summary="FlashInfer EAGLE verify at topk > 1 planned from host values: no indptr reads per step",
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
