"""event_ring, accept_lens_snapshot and pinned_d2h_ring on a CUDA device.
Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import pytest
import torch

from hostsync_drivers import accept_lens, event_ring as er_driver, pinned_d2h
from hostsync_drivers import Patcher, count_pinned_allocations
from sglang_hostsync_plugin.slots import accept_lens_snapshot as als
from sglang_hostsync_plugin.slots import event_ring
from sglang_hostsync_plugin.slots import pinned_d2h_ring as pdr

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"
STEP_CYCLES = 2_000_000  # ~1 ms of GPU time per simulated step


class SleepingDevice(er_driver.CountingDevice):
    """Each step keeps the GPU busy, so the host runs ahead of it."""

    def begin_step(self, n):
        torch.cuda._sleep(STEP_CYCLES)


def _event_loop(plugin, steps, **depths):
    device = SleepingDevice()
    loop = er_driver.Loop(device, plugin=plugin, device=DEV, **depths)
    loop.run(5)
    warm = device.constructed
    loop.run(steps, start=5)
    loop.drain()
    torch.cuda.synchronize()
    return device.constructed - warm, loop


def test_gpu_event_ring_constructs_nothing_per_step():
    stock, _ = _event_loop(False, 300)
    plugin, loop = _event_loop(True, 300)
    print(f"\nEvent() constructions over 300 steps: stock {stock}, plugin {plugin}")
    assert stock == 3 * 300
    assert plugin == 0
    assert loop.waited_published == 305


def test_gpu_read_done_depth():
    _, shallow = _event_loop(True, 100, read_done_depth=1)
    _, chosen = _event_loop(True, 100)
    target_shallow = event_ring._read_done_rings[shallow.target].premature
    target_chosen = event_ring._read_done_rings[chosen.target].premature
    print(f"\nread_done still unfired when it came round: depth 1 {target_shallow}/105, depth 2 {target_chosen}/105")
    assert target_shallow > 50 and target_chosen == 0


def test_gpu_copy_done_depth():
    _, shallow = _event_loop(True, 100, copy_done_depth=1)
    _, chosen = _event_loop(True, 100)
    def too_shallow(loop):  # a new event made, or a waiter left to block on a later record
        return loop.sched.device_module.hs_ring.premature + loop.rerecorded

    a, b = too_shallow(shallow), too_shallow(chosen)
    print(f"\ncopy_done still pending or re-recorded before its result was processed: "
          f"depth 1 {a}/105 (re-recorded {shallow.rerecorded}), depth 3 {b}/105")
    assert a > 50 and b == 0


def _accept_lens_run(plugin, steps, copy_delay, seed=0, ring_events=False):
    patcher = Patcher()
    ring = als.SnapshotRing()
    if plugin:
        accept_lens.install(patcher, ring)
    factory = event_ring.EventRing(torch.cuda.Event, event_ring.COPY_DONE_DEPTH).acquire if ring_events else None
    try:
        loop = accept_lens.Loop(DEV, copy_delay_cycles=copy_delay, replay_delay_cycles=STEP_CYCLES // 4,
                                event_factory=factory)
        for values, expected in accept_lens.random_steps(steps, seed, DEV):
            loop.step(values, expected)
        loop.drain()
    finally:
        patcher.undo()
    return loop, ring


@pytest.mark.parametrize("ring_events", [False, True], ids=["plain-copy_done", "event_ring-copy_done"])
def test_gpu_block_accept_lens_hazard_on_stock_fixed_by_snapshot(ring_events):
    # The D2H on copy_stream is delayed (a sleep queued there first); the host runs ahead
    # and the next step's replay rewrites the graph buffer before the copy reads it.
    stock, _ = _accept_lens_run(False, 300, copy_delay=STEP_CYCLES)
    plugin, ring = _accept_lens_run(True, 300, copy_delay=STEP_CYCLES, ring_events=ring_events)
    print(f"\nblock_accept_lens readback mismatches: stock {stock.mismatches}/{stock.checked}, "
          f"plugin {plugin.mismatches}/{plugin.checked} (slots {ring.allocations}, device waits {ring.reader_waits})")
    assert stock.mismatches > 100
    assert plugin.mismatches == 0 and plugin.checked == 300
    assert ring.allocations == als.DEPTH
    # With event_ring, a copy_done already waited on by result processing needs no device wait.
    assert ring.reader_waits == (0 if ring_events else 300 - als.DEPTH)


def test_gpu_block_accept_lens_no_delay_both_match():
    stock, _ = _accept_lens_run(False, 200, copy_delay=0)
    plugin, _ = _accept_lens_run(True, 200, copy_delay=0)
    assert plugin.mismatches == 0
    print(f"\nwithout a copy delay: stock mismatches {stock.mismatches}/200 (SGLang's queued-right-behind copy)")


def _pinned_run(plugin, steps, seed, max_hold, copy_delay, release_check=True, count=None):
    patcher = Patcher()
    ring = pdr.PinnedRing()
    ring.release_check = release_check
    if plugin:
        pinned_d2h.install(patcher, ring)
    try:
        loop = pinned_d2h.Loop(seed, copy_delay_cycles=copy_delay, max_hold=max_hold)
        for i in range(steps):
            if count is not None and i == 10:
                count.on = True
            loop.step()
        loop.release(all_=True)
    finally:
        patcher.undo()
    return loop, ring


def test_gpu_pinned_ring_values_and_no_pinned_allocation_per_step(monkeypatch):
    count = count_pinned_allocations(monkeypatch)
    stock, _ = _pinned_run(False, 110, seed=1, max_hold=1, copy_delay=0, count=count)
    stock_allocs, count.n, count.on = count.n, 0, False
    plugin, ring = _pinned_run(True, 110, seed=1, max_hold=1, copy_delay=0, count=count)
    print(f"\npinned allocations over 100 steps: stock {stock_allocs}, plugin {count.n} "
          f"(pool buffers {ring.allocations})")
    assert stock.mismatches == 0 and plugin.mismatches == 0
    assert stock_allocs == 4 * 100 and count.n == 0


def test_gpu_pinned_ring_delayed_consumer_stress():
    loop, ring = _pinned_run(True, 2000, seed=2, max_hold=4, copy_delay=STEP_CYCLES // 2)
    print(f"\npinned ring, consumers holding 1-4 steps, delayed copies: {loop.mismatches}/{loop.checked} "
          f"mismatches, pool buffers {ring.allocations}, fallbacks {ring.fallbacks}")
    assert loop.mismatches == 0 and loop.checked == 2000 and ring.fallbacks == 0
    # Without the consumer-release check a held buffer is rewritten: the test can fail.
    broken, _ = _pinned_run(True, 300, seed=2, max_hold=4, copy_delay=STEP_CYCLES // 2, release_check=False)
    print(f"without the release check: {broken.mismatches}/{broken.checked} mismatches")
    assert broken.mismatches > 0
