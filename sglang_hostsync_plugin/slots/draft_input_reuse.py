"""Slot ``draft_input_reuse``: DFlash's per-step prepare buffers come from a ring.

SGLang 0.5.23 builds a new ``DFlashDraftInputV2`` every step
(``draft_worker_common.make_draft_input_v2``), and its ``prepare_for_decode``
allocates scratch for the new object: 3 CPU buffers (2 pinned) and 2 GPU buffers.
This slot hands every draft input a buffer set from a process-wide ring instead:

- ``_ensure_prepare_length_buffers`` takes the next set (growing it the way SGLang
  does when the batch outgrows it, or when the device changes);
- ``prepare_for_decode`` runs SGLang's own body on those buffers, then records the
  set's event after the pinned H2D copies, on the stream that waited for them;
- a set is written again only after its event completed.

Values are SGLang's own; only where the scratch lives changes. The ring is
process-wide: SGLang runs one scheduler (one DFlash worker) per process, and the
depth argument below counts that scheduler's steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_speculative

NAME = "draft_input_reuse"
TARGET = "sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2"

# Step N's host views (batch.seq_lens_cpu, nxt_kv_lens_cpu) are read until its result
# is processed, one iteration later, while step N+1 writes its own set; the third set
# leaves its H2D a whole step to complete before the event wait could block.
DEPTH = 3


@dataclass
class PrepareBuffers:
    capacity: int
    device: str
    batch_cpu: torch.Tensor  # int64, not pinned (as in SGLang)
    cur_cpu: torch.Tensor  # int32, pinned where available
    nxt_cpu: torch.Tensor
    cur_gpu: torch.Tensor
    nxt_gpu: torch.Tensor
    done: torch.cuda.Event | None  # recorded after this set's H2D copies


class PrepareBufferRing:
    """DEPTH buffer sets handed out in turn; counters for tests and benchmarks."""

    def __init__(self, depth: int = DEPTH):
        self.sets: list[PrepareBuffers | None] = [None] * depth
        self.next = 0
        self.allocations = 0  # buffer sets created (each: 3 CPU + 2 device tensors)
        self.blocking_waits = 0  # acquisitions whose previous copy had not completed
        self.wait_enabled = True  # tests switch it off to show the hazard

    def acquire(self, bs: int, device) -> PrepareBuffers:
        index = self.next
        self.next = (index + 1) % len(self.sets)
        current = self.sets[index]
        device = str(device)
        if current is None or current.capacity < bs or current.device != device:
            from sglang.srt.utils.common import is_pin_memory_available

            # SGLang's growth rule (_ensure_prepare_length_buffers).
            old = 0 if current is None else current.capacity
            capacity = max(bs, 32, old * 2 if old > 0 else 0)
            pin = is_pin_memory_available(device)
            is_cuda = torch.device(device).type == "cuda"
            current = PrepareBuffers(
                capacity=capacity,
                device=device,
                batch_cpu=torch.empty((capacity,), dtype=torch.int64, device="cpu"),
                cur_cpu=torch.empty((capacity,), dtype=torch.int32, device="cpu", pin_memory=pin),
                nxt_cpu=torch.empty((capacity,), dtype=torch.int32, device="cpu", pin_memory=pin),
                cur_gpu=torch.empty((capacity,), dtype=torch.int32, device=device),
                nxt_gpu=torch.empty((capacity,), dtype=torch.int32, device=device),
                done=torch.cuda.Event() if is_cuda else None,
            )
            self.sets[index] = current
            self.allocations += 1
        elif current.done is not None and self.wait_enabled and not current.done.query():
            # The pinned buffers are about to be rewritten: their last H2D must have run.
            self.blocking_waits += 1
            current.done.synchronize()
        return current


_ring = PrepareBufferRing()


def ring() -> PrepareBufferRing:
    return _ring


class DraftInputReuse:
    """Mixin for ``DFlashDraftInputV2`` (composed by the installer)."""

    _hs_pending: PrepareBuffers | None = None

    def _ensure_prepare_length_buffers(self, bs: int, device) -> None:
        buffers = _ring.acquire(bs, device)
        self._prepare_batch_seq_lens_cpu_buf = buffers.batch_cpu
        self._prepare_cur_kv_lens_cpu_buf = buffers.cur_cpu
        self._prepare_nxt_kv_lens_cpu_buf = buffers.nxt_cpu
        self._prepare_cur_kv_lens_gpu_buf = buffers.cur_gpu
        self._prepare_nxt_kv_lens_gpu_buf = buffers.nxt_gpu
        self._hs_pending = buffers

    def prepare_for_decode(self, batch) -> None:
        self._hs_pending = None
        super().prepare_for_decode(batch)
        buffers, self._hs_pending = self._hs_pending, None
        if buffers is not None and buffers.done is not None:
            # SGLang made this stream wait for the plan stream's copies (or ran them here).
            buffers.done.record(torch.cuda.current_stream(torch.device(buffers.device)))


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (DFlash spec-v2)",
    summary="DFlash draft-input prepare buffers from an event-guarded ring, not fresh per step",
    default=True,
    inert=lambda f: not_speculative(f, "only the DFlash family (DFlash, DSpark) builds DFlashDraftInputV2",
                                    f.is_dflash_family()),
    targets=(
        HookTarget(
            TARGET, TargetKind.CLASS, mixin=DraftInputReuse,
            params={
                "_ensure_prepare_length_buffers": ("self", "bs", "device"),
                "prepare_for_decode": ("self", "batch"),
            },
            source_sha={
                "_ensure_prepare_length_buffers": "66ee9f96f65fed79",
                "prepare_for_decode": "0b91de308f8cc6c6",
            },
        ),
    ),
)
