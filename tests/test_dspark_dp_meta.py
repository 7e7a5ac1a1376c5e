"""dspark_dp_meta: bit-identical to SGLang 0.5.23's fill on the real DraftBlockProposer."""

import random

import pytest
import torch

from sglang_hostsync_plugin.drivers.dp_meta import (compare_stock_and_plugin, make_batch, make_proposer, plugin_classes,
                           random_case, step)
from sglang_hostsync_plugin.staging import TwoSlotStager

DEVICE = "cpu"


def _compare(case, nnp_enabled, cls, make_nnp):
    compare_stock_and_plugin(case, nnp_enabled, cls, make_nnp, DEVICE)


def test_random_inputs_bit_identical(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    rng = random.Random(47677)
    for _ in range(400):
        _compare(random_case(rng), nnp_enabled, cls, make_nnp)


@pytest.mark.parametrize("case", [
    dict(gnt=[5], gnt_logprob=[5], coordination=False),              # dp=1
    dict(gnt=[0, 0, 0, 0], gnt_logprob=[0, 0, 0, 0], coordination=False),  # all ranks idle
    dict(gnt=[6, 18, 0, 12], gnt_logprob=[1, 3, 0, 2], coordination=False),  # scaled counts
    dict(gnt=[6, 18, 0, 12], gnt_logprob=[1, 3, 0, 2], coordination=True),   # coordination-applied
])
@pytest.mark.parametrize("idle", [False, True])
def test_edge_cases_bit_identical(case, idle, nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    full = dict(case, dp_moe_sync=True, no_counts=False, nnp=True, idle=idle, num_tokens=0 if idle else 8,
                per_req=4, logprob_per_req=1)
    _compare(full, nnp_enabled, cls, make_nnp)


def test_seed_review_rows_differ_and_three_fills_reuse_storage(nnp_enabled):
    """#47677 review: differing rows, both device tensors asserted; three fills on one
    proposer, each holding its own counts, the third reusing the first's storage."""
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEVICE, per_req=1, logprob_per_req=1)
    counts = [([6, 18, 0, 12], [1, 3, 0, 2]), ([7, 1, 2, 0], [2, 0, 1, 0]), ([0, 9, 9, 3], [0, 4, 5, 1])]
    fbs = []
    for gnt, lp in counts:
        fb = step(p, make_batch(gnt, lp, coordination=True), 8, DEVICE, make_nnp)
        assert fb.global_num_tokens_gpu.tolist() == gnt
        assert fb.global_num_tokens_for_logprob_gpu.tolist() == lp
        fbs.append(fb)
    assert fbs[2].global_num_tokens_gpu.data_ptr() == fbs[0].global_num_tokens_gpu.data_ptr()
    assert fbs[2].global_num_tokens_for_logprob_gpu.data_ptr() == fbs[0].global_num_tokens_for_logprob_gpu.data_ptr()
    assert fbs[1].global_num_tokens_gpu.data_ptr() != fbs[0].global_num_tokens_gpu.data_ptr()
    assert fbs[1].global_num_tokens_gpu.tolist() == counts[1][0]  # the other slot is untouched
    assert p._hs_stager.allocations == 1


def test_no_allocation_after_first_fill_and_realloc_on_dp_change(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEVICE, per_req=2)
    rng = random.Random(0)
    ptrs = set()
    for _ in range(200):
        gnt = [rng.randint(0, 9) for _ in range(8)]
        fb = step(p, make_batch(gnt, gnt), 8, DEVICE, make_nnp)
        assert fb.global_num_tokens_gpu.tolist() == [2 * x for x in gnt]
        ptrs.add(fb.global_num_tokens_gpu.data_ptr())
        assert fb.global_num_token_non_padded.data_ptr() == p._num_token_non_padded.data_ptr()
    assert len(ptrs) == 2 and p._hs_stager.allocations == 1
    fb = step(p, make_batch([1, 2, 3], [1, 1, 1]), 8, DEVICE, make_nnp)  # dp changed 8 -> 3
    assert fb.global_num_tokens_gpu.tolist() == [2, 4, 6] and p._hs_stager.allocations == 2


def test_gate_off_is_stock(nnp_enabled):
    state, cls, make_nnp = plugin_classes()
    state.active.clear()
    p = make_proposer(cls, DEVICE)
    fb = step(p, make_batch([1, 2], [1, 2]), 8, DEVICE, make_nnp)
    assert p._hs_stager is None and fb.global_num_token_non_padded is not p._num_token_non_padded
    assert make_nnp(8, DEVICE).tolist() == 8  # the stock H2D path again


def test_stager_alternates_two_slots_and_reuses_them():
    s = TwoSlotStager(rows=2)
    a, b = s.stage("cpu", [1, 2, 3], [4, 5, 6])
    assert a.tolist() == [1, 2, 3] and b.tolist() == [4, 5, 6] and a.dtype == torch.int64
    c, _ = s.stage("cpu", [7, 8, 9], [0, 0, 0])
    assert a.tolist() == [1, 2, 3] and c.tolist() == [7, 8, 9]  # two slots
    assert s.stage("cpu", [5, 5, 5], [6, 6, 6])[0].data_ptr() == a.data_ptr()
