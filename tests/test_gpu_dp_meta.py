"""dspark_dp_meta on a CUDA device: identical values, no syncs, and the WAR guard.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang_hostsync_plugin.drivers.dp_meta import (NoWaitStager, compare_stock_and_plugin, make_batch, make_forward_batch, make_proposer,
                           plugin_classes, random_case)
from sglang_hostsync_plugin.staging import TwoSlotStager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def test_gpu_random_inputs_bit_identical(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    rng = random.Random(31468)
    for _ in range(300):
        compare_stock_and_plugin(random_case(rng), nnp_enabled, cls, make_nnp, DEV)


def test_gpu_no_sync_and_no_allocation_in_steady_state(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEV)
    rng = random.Random(1)
    batches = [make_batch([rng.randint(0, 64) for _ in range(16)], [rng.randint(0, 8) for _ in range(16)])
               for _ in range(1000)]
    fbs = [make_forward_batch(32, DEV, make_nnp) for _ in range(1010)]
    for i in range(10):  # warm-up: allocates the stager once
        p._fill_dp_moe_sync_metadata(fbs[1000 + i], batches[i])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for fb, b in zip(fbs, batches):
            p._fill_dp_moe_sync_metadata(fb, b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert p._hs_stager.allocations == 1
    assert fbs[-11].global_num_tokens_gpu.tolist() == [4 * x for x in batches[-1].global_num_tokens]


def _war_stress(stager_cls, fills=10_000, dp=8, sleep_cycles=200_000):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEV, per_req=1, logprob_per_req=1)
    p._hs_stager = stager_cls(rows=2)
    rng = random.Random(7)
    expected = torch.empty((fills, 2, dp), dtype=torch.int64)
    seen = torch.empty((fills, 2, dp), dtype=torch.int64, device=DEV)
    fb = make_forward_batch(8, DEV, make_nnp)
    for i in range(fills):
        gnt = [rng.randint(0, 1 << 20) for _ in range(dp)]
        lp = [rng.randint(0, 1 << 20) for _ in range(dp)]
        expected[i, 0] = torch.tensor(gnt)
        expected[i, 1] = torch.tensor(lp)
        torch.cuda._sleep(sleep_cycles)  # ~100 us: slower than the host's fill, which runs ahead
        p._fill_dp_moe_sync_metadata(fb, make_batch(gnt, lp, coordination=True))
        seen[i, 0].copy_(fb.global_num_tokens_gpu)  # the delayed device reader
        seen[i, 1].copy_(fb.global_num_tokens_for_logprob_gpu)
    torch.cuda.synchronize()
    mismatches = int((seen.cpu() != expected).any(dim=(1, 2)).sum())
    return mismatches, p._hs_stager.blocking_waits


def test_gpu_war_stress_zero_mismatches():
    mismatches, waits = _war_stress(TwoSlotStager)
    print(f"WAR stress with event guard: mismatches={mismatches} blocking_waits={waits}")
    assert mismatches == 0
    assert waits > 0, "the device never lagged: the stress did not exercise the guard"


def test_gpu_war_stress_detects_hazard_without_the_wait():
    mismatches, _ = _war_stress(NoWaitStager)
    print(f"WAR stress without event guard: mismatches={mismatches}")
    assert mismatches > 0, "the stress test cannot see the hazard it guards against"
