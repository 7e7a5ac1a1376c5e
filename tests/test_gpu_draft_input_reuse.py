"""draft_input_reuse on a CUDA device: stock values, and the WAR guard under a
delayed device. Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers.draft_input import BLOCK, Recorder, fresh_ring, make_batch, make_req, new_input, plugin_class, run_steps
from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import dflash_info_v2
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang_hostsync_plugin.slots import draft_input_reuse as dir_slot

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def test_gpu_values_identical_to_stock(monkeypatch):
    for seed in range(4):
        stock = run_steps(DFlashDraftInputV2, 80, DEV, monkeypatch, seed=seed, keep_views=True)
        fresh_ring(monkeypatch)
        plugin = run_steps(plugin_class(), 80, DEV, monkeypatch, seed=seed, keep_views=True)
        assert plugin == stock, seed


def war_stress(monkeypatch, wait: bool, steps: int = 1500, page_size: int = 4):
    """The device runs ~2 ms behind per step (more than a host step takes), so the host
    comes back to a buffer set while its H2D is still queued. Returns (mismatched
    steps, blocking waits, buffer sets made)."""
    ring = fresh_ring(monkeypatch)
    ring.wait_enabled = wait
    recorder = Recorder(DEV, slots=steps)
    monkeypatch.setattr(dflash_info_v2, "alloc_for_spec_decode", recorder)
    cls = plugin_class()
    rng = random.Random(11)
    expected = []
    with get_context().override_server_args(speculative_num_draft_tokens=BLOCK):
        for _ in range(steps):
            reqs = [make_req(rng, page_size) for _ in range(rng.randint(1, 32))]
            cur, nxt, _ = page_aligned_decode_alloc_lens(reqs, reserve=2 * BLOCK, page_size=page_size)
            expected.append((cur, nxt))
            torch.cuda._sleep(4_000_000)
            new_input(cls, len(reqs), DEV, monkeypatch).prepare_for_decode(make_batch(reqs, DEV, page_size))
    torch.cuda.synchronize()
    rows = recorder.device_rows.cpu()
    bad = sum(
        rows[i, 0, :len(c)].tolist() != c or rows[i, 1, :len(n)].tolist() != n
        for i, (c, n) in enumerate(expected)
    )
    return bad, ring.blocking_waits, ring.allocations


def test_gpu_war_stress_guarded_and_unguarded(monkeypatch):
    bad, waits, allocs = war_stress(monkeypatch, wait=True)
    print(f"draft_input_reuse WAR stress, guarded: {bad} mismatched steps of 1500, "
          f"{waits} blocking waits, {allocs} buffer sets")
    assert bad == 0 and waits > 0 and allocs == dir_slot.DEPTH
    bad_unguarded, _, _ = war_stress(monkeypatch, wait=False)
    print(f"draft_input_reuse WAR stress, event wait removed: {bad_unguarded} mismatched steps of 1500")
    assert bad_unguarded > 0  # the test can fail: without the wait the hazard shows
