"""Stock vs plugin drivers for DraftBlockProposer's DP-meta fill (CPU and GPU tests,
and the benchmark share them)."""

import random
from types import SimpleNamespace

import torch

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.dspark_components import dspark_draft

from sglang_hostsync_plugin import installer
from sglang_hostsync_plugin.slots import dspark_dp_meta
from sglang_hostsync_plugin.staging import TwoSlotStager

SLOT = dspark_dp_meta.SLOT.name
STOCK_MAKE_NNP = dspark_draft._make_num_token_non_padded

FIELDS = (
    "can_run_decode_cuda_graph", "is_extend_in_batch", "dp_spec_prefill_coordination_applied",
    "num_token_non_padded", "num_token_non_padded_cpu", "original_global_num_tokens_cpu",
    "global_num_token_non_padded", "global_num_token_non_padded_cpu", "global_num_tokens_cpu",
    "global_num_tokens_for_logprob_cpu", "global_num_tokens_gpu", "global_num_tokens_for_logprob_gpu",
)


class NoWaitStager(TwoSlotStager):
    """The stager with its event wait removed: the WAR stress tests must see the hazard."""

    def _wait_for_slot(self, slot):
        pass


def plugin_classes():
    """What the installer builds for the slot: the replacement class and gated hook."""
    state = installer.InstallState(active={SLOT})
    cls = installer.compose_class(state, dspark_draft.DraftBlockProposer,
                                  [(SLOT, dspark_dp_meta.DSparkDpMetaProposer)])
    make_nnp = installer._gate_function(state, SLOT, dspark_dp_meta.make_num_token_non_padded_hook)
    return state, cls, lambda n, d: make_nnp(STOCK_MAKE_NNP, n, d)


def make_proposer(cls, device, *, dp_moe_sync=True, nnp=True, per_req=4, logprob_per_req=1):
    p = cls.__new__(cls)  # the real class, without its model-loading __init__
    p.draft_model_runner = SimpleNamespace(device=device)
    p._dp_moe_sync = dp_moe_sync
    p._draft_block_spec_info = SimpleNamespace(num_tokens_per_req=per_req,
                                               num_tokens_for_logprob_per_req=logprob_per_req)
    p._num_token_non_padded = torch.empty((1,), dtype=torch.int32, device=device) if nnp else None
    return p


def make_batch(gnt, gnt_logprob, *, coordination=False, graph=True):
    b = ScheduleBatch.__new__(ScheduleBatch)
    b.can_run_decode_cuda_graph = graph
    b.is_extend_in_batch = False
    b.dp_spec_prefill_coordination_applied = coordination
    b.global_num_tokens = gnt
    b.global_num_tokens_for_logprob = gnt_logprob
    return b


def make_forward_batch(num_tokens, device, make_nnp, *, idle=False):
    ids = torch.zeros((num_tokens,), dtype=torch.int64, device=device)
    return ForwardBatch(
        forward_mode=ForwardMode.IDLE if idle else ForwardMode.TARGET_VERIFY,
        batch_size=0 if idle else max(num_tokens // 4, 1), input_ids=ids, req_pool_indices=ids,
        seq_lens=ids, out_cache_loc=ids, seq_lens_sum=0,
        # _run_forward builds its batch with its own H2D of the count; the idle
        # participation batch has none.
        global_num_token_non_padded=None if idle else make_nnp(num_tokens, device),
        global_num_token_non_padded_cpu=num_tokens,
    )


def step(proposer, batch, num_tokens, device, make_nnp, *, idle=False):
    fb = make_forward_batch(num_tokens, device, make_nnp, idle=idle)
    proposer._fill_dp_moe_sync_metadata(fb, batch)
    return fb


def snapshot(fb):
    snap = {}
    for name in FIELDS:
        v = getattr(fb, name)
        snap[name] = (str(v.dtype), tuple(v.shape), v.cpu().tolist()) if isinstance(v, torch.Tensor) else v
    return snap


def random_case(rng: random.Random):
    dp = rng.choice([1, 2, 3, 8, 16, 32])
    gnt = [rng.choice([0, 0, rng.randint(1, 64)]) for _ in range(dp)]  # idle ranks included
    gnt_logprob = [rng.randint(0, x) if x else 0 for x in gnt]
    idle = rng.random() < 0.15
    # run_idle_participation only fills under DP-MoE sync with counts present.
    return dict(
        gnt=gnt, gnt_logprob=gnt_logprob,
        coordination=rng.random() < 0.3, dp_moe_sync=idle or rng.random() < 0.85,
        no_counts=not idle and rng.random() < 0.1, nnp=rng.random() < 0.8, idle=idle,
        num_tokens=rng.choice([0, 1, 4, 4 * rng.randint(1, 64)]),
        per_req=rng.choice([1, 4, 8]), logprob_per_req=rng.choice([1, 4]),
    )


def compare_stock_and_plugin(case, nnp_flag, plugin_cls, plugin_make_nnp, device):
    """Run one case through SGLang's fill and the slot's; assert identical results."""
    nnp_flag["on"] = case["nnp"]
    snaps = []
    for cls, make_nnp in ((dspark_draft.DraftBlockProposer, STOCK_MAKE_NNP), (plugin_cls, plugin_make_nnp)):
        p = make_proposer(cls, device, dp_moe_sync=case["dp_moe_sync"], nnp=case["nnp"],
                          per_req=case["per_req"], logprob_per_req=case["logprob_per_req"])
        batch = make_batch(None if case["no_counts"] else case["gnt"],
                           None if case["no_counts"] else case["gnt_logprob"],
                           coordination=case["coordination"])
        n = 0 if case["idle"] else case["num_tokens"]
        snaps.append(snapshot(step(p, batch, n, device, make_nnp, idle=case["idle"])))
    assert snaps[0] == snaps[1], case
