"""Slot ``target_dp_meta`` (the target-side twins of sglang#47677; not in SGLang 0.5.23).

Every ``ForwardBatch.init_new`` under DP attention / EP / DP gather builds its
DP counts from fresh pinned ``torch.tensor``s, one H2D each. Covered sites
(``sglang/srt/model_executor/forward_batch_info.py``):

- ``ForwardBatch.init_mlp_sync_metadata`` (~897-955): ``global_num_tokens`` and
  ``global_num_tokens_for_logprob`` (int64, 2 pinned tensors, 2 H2D). With the slot
  both rows go through one persistent two-slot pinned ``[2, 2, dp]`` host buffer
  (``staging.TwoSlotStager``) and ONE H2D into a new ``[2, dp]`` device tensor; the
  batch gets its two rows.
- ``ForwardBatch._init_num_token_non_padded`` (~1364-1382): the
  ``global_num_token_non_padded`` scalar (int32, 1 pinned tensor, 1 H2D) goes
  through its own two-slot pinned stager into a new 0-dim device tensor.
- ``ForwardBatch.prepare_mlp_sync_batch`` (~1948-1954, the eager forward's DP
  padding; CUDA-graph replays skip it): the padded ``global_num_tokens`` (int64, 1
  pinned tensor, 1 H2D into ``global_num_tokens_gpu``) goes through a third two-slot
  stager straight into ``global_num_tokens_gpu``. The site sits in the middle of a
  230-line method, so the method is SGLang's own source with those six lines
  replaced (``source_edit``; source pinned). Where ``global_num_tokens_gpu`` is not
  a 1-D contiguous int64 tensor of the right length, SGLang's two lines run.

Inert (no hook registered) where SGLang stages no counts: ``require_mlp_sync()`` and
``enable_num_token_non_padded()`` are both false without attention DP, expert parallelism, an
MoE all-to-all backend, ``--moe-dense-tp-size`` or elastic EP (a dense model on one GPU or
plain TP): the hooks would only pass through.

The device tensors stay fresh per ForwardBatch (the caching allocator's, no
cudaMalloc after warm-up): many consumers keep or modify them in place (e.g.
``prepare_mlp_sync_batch``'s ``copy_``), so they must not alias across steps. The
pinned slots are reused, each rewritten only after the event recorded after its
last H2D fired. The hooks replace SGLang's bodies (sources pinned); the count
logic calls SGLang's own ``spec_scale_global_num_tokens``.
Each stager's copies and event record are one C++ call where csrc builds
(``SGLANG_HOSTSYNC_STAGING_IMPL``, see ``staging``).
"""

from __future__ import annotations


import torch

from sglang.srt.model_executor import forward_batch_info
from sglang.srt.speculative.spec_info import spec_scale_global_num_tokens

from ..source_edit import PinnedEdit
from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck
from ..staging import TwoSlotStager, check_staging_impl, prepare_staging, staging_kernels

NAME = "target_dp_meta"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"

_counts: TwoSlotStager | None = None
_non_padded: TwoSlotStager | None = None
_padded: TwoSlotStager | None = None


def stagers() -> tuple[TwoSlotStager, TwoSlotStager, TwoSlotStager]:
    """The process's stagers (one scheduler thread builds every ForwardBatch):
    counts, num_token_non_padded, padded counts."""
    global _counts, _non_padded, _padded
    if _counts is None:
        _counts = TwoSlotStager(rows=2, fresh_device=True)
        _non_padded = TwoSlotStager(rows=1, dtype=torch.int32, fresh_device=True)
        _padded = TwoSlotStager(rows=1, fresh_device=True)  # writes into= the batch's tensor
    return _counts, _non_padded, _padded


def reset() -> None:
    global _counts, _non_padded, _padded
    _counts = _non_padded = _padded = None


def init_mlp_sync_metadata_hook(original, self, batch, device, *, is_draft_worker: bool = False) -> None:
    self.dp_spec_prefill_coordination_applied = batch.dp_spec_prefill_coordination_applied
    source = batch.global_num_tokens
    source_logprob = batch.global_num_tokens_for_logprob
    # A DP spec/prefill coordination plan already wrote this phase's counts.
    if (
        is_draft_worker
        and batch.draft_global_num_tokens is not None
        and not batch.dp_spec_prefill_coordination_applied
    ):
        source = batch.draft_global_num_tokens
        source_logprob = batch.draft_global_num_tokens_for_logprob
    if source is None:
        return
    assert source_logprob is not None
    if self.spec_info is not None and not batch.dp_spec_prefill_coordination_applied:
        counts, counts_logprob = spec_scale_global_num_tokens(self.spec_info, source, source_logprob)
    else:
        counts, counts_logprob = source, source_logprob
    self.original_global_num_tokens_cpu = source
    self.global_num_tokens_cpu = counts
    self.global_num_tokens_for_logprob_cpu = counts_logprob
    self.global_num_tokens_gpu, self.global_num_tokens_for_logprob_gpu = stagers()[0].stage(
        device, counts, counts_logprob
    )
    self.can_run_decode_cuda_graph = batch.can_run_decode_cuda_graph
    self.can_run_dp_draft_cuda_graph = batch.can_run_dp_draft_cuda_graph


def init_num_token_non_padded_hook(original, self, *, device, is_draft_worker: bool) -> None:
    if self.input_ids is not None:
        num_tokens = len(self.input_ids)
    elif is_draft_worker and self.spec_info is not None and self.forward_mode.is_decode():
        assert self.spec_info.num_tokens_per_req > 0
        num_tokens = self.batch_size * self.spec_info.num_tokens_per_req
    else:
        num_tokens = 0
    if forward_batch_info.enable_num_token_non_padded():
        (row,) = stagers()[1].stage(device, (num_tokens,))
        self.global_num_token_non_padded = row.view(())
    self.global_num_token_non_padded_cpu = num_tokens


def stage_padded_counts(fb, global_num_tokens: list) -> None:
    """``prepare_mlp_sync_batch``'s H2D of the padded counts into ``global_num_tokens_gpu``."""
    dst = fb.global_num_tokens_gpu
    padded = stagers()[2]
    if padded.fits(dst, len(global_num_tokens)):
        padded.stage(dst.device, global_num_tokens, into=dst)
    else:  # SGLang's two lines
        pinned = torch.tensor(global_num_tokens, pin_memory=fb.use_pin_memory)
        dst.copy_(pinned, non_blocking=fb.use_pin_memory)


PADDED_COUNTS_H2D = (
    """        global_num_tokens_pinned = torch.tensor(
            global_num_tokens, pin_memory=self.use_pin_memory
        )
        self.global_num_tokens_gpu.copy_(
            global_num_tokens_pinned, non_blocking=self.use_pin_memory
        )
""",
    """        _hostsync_stage_padded_counts(self, global_num_tokens)
""",
)
PREPARE_SHA = "314a988fac1c4001"
PREPARE = PinnedEdit(NAME, f"{FORWARD_BATCH}.prepare_mlp_sync_batch", (PADDED_COUNTS_H2D,),
                     lambda: {"_hostsync_stage_padded_counts": stage_padded_counts}, PREPARE_SHA)


def _path_used(facts) -> bool:
    """Whether SGLang stages DP / MoE token counts per ForwardBatch under these server facts."""
    return facts.dp_attention or facts.moe_counts


def inert(facts) -> str | None:
    if _path_used(facts):
        return None
    return ("inert because neither attention DP nor an MoE setting that stages token counts (--ep-size > 1, "
            "--moe-a2a-backend, --moe-dense-tp-size, elastic EP) is on: SGLang stages no DP counts")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang#47677 (target side)",
    summary="target ForwardBatch DP counts: persistent pinned staging, one H2D for both count rows",
    default=True,
    precheck=config_precheck(check_staging_impl, PREPARE.check),
    inert=inert,
    kernels=lambda facts: staging_kernels(_path_used(facts), facts.env),
    prepare=lambda facts: prepare_staging(NAME, _path_used(facts)),
    targets=(
        HookTarget(
            f"{FORWARD_BATCH}.init_mlp_sync_metadata", TargetKind.FUNCTION, hook=init_mlp_sync_metadata_hook,
            params=("self", "batch", "device", "is_draft_worker"), source_sha="42de946b9715fd34",
        ),
        HookTarget(
            f"{FORWARD_BATCH}._init_num_token_non_padded", TargetKind.FUNCTION, hook=init_num_token_non_padded_hook,
            params=("self", "device", "is_draft_worker"), source_sha="2db8b5d5db002f7e",
        ),
        PREPARE.target(params=("self", "model_runner")),
    ),
)
