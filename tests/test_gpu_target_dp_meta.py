"""target_dp_meta on a CUDA device: identical values, no syncs, and the WAR guard on
the reused pinned slots. Skipped without CUDA (CI); run on the H200 by
scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang.srt.model_executor import forward_batch_info
from sglang_hostsync_plugin.drivers.dp_meta import NoWaitStager
from sglang_hostsync_plugin.drivers.target_dp_meta import fill, make_forward_batch, make_schedule_batch, snapshot
from sglang_hostsync_plugin.slots import target_dp_meta as tdm
from sglang_hostsync_plugin.staging import TwoSlotStager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


@pytest.fixture(autouse=True)
def setup(monkeypatch):
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: True)
    tdm.reset()
    yield
    tdm.reset()


def test_gpu_random_inputs_bit_identical():
    rng = random.Random(47677)
    for _ in range(300):
        dp = rng.choice([1, 2, 8, 16, 32])
        batch = make_schedule_batch([rng.choice([0, rng.randint(1, 4096)]) for _ in range(dp)],
                                    [rng.randint(0, 64) for _ in range(dp)], coordination=rng.random() < 0.5)
        num_tokens = rng.randint(0, 64)
        stock = snapshot(fill("stock", make_forward_batch(num_tokens, DEV), batch, DEV))
        plugin = snapshot(fill("plugin", make_forward_batch(num_tokens, DEV), batch, DEV))
        assert plugin == stock


def test_gpu_no_sync_in_steady_state():
    rng = random.Random(1)
    batches = [make_schedule_batch([rng.randint(0, 64) for _ in range(16)], [rng.randint(0, 8) for _ in range(16)])
               for _ in range(1000)]
    fbs = [make_forward_batch(32, DEV) for _ in range(1010)]
    for i in range(10):  # warm-up: the stagers allocate once
        fill("plugin", fbs[1000 + i], batches[i], DEV)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for fb, b in zip(fbs, batches):
            fill("plugin", fb, b, DEV)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    counts, non_padded = tdm.stagers()
    assert counts.allocations == 1 and non_padded.allocations == 1
    assert fbs[999].global_num_tokens_gpu.tolist() == batches[-1].global_num_tokens


def _war_stress(stager_cls, fills=10_000, dp=8, sleep_cycles=200_000):
    """The device runs behind the host (a sleep before each fill's H2D); every fill's
    device tensors are checked at the end against the counts it was given."""
    tdm._counts = stager_cls(rows=2, fresh_device=True)
    tdm._non_padded = stager_cls(rows=1, dtype=torch.int32, fresh_device=True)
    rng = random.Random(7)
    expected, got = [], []
    for _ in range(fills):
        gnt = [rng.randint(0, 1 << 20) for _ in range(dp)]
        lp = [rng.randint(0, 1 << 20) for _ in range(dp)]
        torch.cuda._sleep(sleep_cycles)
        fb = fill("plugin", make_forward_batch(8, DEV), make_schedule_batch(gnt, lp), DEV)
        expected.append((gnt, lp))
        got.append((fb.global_num_tokens_gpu, fb.global_num_tokens_for_logprob_gpu))
    torch.cuda.synchronize()
    mismatches = sum(a.tolist() != e[0] or b.tolist() != e[1] for (a, b), e in zip(got, expected))
    return mismatches, tdm._counts.blocking_waits


def test_gpu_war_stress_zero_mismatches():
    mismatches, waits = _war_stress(TwoSlotStager)
    print(f"target_dp_meta WAR stress with event guard: mismatches={mismatches} blocking_waits={waits}")
    assert mismatches == 0
    assert waits > 0, "the device never lagged: the stress did not exercise the guard"


def test_gpu_war_stress_detects_hazard_without_the_wait():
    mismatches, _ = _war_stress(NoWaitStager)
    print(f"target_dp_meta WAR stress without event guard: mismatches={mismatches}")
    assert mismatches > 0, "the stress test cannot see the hazard it guards against"
