"""Event-guarded two-slot staging of small integer host rows into device memory.

Shared by the DP-meta slots: all rows of one step go into one persistent pinned
``[2, rows, width]`` host buffer (written through its numpy view) and reach the
device in ONE H2D. By default into a matching persistent device buffer (no
allocation per step); with ``fresh_device`` into a new device tensor per stage,
for consumers that may keep or modify what they were given.
"""

from __future__ import annotations

import torch


def _normalize(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class TwoSlotStager:
    def __init__(self, rows: int, dtype: torch.dtype = torch.int64, fresh_device: bool = False):
        self.rows = rows
        self.dtype = dtype
        self.fresh_device = fresh_device
        self.width: int | None = None
        self.device: torch.device | None = None
        self.host = self.host_np = self.dev = None
        self.events: list | None = None
        self.recorded = [False, False]
        self.slot = 0
        self._device_arg = self._device_norm = None
        # Diagnostics for tests and the benchmark: allocations and real waits.
        self.allocations = 0
        self.blocking_waits = 0

    def _allocate(self, width: int, device: torch.device) -> None:
        from sglang.srt.utils.common import is_pin_memory_available

        pin = device.type != "cpu" and is_pin_memory_available(device)
        self.host = torch.zeros((2, self.rows, width), dtype=self.dtype, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.dev = None if self.fresh_device else torch.zeros((2, self.rows, width), dtype=self.dtype, device=device)
        self.events = [torch.cuda.Event(), torch.cuda.Event()] if device.type == "cuda" else None
        self.recorded = [False, False]
        self.width, self.device, self.slot = width, device, 0
        # Views made once: a step creates no tensor objects.
        self.host_slots = (self.host[0], self.host[1])
        if not self.fresh_device:
            self.dev_slots = (self.dev[0], self.dev[1])
            self.dev_rows = tuple(tuple(self.dev[s, r] for r in range(self.rows)) for s in (0, 1))
        self.allocations += 1

    def _wait_for_slot(self, slot: int) -> None:
        event = self.events[slot]
        # The H2D that last read this pinned slot was issued two stages ago and
        # has almost always finished; only then may the host rewrite it.
        if not event.query():
            self.blocking_waits += 1
            event.synchronize()

    def stage(self, device, *rows) -> tuple:
        """Stage ``rows`` (equal-length int sequences); return one device row view
        per input row, all in the slot just written."""
        if device is not self._device_arg:
            self._device_arg, self._device_norm = device, _normalize(device)
        width = len(rows[0])
        if self.host is None or width != self.width or self._device_norm != self.device:
            self._allocate(width, self._device_norm)
        slot = self.slot
        self.slot ^= 1
        if self.recorded[slot]:
            self._wait_for_slot(slot)
        for i, values in enumerate(rows):
            self.host_np[slot, i] = values
        if self.fresh_device:
            dev = torch.empty((self.rows, width), dtype=self.dtype, device=self.device)
            dev.copy_(self.host_slots[slot], non_blocking=self.events is not None)
            rows_out = tuple(dev[r] for r in range(self.rows))
        else:
            # Device slot reuse is stream-ordered: the readers of the stage that last
            # wrote it were enqueued on this stream before this copy.
            self.dev_slots[slot].copy_(self.host_slots[slot], non_blocking=self.events is not None)
            rows_out = self.dev_rows[slot]
        if self.events is not None:
            self.events[slot].record()
            self.recorded[slot] = True
        return rows_out
