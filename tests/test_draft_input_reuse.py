"""draft_input_reuse on the CPU: same values as stock SGLang, no per-step allocation."""

import torch

from hostsync_drivers import CallCounter
from hostsync_drivers.draft_input import fresh_ring, new_input, plugin_class, run_steps
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang_hostsync_plugin.slots import draft_input_reuse as dir_slot


def test_values_identical_to_stock_over_random_batches(monkeypatch):
    for seed in range(6):
        stock = run_steps(DFlashDraftInputV2, 60, "cpu", monkeypatch, seed=seed, keep_views=True)
        fresh_ring(monkeypatch)
        plugin = run_steps(plugin_class(), 60, "cpu", monkeypatch, seed=seed, keep_views=True)
        assert plugin == stock, seed


def test_no_allocation_after_warm_up(monkeypatch):
    ring = fresh_ring(monkeypatch)
    calls = CallCounter(monkeypatch, torch, "empty")
    # Batch sizes stay <= 32 (SGLang's minimum capacity): every set is made once.
    stock_steps = run_steps(DFlashDraftInputV2, 3, "cpu", monkeypatch, seed=1, max_bs=32)
    stock_calls = calls.n
    calls.n = 0
    run_steps(plugin_class(), 3, "cpu", monkeypatch, seed=1, max_bs=32)  # warm-up: the ring's 3 sets
    assert ring.allocations == 3
    calls.n = 0
    run_steps(plugin_class(), 50, "cpu", monkeypatch, seed=1, max_bs=32)
    made_per_step_by_make_draft_input = 3  # make_draft_input_v2's own empties (unchanged)
    assert calls.n == 50 * made_per_step_by_make_draft_input
    assert ring.allocations == 3
    # Stock makes the 5 prepare buffers on every step, on top of make_draft_input_v2's 3.
    assert stock_calls == 3 * (made_per_step_by_make_draft_input + 5) and len(stock_steps) == 3


def test_ring_grows_like_sglang_and_follows_device_changes():
    ring = dir_slot.PrepareBufferRing(depth=1)
    a = ring.acquire(5, "cpu")
    assert a.capacity == 32 and ring.allocations == 1
    assert ring.acquire(32, "cpu") is a
    b = ring.acquire(33, "cpu")
    assert b.capacity == 64 and ring.allocations == 2
    c = ring.acquire(10, "meta")
    assert c.device == "meta" and ring.allocations == 3


def test_gate_off_is_stock(monkeypatch):
    ring = fresh_ring(monkeypatch)
    stock = run_steps(DFlashDraftInputV2, 20, "cpu", monkeypatch, seed=3)
    off = run_steps(plugin_class(active=False), 20, "cpu", monkeypatch, seed=3)
    assert off == stock and ring.allocations == 0


def test_idle_and_empty_batches(monkeypatch):
    fresh_ring(monkeypatch)
    cls = plugin_class()
    info = new_input(cls, 0, "cpu", monkeypatch)
    from hostsync_drivers.draft_input import make_batch
    info.prepare_for_decode(make_batch([], "cpu", 4))  # bs == 0 returns before any buffer
    assert dir_slot.ring().allocations == 0 and info._hs_pending is None
    assert isinstance(cls.create_idle_input("cpu"), DFlashDraftInputV2)
