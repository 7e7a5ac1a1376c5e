"""target_dp_meta on a CUDA device: identical values, no syncs, and the WAR guard on
the reused pinned slots. Skipped without CUDA (CI); run on the H200 by
scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang.srt.model_executor import forward_batch_info
from hostsync_drivers.dp_meta import NoWaitStager
from hostsync_drivers.target_dp_meta import (
    fill, make_decode_batch, make_forward_batch, make_model_runner, make_schedule_batch, prepare, prepare_snapshot,
    snapshot, stand_in_parallel_state,
)
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


def test_gpu_random_inputs_bit_identical(staging_impl):
    rng = random.Random(47677)
    for _ in range(300):
        dp = rng.choice([1, 2, 8, 16, 32])
        batch = make_schedule_batch([rng.choice([0, rng.randint(1, 4096)]) for _ in range(dp)],
                                    [rng.randint(0, 64) for _ in range(dp)], coordination=rng.random() < 0.5)
        num_tokens = rng.randint(0, 64)
        stock = snapshot(fill("stock", make_forward_batch(num_tokens, DEV), batch, DEV))
        plugin = snapshot(fill("plugin", make_forward_batch(num_tokens, DEV), batch, DEV))
        assert plugin == stock


def test_gpu_no_sync_in_steady_state(staging_impl):
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
    counts, non_padded, _ = tdm.stagers()
    assert counts.allocations == 1 and non_padded.allocations == 1
    assert counts.impl == non_padded.impl == staging_impl
    assert fbs[999].global_num_tokens_gpu.tolist() == batches[-1].global_num_tokens


def _war_stress(stager_cls, impl, fills=10_000, dp=8, sleep_cycles=400_000):
    """The device runs behind the host (a sleep before each fill's H2D); every fill's
    device tensors are checked at the end against the counts it was given."""
    tdm._counts = stager_cls(rows=2, fresh_device=True, impl=impl)
    tdm._non_padded = stager_cls(rows=1, dtype=torch.int32, fresh_device=True, impl=impl)
    rng = random.Random(7)
    counts = [([rng.randint(0, 1 << 20) for _ in range(dp)], [rng.randint(0, 1 << 20) for _ in range(dp)])
              for _ in range(fills)]
    batches = [make_schedule_batch(gnt, lp) for gnt, lp in counts]
    fbs = [make_forward_batch(8, DEV) for _ in range(fills)]
    for fb, batch in zip(fbs, batches):
        torch.cuda._sleep(sleep_cycles)  # ~200 us of device work per fill: the host runs ahead
        fill("plugin", fb, batch, DEV)
    torch.cuda.synchronize()
    got = torch.stack([torch.stack((fb.global_num_tokens_gpu, fb.global_num_tokens_for_logprob_gpu)) for fb in fbs])
    mismatches = int((got.cpu() != torch.tensor(counts, dtype=torch.int64)).any(dim=(1, 2)).sum())
    # Each fill stages num_token_non_padded first: that stager's wait usually absorbs the lag.
    return mismatches, tdm._counts.blocking_waits + tdm._non_padded.blocking_waits


def test_gpu_war_stress_zero_mismatches(staging_impl):
    mismatches, waits = _war_stress(TwoSlotStager, staging_impl)
    print(f"target_dp_meta WAR stress ({staging_impl}) with event guard: mismatches={mismatches} blocking_waits={waits}")
    assert mismatches == 0
    assert waits > 0, "the device never lagged: the stress did not exercise the guard"


def test_gpu_war_stress_detects_hazard_without_the_wait(staging_impl):
    mismatches, _ = _war_stress(NoWaitStager, staging_impl)
    print(f"target_dp_meta WAR stress ({staging_impl}) without event guard: mismatches={mismatches}")
    assert mismatches > 0, "the stress test cannot see the hazard it guards against"


def test_gpu_prepare_mlp_sync_batch_bit_identical_and_no_added_sync(monkeypatch, staging_impl):
    """The eager path's padded-count H2D: values as stock on random cases; over 200
    prepares the plugin issues no sync that stock does not (sync-debug "warn" counts)."""
    import warnings

    model_runner = make_model_runner()
    rng = random.Random(1948)
    for _ in range(100):
        dp = rng.choice([1, 2, 8])
        rank = rng.randrange(dp)
        bs = rng.randint(0, 8)
        counts = [rng.choice([0, rng.randint(1, 12)]) for _ in range(dp)]
        counts[rank] = bs
        stand_in_parallel_state(monkeypatch, DEV, padding=rng.choice(["max_len", "sum_len"]), dp_rank=rank)
        stock = prepare_snapshot(prepare("stock", make_decode_batch(bs, DEV, counts), model_runner))
        plugin = prepare_snapshot(prepare("plugin", make_decode_batch(bs, DEV, counts), model_runner))
        assert plugin == stock
    assert tdm.stagers()[2].impl == staging_impl
    stand_in_parallel_state(monkeypatch, DEV)  # rank 0 of the [4, 6] batches below
    syncs = {}
    for arm in ("stock", "plugin"):
        fbs = [make_decode_batch(4, DEV, [4, 6]) for _ in range(200)]
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for fb in fbs:
                    prepare(arm, fb, model_runner)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs[arm] = sum("synchroniz" in str(w.message) for w in caught)
    print(f"prepare_mlp_sync_batch syncs over 200 eager prepares ({staging_impl}): {syncs}")
    assert syncs["plugin"] <= syncs["stock"]
