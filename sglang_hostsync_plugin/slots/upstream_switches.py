"""The #45450 switches: SGLang 0.5.23 ships them, every one off by default.

Each slot turns on exactly one of SGLang's own env flags (mechanism in
``sglang_hostsync_plugin.switches``); none is in ``default``. The preset
``dspark_mega`` selects all 17, the configuration of #45450's speed row 5.
Dependencies and inert conditions below were read from SGLang 0.5.23; each
cites the function that creates it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..slot import ServingFacts, Slot, SlotKind
from ..switches import env_value, flag_precheck

ORIGIN = "sglang#45450"
PRESET = "dspark_mega"
# The slots that cut EAGLE-family host work between graphs, one A/B handle:
# ``SGLANG_HOSTSYNC_SLOTS=default,eagle_host`` (its real-server figures: README, docs/results.md).
HOST_PRESET = "eagle_host"
# NGRAM's host-work slots (ngram_full_mask, ngram_late_wait), one A/B handle:
# ``SGLANG_HOSTSYNC_SLOTS=default,eagle_host,ngram_host`` (its real-server figures: README, docs/results.md).
# Here, not in ngram_full_mask, so that the doctor imports it without torch or triton.
NGRAM_PRESET = "ngram_host"

Inert = Callable[[ServingFacts], "str | None"]


def _dspark_only(f: ServingFacts) -> str | None:
    # Read only by DSpark code (DSparkWorkerV2 and the runners' is_dspark() branches).
    if f.is_dspark():
        return None
    return f"inert because --speculative-algorithm is {f.speculative_algorithm or 'unset'}; only DSpark reads it"


def _no_attention_dp(f: ServingFacts) -> str | None:
    return "inert because attention DP is on" if f.dp_attention else None


def _no_tbo(f: ServingFacts) -> str | None:
    return "inert because two-batch overlap is on" if f.two_batch_overlap else None


def _simulated_acceptance(f: ServingFacts) -> str | None:
    # sim_draw_ahead_enabled (dspark_worker_v2): only with a simulated correct length.
    if env_value("SGLANG_SIMULATE_ACC_LEN", f.env) > 0:
        return None
    return "inert because SGLANG_SIMULATE_ACC_LEN is not > 0 (simulated acceptance only)"


def _accept_tail_not_broadcast(f: ServingFacts) -> str | None:
    # DsparkVerifyEpilogue.__init__: the fused tail cannot run the accept-site TP
    # broadcast; SpecTpSync keeps no site at tp=1.
    from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite, parse_spec_tp_sync

    if f.tp_size <= 1 or env_value("SGLANG_DSPARK_SIMULATE_FOLD", f.env):
        return None
    sites = parse_spec_tp_sync(env_value("SGLANG_SPEC_TP_SYNC", f.env))
    if SpecTpSyncSite.DSPARK_ACCEPT_GRAPH in sites:
        return (
            "inert because SGLANG_SPEC_TP_SYNC selects the dspark-accept-graph broadcast "
            "at tp>1 without SGLANG_DSPARK_SIMULATE_FOLD"
        )
    return None


def _all(*checks: Inert) -> Inert:
    def inert(f: ServingFacts) -> str | None:
        for check in checks:
            reason = check(f)
            if reason:
                return reason
        return None

    return inert


def _switch(name, flag, summary, inert=None, requires=(), presets=()) -> Slot:
    return Slot(
        name=name,
        kind=SlotKind.UPSTREAM_SWITCH,
        origin=ORIGIN,
        summary=summary,
        default=False,
        requires=tuple(requires),
        precheck=lambda: flag_precheck(flag),
        env_flag=flag,
        inert=inert,
        presets=(PRESET, *presets),
    )


SLOTS = (
    _switch(
        "fused_accept_tail", "SGLANG_DSPARK_FUSED_ACCEPT_TAIL",
        "static greedy accept and its bookkeeping in one kernel",
        inert=_all(_dspark_only, _accept_tail_not_broadcast),
    ),
    _switch(
        "prepare_inputs_once", "SGLANG_OPT_DSV41_DSPARK_PREPARE_INPUTS_ONCE",
        "verify window, cache locs and draft anchor column in one launch",
        inert=_dspark_only,
    ),
    _switch(
        "mid_fold", "SGLANG_OPT_DSV41_DSPARK_MID_FOLD",
        "verify ids written by the draft graph tail (no eager concat)",
        inert=_dspark_only,
    ),
    _switch(
        "defer_context_kv", "SGLANG_DSPARK_DEFER_CONTEXT_KV",
        "static verify's draft context-KV commit moves into the next draft graph",
        # DSparkWorkerV2._defer_context_kv_eligible refuses it under attention DP.
        inert=_all(_dspark_only, _no_attention_dp),
    ),
    _switch(
        "fill_fast_path", "SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH",
        "CUDA graph replay fill: skip unpadded padding reset, one foreach copy",
        presets=(HOST_PRESET,),
    ),
    _switch(
        "target_verify_metadata_glue", "SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE",
        "target verify metadata prep through the glue graph",
        inert=_dspark_only,
    ),
    _switch(
        "post_forward_graph", "SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH",
        "engram history commit and block accept lengths inside the verify graph",
        inert=_dspark_only,
    ),
    _switch(
        "draft_prep_fork", "SGLANG_OPT_DSV41_DSPARK_DRAFT_PREP_FORK",
        "draft graph metadata prep on a side stream",
        # DecodeCudaGraphRunner._forks_draft_metadata_prep: no attention DP, no TBO.
        inert=_all(_dspark_only, _no_attention_dp, _no_tbo),
    ),
    _switch(
        "post_fold", "SGLANG_OPT_DSV41_DSPARK_POST_FOLD",
        "seq lens and bonus relayed from the verify graph",
        # DSparkWorkerV2.__init__: post_fold needs static_epilogue_supported (no attention DP).
        inert=_all(_dspark_only, _no_attention_dp),
    ),
    _switch(
        "one_launch_commit_stage", "SGLANG_OPT_DSV41_DSPARK_ONE_LAUNCH_COMMIT_STAGE",
        "deferred commit's staging in one Triton launch",
        # Read in DeferredContextCommit.__init__, built only by
        # DSparkWorkerV2._maybe_build_deferred_commit under SGLANG_DSPARK_DEFER_CONTEXT_KV.
        requires=("defer_context_kv",),
        inert=_all(_dspark_only, _no_attention_dp),
    ),
    _switch(
        "target_metadata_early", "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY",
        "target verify metadata built beside the draft graph",
        # DecodeCudaGraphRunner.__init__ builds EarlyVerifyMetadata only with
        # _target_metadata_glue (SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE).
        requires=("target_verify_metadata_glue",),
        # DecodeCudaGraphRunner._wants_early_verify_metadata: no attention DP, no TBO.
        inert=_all(_dspark_only, _no_attention_dp, _no_tbo),
    ),
    _switch(
        "skip_prefilled_inputs", "SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS",
        "pre-planned verify replay skips its input re-copies",
        inert=_dspark_only,
    ),
    _switch(
        "skip_glued_replay_view", "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW",
        "replays with a captured metadata glue graph skip the ForwardBatch view",
        presets=(HOST_PRESET,),
    ),
    _switch(
        "sim_draw_ahead", "SGLANG_OPT_DSV41_DSPARK_SIM_DRAW_AHEAD",
        "simulated acceptance drawn before the draft launch",
        inert=_all(_dspark_only, _simulated_acceptance),
    ),
    _switch(
        "blockwise_rejection", "SGLANG_OPT_DSV41_BLOCKWISE_REJECTION",
        "block-wise rejection sampling for the sampled verify accept",
        inert=_dspark_only,
    ),
    _switch(
        "sampling_accept_graph", "SGLANG_OPT_DSV41_SAMPLING_ACCEPT_GRAPH",
        "static verify's temperature-sampling accept as one CUDA graph",
        # DSparkWorkerV2.__init__: needs static_epilogue_supported (no attention DP).
        inert=_all(_dspark_only, _no_attention_dp),
    ),
    _switch(
        "mxfp4_finalized_shape", "SGLANG_OPT_MXFP4_DEFERRED_FINALIZED_SHAPE",
        "MXFP4 trtllm-gen MoE: finalized output shape on deferred-finalize calls",
    ),
)
