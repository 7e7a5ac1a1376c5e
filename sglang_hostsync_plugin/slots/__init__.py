"""Built-in slots: one module per slot (the upstream switches and built-ins, which
are data plus one check each, one module per family); this module is their pluggy
plugin.

The owned slots' modules import SGLang at their top, so each is imported on its own:
one that fails to import (an upstream rename) becomes a stand-in slot of the same
name that is refused with the import error, and every other slot is unaffected."""

from __future__ import annotations

import importlib
import logging

from ..hookspecs import hookimpl
from ..slot import Slot, SlotKind
from . import audit, audit_block, audit_fine, audit_ngram, upstream_builtins, upstream_host_plans, upstream_switches

logger = logging.getLogger("sglang.srt.plugins.hostsync")

# (module, slot name, default): the catalogue order of the owned slots.
OWNED = (
    ("dspark_dp_meta", "dspark_dp_meta", True),
    ("target_dp_meta", "target_dp_meta", True),
    ("eagle_fixed_shape_tail", "eagle_fixed_shape_tail", True),
    ("draft_input_reuse", "draft_input_reuse", True),
    ("event_ring", "event_ring", True),
    ("pinned_d2h_ring", "pinned_d2h_ring", False),
    ("accept_lens_snapshot", "accept_lens_snapshot", True),
    ("flashinfer_plan_guard", "flashinfer_plan_guard", True),
    ("flashinfer_tree_verify_plan", "flashinfer_tree_verify_plan", True),
    ("flashinfer_device_plan", "flashinfer_device_plan", False),
    ("flashinfer_prefill_host_indptr", "flashinfer_prefill_host_indptr", False),
    ("ngram_accept_readback", "ngram_accept_readback", True),
    ("draft_extend_glue_graph", "draft_extend_glue_graph", False),
    ("draft_decode_glue_graph", "draft_decode_glue_graph", False),
    ("fused_tree_compact", "fused_tree_compact", False),
    ("fused_draft_page_locs", "fused_draft_page_locs", False),
    ("greedy_row_argmax", "greedy_row_argmax", False),
    ("ngram_full_mask", "ngram_full_mask", False),
    ("ngram_late_wait", "ngram_late_wait", False),
    ("draft_extend_fused_layout", "draft_extend_fused_layout", False),
    ("fused_relay_stash", "fused_relay_stash", False),
    ("draft_extend_topk_graph", "draft_extend_topk_graph", False),
    ("small_copy_launch", "small_copy_launch", False),
    ("draft_vocab_topk", "draft_vocab_topk", False),
    ("triton_replay_launch", "triton_replay_launch", False),
    ("spec_kernel_replay", "spec_kernel_replay", False),
    ("mamba_verdict_once", "mamba_verdict_once", False),
    ("isolation_snapshot", "isolation_snapshot", False),
    ("decode_lens_lazy_h2d", "decode_lens_lazy_h2d", False),
    ("chain_tree_full_mask", "chain_tree_full_mask", False),
    ("eagle_step_graph", "eagle_step_graph", False),
)
# Declared after the upstream switches: of two slots that must not run together, ``all`` keeps the one
# declared first, so it keeps the switches and slots these step paths replace.
OWNED_LATE = (
    ("ngram_device_draft", "ngram_device_draft", False),
    ("dflash_step_graph", "dflash_step_graph", False),
    ("dspark_step_graph", "dspark_step_graph", False),
)


def _owned(module: str, name: str, default: bool) -> Slot:
    try:
        return importlib.import_module(f"{__name__}.{module}").SLOT
    except Exception as exc:  # noqa: BLE001 (any import-time failure refuses this slot only)
        reason = f"slot module did not import: {type(exc).__name__}: {exc}"
        logger.error("hostsync: %s: %s", name, reason)
        return Slot(name=name, kind=SlotKind.OWNED, origin="hostsync", summary="(its module did not import)",
                    default=default, precheck=lambda: reason)


@hookimpl
def hostsync_slots():
    return [
        *(_owned(*entry) for entry in OWNED),
        *upstream_switches.SLOTS, *upstream_host_plans.SLOTS, *upstream_builtins.SLOTS,
        *(_owned(*entry) for entry in OWNED_LATE),
        audit.SLOT, audit_fine.SLOT, audit_block.SLOT, audit_ngram.SLOT,
    ]
