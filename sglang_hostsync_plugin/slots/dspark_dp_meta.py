"""Slot ``dspark_dp_meta`` (sglang#47677, not in SGLang 0.5.23).

Under DP-MoE sync, ``DraftBlockProposer._fill_dp_moe_sync_metadata`` builds the
draft's ``global_num_tokens_gpu`` / ``global_num_tokens_for_logprob_gpu`` from two
fresh pinned ``torch.tensor``s per step, and ``_make_num_token_non_padded`` adds a
fresh pinned scalar + H2D twice per step (at ForwardBatch build and in the fill).

With the slot:
- both count rows go through one persistent two-slot pinned ``[2, 2, dp]`` buffer
  and ONE H2D into a matching device buffer (`staging.TwoSlotStager`); the forward
  batch's GPU tensors are views of the current device slot. Each slot's event is
  waited on before the host rewrites it, so a second fill in one step cannot
  overwrite a pending copy. Allocated at the first fill; reallocated if dp or the
  device changes. The copies and the event record are one C++ call where csrc
  builds (``SGLANG_HOSTSYNC_STAGING_IMPL``, see ``staging``).
- ``global_num_token_non_padded`` is a 0-dim view of the proposer's persistent
  ``_num_token_non_padded``, which the fill already writes with the same count
  (under DP-MoE sync from the stage's own pinned int32 slot, in the same stage,
  instead of a ``fill_`` kernel);
  ``_make_num_token_non_padded`` no longer allocates or copies (its only callers
  are ``_run_forward``, which calls the fill right after, and the fill itself).

Hook targets (SGLang 0.5.23, sglang/srt/speculative/dspark_components/dspark_draft.py):
``DraftBlockProposer._fill_dp_moe_sync_metadata`` (replacement class) and the
module function ``_make_num_token_non_padded`` (AROUND).
"""

from __future__ import annotations

from sglang.srt.speculative.spec_info import spec_scale_global_num_tokens

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from ..staging import TwoSlotStager, check_staging_impl, prepare_staging, staging_kernels

MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"


class DSparkDpMetaProposer:
    """Mixin for ``DraftBlockProposer``."""

    _hs_stager: TwoSlotStager | None = None
    _hs_nnp_view = None

    def _hs_global_non_padded(self, nnp):
        view = self._hs_nnp_view
        if view is None or view._base is not nnp:
            view = self._hs_nnp_view = nnp.view(())
        return view

    def _fill_dp_moe_sync_metadata(self, forward_batch, batch) -> None:
        forward_batch.can_run_decode_cuda_graph = batch.can_run_decode_cuda_graph
        forward_batch.is_extend_in_batch = batch.is_extend_in_batch
        forward_batch.dp_spec_prefill_coordination_applied = (
            batch.dp_spec_prefill_coordination_applied
        )
        num_tokens = forward_batch.input_ids.numel()
        nnp = self._num_token_non_padded
        staged = self._dp_moe_sync and batch.global_num_tokens is not None
        if nnp is not None:
            if not staged:
                nnp.fill_(num_tokens)
            forward_batch.num_token_non_padded = nnp
            # Stock gives _run_forward's batch its own H2D of this same count.
            forward_batch.global_num_token_non_padded = self._hs_global_non_padded(nnp)
        forward_batch.num_token_non_padded_cpu = num_tokens
        if not staged:
            return
        if batch.dp_spec_prefill_coordination_applied:
            gnt = batch.global_num_tokens
            gnt_logprob = batch.global_num_tokens_for_logprob
        else:
            gnt, gnt_logprob = spec_scale_global_num_tokens(
                self._draft_block_spec_info,
                batch.global_num_tokens,
                batch.global_num_tokens_for_logprob,
            )
        forward_batch.original_global_num_tokens_cpu = batch.global_num_tokens
        forward_batch.global_num_token_non_padded_cpu = num_tokens
        forward_batch.global_num_tokens_cpu = gnt
        forward_batch.global_num_tokens_for_logprob_cpu = gnt_logprob
        if self._hs_stager is None:
            self._hs_stager = TwoSlotStager(rows=2, scalar=True)
        # The count reaches nnp in the same stage as the rows (no fill_ launch).
        (
            forward_batch.global_num_tokens_gpu,
            forward_batch.global_num_tokens_for_logprob_gpu,
        ) = self._hs_stager.stage(self.draft_model_runner.device, gnt, gnt_logprob,
                                  scalar_into=nnp, scalar_value=num_tokens)


def make_num_token_non_padded_hook(original, num_tokens, device):
    # The fill sets global_num_token_non_padded from the persistent count.
    return None


def _path_used(facts) -> bool:
    """The DP-MoE fill runs for DSpark drafts under attention DP."""
    return facts.is_dspark() and facts.dp_attention


SLOT = Slot(
    name="dspark_dp_meta",
    kind=SlotKind.OWNED,
    origin="sglang#47677",
    summary="DSpark draft DP-MoE counts: one persistent two-slot pinned buffer, one H2D",
    default=True,
    precheck=config_precheck(check_staging_impl),
    inert=lambda f: not_speculative(f, "only DSpark's draft stages these counts", f.is_dspark()),
    kernels=lambda facts: staging_kernels(_path_used(facts), facts.env),
    prepare=lambda facts: prepare_staging("dspark_dp_meta", _path_used(facts)),
    targets=(
        HookTarget(
            path=f"{MODULE}.DraftBlockProposer",
            kind=TargetKind.CLASS,
            mixin=DSparkDpMetaProposer,
            params={"_fill_dp_moe_sync_metadata": ("self", "forward_batch", "batch")},
            source_sha={"_fill_dp_moe_sync_metadata": "c9dd523e4b3de80b"},
        ),
        HookTarget(
            path=f"{MODULE}._make_num_token_non_padded",
            kind=TargetKind.FUNCTION,
            hook=make_num_token_non_padded_hook,
            params=("num_tokens", "device"),
            source_sha="d548057fdeed8fc7",
        ),
    ),
)
