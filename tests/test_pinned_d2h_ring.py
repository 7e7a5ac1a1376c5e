"""pinned_d2h_ring's pool on the CPU (the copy itself needs a GPU: test_gpu_events.py)."""

import torch

from sglang_hostsync_plugin.slots import pinned_d2h_ring as pdr

CPU = torch.device("cpu")


class FakeEvent:
    def __init__(self, fired=True):
        self.fired = fired

    def query(self):
        return self.fired


def _ring(**kw):
    return pdr.PinnedRing(pin_memory=False, **kw)


def test_buffer_reused_only_after_release_and_copy_done():
    ring = _ring()
    a = ring.acquire(10, torch.int32, CPU)
    assert a.buf.numel() == pdr.MIN_CAPACITY and ring.allocations == 1
    a.event = FakeEvent(fired=False)
    assert ring.acquire(10, torch.int32, CPU) is not a  # copy still in flight
    a.event.fired = True
    view = a.buf[:10]  # the consumer's host tensor
    b = ring.acquire(10, torch.int32, CPU)
    assert b is not a  # consumer still holds a view
    b.event = FakeEvent(fired=False)  # b now busy too
    del view
    assert ring.acquire(10, torch.int32, CPU) is a
    assert ring.allocations == 2


def test_views_of_views_keep_a_buffer_busy():
    ring = _ring()
    a = ring.acquire(8, torch.float32, CPU)
    kept = a.buf[:8].view(2, 4)[1:]
    assert not a.free()
    del kept
    assert a.free()


def test_capacity_is_a_power_of_two_and_smallest_fit_wins():
    ring = _ring()
    big = ring.acquire(1000, torch.int64, CPU)
    held = big.buf[:1000]
    small = ring.acquire(3, torch.int64, CPU)
    assert big.buf.numel() == 1024 and small.buf.numel() == pdr.MIN_CAPACITY
    del held
    assert ring.acquire(3, torch.int64, CPU) is small
    assert ring.acquire(65, torch.int64, CPU) is big
    assert ring.acquire(0, torch.int64, CPU) is small  # empty outputs too


def test_pools_are_per_device_and_dtype():
    ring = _ring()
    a = ring.acquire(4, torch.int32, CPU)
    assert ring.acquire(4, torch.int64, CPU) is not a
    assert ring.acquire(4, torch.int32, torch.device("meta")) is not a
    assert ring.allocations == 3


def test_full_pool_falls_back_to_sglang():
    ring = _ring(max_buffers=2)
    held = [ring.acquire(4, torch.int32, CPU).buf[:4] for _ in range(2)]
    assert ring.acquire(4, torch.int32, CPU) is None and ring.fallbacks == 1
    assert len(held) == 2


def test_cpu_tensors_take_sglang_s_path():
    calls = []

    def original(tensor):
        calls.append(tensor)
        return tensor

    t = torch.arange(3)
    assert pdr.async_d2h_hook(original, t) is t and calls == [t] and pdr.ring().allocations == 0
