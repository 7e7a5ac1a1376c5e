"""Slot ``pinned_d2h_ring``: ``async_d2h`` serves its pinned host tensors from a
ring instead of ``torch.empty(..., pin_memory=True)`` per output per step.

SGLang 0.5.23's ``sglang.srt.utils.common.async_d2h`` (imported by
``managers/utils.py`` as ``_async_d2h``: ``GenerationBatchResult.copy_to_cpu``,
the auxiliary / capture outputs) allocates a fresh pinned tensor for every
device tensor it copies. With the slot each dtype has a pool of pinned 1-D
buffers (capacity a power of two); a copy takes the smallest free one that fits
and returns a view of it shaped like the source. A buffer is free again only when
both hold:
- its previous copy completed: an event recorded right after the copy, on the
  stream that issued it, has fired (``query``, no host wait);
- its consumer released it: no tensor but the pool's own references the storage
  (views the consumer kept, e.g. hidden states stored on a request, keep it busy).
Otherwise another buffer is used or a new one made (counted). Past MAX_BUFFERS
per (device, dtype) the call goes to SGLang's own path (counted), so memory stays bounded.
CPU tensors and devices without pinned memory take SGLang's path unchanged, and
so does everything about the copy itself (``non_blocking``, ``record_stream``).

Not in ``default``: on the H200 host (2026-11-29, benchmarks/bench_events.py) it
removes the 4 pinned allocations of a DSpark step's readback but costs more host
time than it saves (copy_to_cpu 105.6 -> 121.2 us median). After warm-up torch's
own CachingHostAllocator already serves those allocations from its cache, and this
pool's Python-side guard (use count, event query and record) costs more than that.
Select it (``SGLANG_HOSTSYNC_SLOTS=default,pinned_d2h_ring``) where the allocator is
the bottleneck, e.g. under pinned-memory pressure.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind

NAME = "pinned_d2h_ring"
TARGET = "sglang.srt.utils.common.async_d2h"
MIN_CAPACITY = 64  # elements
MAX_BUFFERS = 64  # per dtype; a decode step copies fewer than 16 outputs
# The pool's own references to a buffer's storage: the buffer tensor and its storage handle.
OWN_REFS = 2


@dataclass
class PinnedBuffer:
    buf: torch.Tensor  # 1-D pinned
    storage: object  # buf.untyped_storage(), kept to read the use count cheaply
    event: object  # recorded after the last copy into buf

    def free(self, release_check: bool = True) -> bool:
        if release_check and torch._C._storage_Use_Count(self.storage._cdata) > OWN_REFS:
            return False  # a consumer still holds a view
        return self.event is None or self.event.query()


class PinnedRing:
    def __init__(self, max_buffers: int = MAX_BUFFERS, pin_memory: bool = True):
        self.max_buffers = max_buffers
        self.pin_memory = pin_memory  # False only in CPU tests of the pool logic
        self.pools: dict[tuple[torch.device, torch.dtype], list[PinnedBuffer]] = {}  # sorted by capacity
        self.allocations = 0  # pinned buffers created
        self.fallbacks = 0  # calls sent to SGLang's path because the pool was full
        self.release_check = True  # tests switch it off to show the hazard

    def acquire(self, numel: int, dtype: torch.dtype, device: torch.device) -> PinnedBuffer | None:
        # Host memory serves any device, but a buffer's event belongs to one.
        pool = self.pools.setdefault((device, dtype), [])
        for entry in pool:
            if entry.buf.numel() >= numel and entry.free(self.release_check):
                return entry
        if len(pool) >= self.max_buffers:
            self.fallbacks += 1
            return None
        capacity = max(MIN_CAPACITY, 1 << max(numel - 1, 0).bit_length())
        buf = torch.empty((capacity,), dtype=dtype, pin_memory=self.pin_memory)
        entry = PinnedBuffer(buf, buf.untyped_storage(), None)
        pool.append(entry)
        pool.sort(key=lambda e: e.buf.numel())
        self.allocations += 1
        return entry

    def copy(self, tensor: torch.Tensor) -> torch.Tensor | None:
        entry = self.acquire(tensor.numel(), tensor.dtype, tensor.device)
        if entry is None:
            return None
        host = entry.buf[: tensor.numel()].view(tensor.shape)
        host.copy_(tensor, non_blocking=True)
        module = torch.get_device_module(tensor.device)
        stream = module.current_stream()
        tensor.record_stream(stream)
        if entry.event is None:
            entry.event = module.Event()
        entry.event.record(stream)
        return host


_ring = PinnedRing()


def ring() -> PinnedRing:
    return _ring


_pin_ok: dict[torch.device, bool] = {}


def _pin_available(device: torch.device) -> bool:
    # SGLang's answer for a device does not change while the process runs.
    ok = _pin_ok.get(device)
    if ok is None:
        from sglang.srt.utils.common import is_pin_memory_available

        ok = _pin_ok[device] = bool(is_pin_memory_available(device))
    return ok


def async_d2h_hook(original, tensor):
    if tensor.device.type == "cpu" or not _pin_available(tensor.device):
        return original(tensor)
    host = _ring.copy(tensor)
    return original(tensor) if host is None else host


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (spec-v2 result readback)",
    summary="async_d2h pinned host tensors from an event- and release-guarded pool, not fresh per output per step",
    default=False,  # slower than torch's cached pinned allocations on the H200 host: see above
    targets=(
        HookTarget(TARGET, TargetKind.FUNCTION, hook=async_d2h_hook, params=("tensor",),
                   source_sha="7dd4d4aa40d0f5af"),
    ),
)
