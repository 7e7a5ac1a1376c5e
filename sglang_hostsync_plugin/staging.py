"""Event-guarded two-slot staging of small integer host rows into device memory.

Shared by the DP-meta slots: all rows of one step go into one persistent pinned
``[2, rows, width]`` host buffer (written through its numpy view) and reach the
device in ONE H2D. By default into a matching persistent device buffer (no
allocation per step); with ``fresh_device`` into a new device tensor per stage,
for consumers that may keep or modify what they were given; with ``into`` (one-row
stagers) into a caller's device tensor. With ``scalar`` a
stage also copies one int32 value from its own pinned slot into a caller's
device tensor, under the same event.

On CUDA the copies and the event record are issued either by ``csrc/h2d_stage.cu``
(one C++ call) or by torch from Python. ``SGLANG_HOSTSYNC_STAGING_IMPL`` =
``auto`` (default: csrc where it builds, else Python; while the csrc module is still
loading, Python until it is loaded) / ``python`` / ``cuda`` (loaded before ready).
"""

from __future__ import annotations

import logging
import os

import torch

from . import csrc

logger = logging.getLogger("sglang.srt.plugins.hostsync")

ENV_IMPL = "SGLANG_HOSTSYNC_STAGING_IMPL"
KERNEL = "h2d_stage"
_impl: str | None = None


def staging_impl(env=None) -> str:
    """``cuda`` or ``python`` for this process (chosen once, logged)."""
    global _impl
    if env is not None:
        return csrc.choose_impl(ENV_IMPL, "python", env)[0]
    if _impl is None:
        _impl, why = csrc.choose_impl(ENV_IMPL, "python", os.environ)
        logger.info("hostsync: DP-meta staging issues its copies from %s (%s)", _impl, why)
    return _impl


def staging_kernels(used: bool, env) -> tuple[str, ...]:
    """The csrc kernel the stagers load, when their path is ``used`` (Slot.kernels)."""
    return (KERNEL,) if used and staging_impl(env) == "cuda" else ()


def _use_cuda() -> None:
    global _impl
    _impl = "cuda"


def _use_python() -> None:
    global _impl
    _impl = "python"


def initial_impl() -> tuple[str, bool]:
    """(impl, pending) for a stager's first CUDA allocation. Pending: ``auto`` chose csrc and its
    module is not loaded yet (a load is running, or is started here without waiting); the stager
    issues Python copies and switches in ``stage`` once it is loaded."""
    impl = staging_impl()
    if impl == "cuda" and not csrc.asked_for_cuda(ENV_IMPL) and not csrc.loaded(KERNEL):
        # Made before the slot's prepare (or without it).
        if not csrc.loading(KERNEL):
            csrc.load_in_background("staging", KERNEL, on_loaded=_use_cuda, on_failed=_use_python, wait=0)
        return "python", True
    if impl == "python" and csrc.loading(KERNEL):
        return "python", True  # prepare's load is still running (it set Python meanwhile)
    return impl, False


def prepare_staging(slot: str, used: bool) -> str:
    """Load the stagers' kernel (Slot.prepare). Explicit ``cuda``: before ready. Under
    ``auto`` the wait is at most ``csrc.AUTO_WAIT_S``: the stagers issue their copies from
    Python until the module is loaded, then from csrc; a kernel that does not build leaves
    them on Python."""
    global _impl
    if not used:
        return ""
    if staging_impl() != "cuda":
        return f"staging from {_impl}"
    if csrc.asked_for_cuda(ENV_IMPL):
        return csrc.load_before_ready(KERNEL)
    if csrc.loaded(KERNEL):
        return f"csrc/{KERNEL}.cu loaded"
    _impl = "python"
    return csrc.load_in_background(slot, KERNEL, on_loaded=_use_cuda, on_failed=_use_python)


def check_staging_impl() -> None:
    """Raise HostsyncConfigError for a bad ``SGLANG_HOSTSYNC_STAGING_IMPL`` (slot precheck)."""
    staging_impl(os.environ)


def _normalize(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class TwoSlotStager:
    def __init__(self, rows: int, dtype: torch.dtype = torch.int64, fresh_device: bool = False,
                 scalar: bool = False, impl: str | None = None):
        self.rows = rows
        self.dtype = dtype
        self.fresh_device = fresh_device
        self.scalar = scalar
        self.impl = impl  # None: staging_impl() at the first CUDA allocation
        # auto chose csrc while its module was still loading: Python copies until it is loaded
        self._csrc_pending = False
        self.width: int | None = None
        self.device: torch.device | None = None
        self.host = self.host_np = self.dev = None
        self.events: list | None = None
        self.recorded = [False, False]
        self.slot = 0
        self._device_arg = self._device_norm = None
        self._stage_op = None
        self._streams: dict = {}
        self._scalar_checked = None
        # Diagnostics for tests and the benchmark: allocations and real waits.
        self.allocations = 0
        self.blocking_waits = 0

    def _allocate(self, width: int, device: torch.device) -> None:
        from sglang.srt.utils.common import is_pin_memory_available

        if self.events is not None:
            # The old buffers may still be read by copies issued without torch's
            # knowledge (csrc): let them finish before the allocators reuse them.
            for slot in (0, 1):
                if self.recorded[slot]:
                    self.events[slot].synchronize()
        pin = device.type != "cpu" and is_pin_memory_available(device)
        self.host = torch.zeros((2, self.rows, width), dtype=self.dtype, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.dev = None if self.fresh_device else torch.zeros((2, self.rows, width), dtype=self.dtype, device=device)
        self.scalar_host = torch.zeros((2, 1), dtype=torch.int32, pin_memory=pin) if self.scalar else None
        self.scalar_np = self.scalar_host.numpy() if self.scalar else None
        self.events = None
        self._stage_op = None
        self._scalar_checked = None  # checked against the new device on next use
        if device.type == "cuda":
            self.events = [torch.cuda.Event(), torch.cuda.Event()]
            with torch.cuda.device(device):
                for event in self.events:
                    event.record()  # creates the handle csrc records on
            if self.impl is None:
                self.impl, self._csrc_pending = initial_impl()
            if self.impl == "cuda":
                self._use_csrc()
        self.recorded = [False, False]
        self.width, self.device, self.slot = width, device, 0
        # Views made once: a step creates no tensor objects.
        self.host_slots = (self.host[0], self.host[1])
        self.host_rows0 = (self.host[0, 0], self.host[1, 0])
        if self.scalar:
            self.scalar_slots = (self.scalar_host[0], self.scalar_host[1])
        if not self.fresh_device:
            self.dev_slots = (self.dev[0], self.dev[1])
            self.dev_rows = tuple(tuple(self.dev[s, r] for r in range(self.rows)) for s in (0, 1))
        self.allocations += 1

    def _use_csrc(self) -> None:
        self._stage_op = csrc.load(KERNEL).stage
        self._handles = tuple(event.cuda_event for event in self.events)
        self._host_ptrs = (self.host[0].data_ptr(), self.host[1].data_ptr())
        self._nbytes = self.host[0].numel() * self.host.element_size()
        if self.scalar:
            self._scalar_ptrs = (self.scalar_host[0].data_ptr(), self.scalar_host[1].data_ptr())

    def _wait_for_slot(self, slot: int) -> None:
        event = self.events[slot]
        # The H2D that last read this pinned slot was issued two stages ago and
        # has almost always finished; only then may the host rewrite it.
        if not event.query():
            self.blocking_waits += 1
            event.synchronize()

    def fits(self, into: torch.Tensor, width: int) -> bool:
        """Whether ``stage(into.device, row, into=into)`` may write ``width`` values into ``into``."""
        return (self.rows == 1 and into.dtype == self.dtype and into.dim() == 1 and into.numel() == width
                and into.is_contiguous())

    def _check_scalar_into(self, dst: torch.Tensor) -> None:
        if not self.scalar:
            raise ValueError("scalar_into needs a stager made with scalar=True")
        if dst.dtype != torch.int32 or dst.numel() != 1 or not dst.is_contiguous() or dst.device != self.device:
            raise ValueError(f"scalar_into: one contiguous int32 element on {self.device}, got "
                             f"{dst.dtype} {tuple(dst.shape)} on {dst.device}")
        self._scalar_checked = dst

    def _record(self, slot: int) -> None:
        # Event.record() builds a Stream object per call; one per raw stream is kept.
        raw = torch._C._cuda_getCurrentRawStream(self.device.index)
        stream = self._streams.get(raw)
        if stream is None:
            stream = self._streams[raw] = torch.cuda.current_stream(self.device)
        self.events[slot].record(stream)

    def stage(self, device, *rows, scalar_into: torch.Tensor | None = None, scalar_value: int = 0,
              into: torch.Tensor | None = None) -> tuple:
        """Stage ``rows`` (equal-length int sequences); return one device row view
        per input row, all in the slot just written. With ``scalar_into`` (a
        one-element int32 device tensor; needs ``scalar=True``) ``scalar_value``
        is copied into it in the same stage. With ``into`` (one-row stagers: a 1-D
        contiguous tensor of the stager's dtype on ``device``: check with ``fits``) the
        row is copied there instead, and ``(into,)`` is returned."""
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
        if scalar_into is not None:
            if scalar_into is not self._scalar_checked:
                self._check_scalar_into(scalar_into)
            self.scalar_np[slot, 0] = scalar_value
        if into is not None:
            dev, rows_out = into, (into,)
        elif self.fresh_device:
            dev = torch.empty((self.rows, width), dtype=self.dtype, device=self.device)
            rows_out = dev.unbind(0)
        else:
            dev = self.dev_slots[slot]
            rows_out = self.dev_rows[slot]
        if self._csrc_pending and _impl == "cuda" and csrc.loaded(KERNEL):
            # Both paths record the slot's event after its copy: a switch between stages is ordered.
            self.impl, self._csrc_pending = "cuda", False
            self._use_csrc()
        if self._stage_op is not None:
            if scalar_into is None:
                self._stage_op(self.device.index, dev.data_ptr(), self._host_ptrs[slot], self._nbytes, 0, 0, 0,
                               self._handles[slot])
            else:
                self._stage_op(self.device.index, dev.data_ptr(), self._host_ptrs[slot], self._nbytes,
                               scalar_into.data_ptr(), self._scalar_ptrs[slot], 4, self._handles[slot])
            self.recorded[slot] = True
            return rows_out
        # Device slot reuse is stream-ordered: the readers of the stage that last
        # wrote it were enqueued on this stream before this copy.
        non_blocking = self.events is not None
        dev.copy_(self.host_slots[slot] if into is None else self.host_rows0[slot], non_blocking=non_blocking)
        if scalar_into is not None:
            scalar_into.copy_(self.scalar_slots[slot], non_blocking=non_blocking)
        if self.events is not None:
            self._record(slot)
            self.recorded[slot] = True
        return rows_out
