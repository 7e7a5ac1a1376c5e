"""SGLang 0.5.23's own opt-ins against per-replay host work in attention metadata prep,
as switch slots (none in ``default``; each turns on one of SGLang's env flags):

- ``metadata_glue_graph`` (``SGLANG_ENABLE_METADATA_GLUE_GRAPH``, experimental):
  ``DecodeCudaGraphRunner`` captures each replay's ``init_forward_metadata_out_graph``
  op soup into one small CUDA graph (``model_executor/runner/metadata_glue_graph.py``).
  Routed only for padding-free replays (the batch size is a captured one) without
  TBO, pdmux or LoRA; forced off for the DFlash family (``DecodeCudaGraphRunner.__init__``);
  a capture that fails (a backend that syncs or reads host values in its prep) falls
  back to eager for good. A backend whose prep computes plan inputs on the host every
  replay must never be glued: capture keeps only device ops, the plan replays frozen
  and only the accept length shows it. Hence the conflict with
  ``flashinfer_verify_host_plan``, and the refusal beside the owned
  ``flashinfer_tree_verify_plan`` (a default slot) wherever that one is not inert:
  FlashInfer EAGLE verify at topk > 1 and NGRAM verify (``Slot.unsafe_with``).
- ``flashinfer_verify_host_plan`` (``SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN``):
  FlashInfer's EAGLE target-verify CUDA-graph replays plan from host values
  (``fast_prefill_plan``) instead of reading ``indptr``/lengths back from the GPU
  (``FlashInferAttnBackend`` ~887-900): EAGLE-family verify input, topk 1, the
  backend's fa2 prefill path, no SWA / cross-attention wrapper, KV cache bf16, fp16
  or fp8.
- ``flashinfer_draft_host_indptr`` (``SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR``):
  ``FlashInferMultiStepDraftBackend.common_template`` builds the multi-step draft's
  kv indptr from the resolved host seq lens instead of ``kv_indptr[:, :bs+1].cpu()``
  (~2537): needs ``draft_window_size == 0``.

The inert rules below are the conditions these facts can decide before launch; the
rest (SWA models, padded batch sizes, the draft window) are decided by SGLang per
model or per replay, where it falls back to its stock path by itself.
"""

from __future__ import annotations

from .. import switches
from ..slot import ENV_UNSAFE, ServingFacts, Slot, SlotKind
from ..switches import flag_precheck
from .upstream_switches import HOST_PRESET

ORIGIN = "sglang 0.5.23 opt-in"
GLUE_FLAG = "SGLANG_ENABLE_METADATA_GLUE_GRAPH"
# ``SGLANG_HOSTSYNC_SLOTS=default,flashinfer``: these two plus the owned FlashInfer slots and
# ``draft_extend_fused_layout``.
FLASHINFER_PRESET = "flashinfer"
VERIFY_HOST_PLAN_FLAG = "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN"
# --kv-cache-dtype values whose FlashInfer KV dtype is bf16, fp16 or fp8 ("auto": the model's).
HOST_PLAN_KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")


def _uses_flashinfer(f: ServingFacts, which: str) -> str | None:
    backends = {"target": f.attention_backends, "draft": (f.draft_attention_backend or f.attention_backends[1],)}[which]
    known = [b for b in backends if b]
    if known and "flashinfer" not in known:
        return f"inert because the {which} attention backend is {', '.join(sorted(set(known)))}, not flashinfer"
    return None


# Target backends whose verify prep reads EAGLE's tree mask from their own VerifyMask buffer, where
# EAGLE writes it (triton, fa3), or fails the capture on its host plan (flashinfer, whose host-fed
# plans are refused separately). A backend without a VerifyMask (aiter, ...) is handed the mask EAGLE
# allocates every step: a captured prep would replay a freed tensor.
GLUE_BACKENDS = ("triton", "fa3", "flashinfer")
GLUE_PER_STEP_MASK = ("NGRAM's verify mask is a new tensor every step (SGLang's USE_FULL_MASK torch.cat, "
                      "and ngram_full_mask's kernel): the glue graph would copy the capture step's freed mask "
                      "on every replay and change the outputs")


def glue_unsafe_reason(f: ServingFacts) -> str | None:
    """Why a captured target-verify prep would read a tensor allocated per step (None: it reads none)."""
    if f.speculative_algorithm == "NGRAM":
        return GLUE_PER_STEP_MASK
    known = {b for b in f.attention_backends if b}
    if f.speculative_algorithm and known - set(GLUE_BACKENDS):
        return (f"the target attention backend is {', '.join(sorted(known))}: only the verify prep of "
                f"{', '.join(GLUE_BACKENDS)} was read to use no tensor EAGLE allocates every step (a backend "
                "without a VerifyMask buffer copies the tree mask EAGLE allocates per step)")
    return None


def glue_inert(f: ServingFacts) -> str | None:
    unsafe = glue_unsafe_reason(f)
    if unsafe:
        reason = f"inert because {unsafe}"
        if switches.env_value(GLUE_FLAG, f.env) is True:
            reason += f"; {ENV_UNSAFE}{GLUE_FLAG} is set in the environment and SGLang reads it anyway: unset it"
        return reason
    if f.disable_cuda_graph:
        return "inert because --disable-cuda-graph is set (the glue graph lives in the decode graph runner)"
    if f.speculative_algorithm and f.is_dflash_family():
        return "inert because DecodeCudaGraphRunner forces it off for the DFlash family (host-fed verify plans)"
    for on, what in ((f.two_batch_overlap, "two-batch overlap"), (f.enable_pdmux, "pdmux"), (f.enable_lora, "LoRA")):
        if on:
            return f"inert because {what} is on (replays with it are never routed to the glue graph)"
    return None


def verify_host_plan_inert(f: ServingFacts) -> str | None:
    if not f.speculative_algorithm or not f.is_eagle_family():
        return f"inert because --speculative-algorithm is {f.speculative_algorithm or 'unset'}; only EAGLE-family verify reads it"
    if f.topk is not None and f.topk != 1:
        return f"inert because --speculative-eagle-topk is {f.topk}; the host plan covers topk 1 only"
    if f.disable_cuda_graph:
        return "inert because --disable-cuda-graph is set (installed at verify graph capture)"
    if f.kv_cache_dtype not in HOST_PLAN_KV_DTYPES:
        return f"inert because --kv-cache-dtype is {f.kv_cache_dtype}; the host plan covers bf16, fp16 and fp8 KV"
    return _uses_flashinfer(f, "target")


def draft_host_indptr_inert(f: ServingFacts) -> str | None:
    if not f.speculative_algorithm or not f.is_eagle_family():
        return f"inert because --speculative-algorithm is {f.speculative_algorithm or 'unset'}; only the EAGLE multi-step draft reads it"
    if f.speculative_num_steps is not None and f.speculative_num_steps <= 1:
        return "inert because --speculative-num-steps is 1 (no multi-step draft backend)"
    if f.draft_window_size:
        return f"inert because --speculative-draft-window-size is {f.draft_window_size}; the host indptr needs no draft window"
    return _uses_flashinfer(f, "draft")


def _switch(name, flag, summary, inert, conflicts=(), presets=(), unsafe_with=(), requires=()) -> Slot:
    return Slot(name=name, kind=SlotKind.UPSTREAM_SWITCH, origin=ORIGIN, summary=summary, default=False,
                precheck=lambda: flag_precheck(flag), env_flag=flag, inert=inert, conflicts=tuple(conflicts),
                presets=tuple(presets), unsafe_with=tuple(unsafe_with), requires=tuple(requires))


GLUE_FREEZES_HOST_PLAN = ("its FlashInfer verify plan is computed on the host every replay, and the glue graph "
                          "would replay the capture's plan frozen (silently: only the accept length shows it)")


SLOTS = (
    _switch("metadata_glue_graph", GLUE_FLAG,
            "per-replay attention metadata prep captured into one small CUDA graph", glue_inert,
            conflicts=("flashinfer_verify_host_plan",),
            unsafe_with=(("flashinfer_tree_verify_plan", GLUE_FREEZES_HOST_PLAN),), presets=(HOST_PRESET,)),
    # Without the verify's read-back nothing drains the stream before the next plan.
    _switch("flashinfer_verify_host_plan", VERIFY_HOST_PLAN_FLAG,
            "FlashInfer EAGLE verify (topk 1) planned from host values: no indptr reads per step",
            verify_host_plan_inert, presets=(FLASHINFER_PRESET,), requires=("flashinfer_plan_guard",)),
    _switch("flashinfer_draft_host_indptr", "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR",
            "FlashInfer multi-step draft kv indptr from the host seq lens: no .cpu() per step",
            draft_host_indptr_inert, presets=(FLASHINFER_PRESET,)),
)
