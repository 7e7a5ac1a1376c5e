"""Slot ``accept_lens_snapshot``: DSpark's ``block_accept_lens`` leaves the step
as a snapshot, not as a view of a CUDA-graph buffer.

In SGLang 0.5.23, when the accept ran in a graph, ``DSparkWorkerV2._block_accept_lens``
returns ``DsparkVerifyEpilogue.read_block_accept_lens(bs)``: a view of
``block_accept_lens_buf``, which the next replay rewrites. The scheduler's D2H of
the result (``Scheduler._copy_result_to_cpu``) runs on ``copy_stream``, which
nothing orders before the next replay on the forward stream; SGLang relies on the
copy being queued right behind the forward. Once the CPU is a step ahead and the
copy is delayed, the readback sees the next step's lengths.

With the slot, ``_block_accept_lens`` copies the graph view, on the forward stream
right where the replay produced it, into a slot of a ring (DEPTH slots per device).
``GenerationBatchResult.copy_to_cpu`` notes which ``copy_done`` event follows the
D2H that read a slot; before the slot is written again, the forward stream waits
on that event (a device-side wait, no host sync), unless it is an ``event_ring``
event that result processing already waited on. The eager path (a fresh tensor)
is passed through unchanged.

Hook targets: ``DSparkWorkerV2._block_accept_lens`` and
``GenerationBatchResult.copy_to_cpu`` (both AROUND; SGLang's bodies run unchanged).
Not covered: ``next_token_ids`` / ``accept_lens`` in the folded path are views of
the epilogue's ``out_tokens_buf`` / ``commit_lens_buf`` too (see the issue note).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_speculative
from .event_ring import known_complete

NAME = "accept_lens_snapshot"
WORKER = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"
RESULT = "sglang.srt.managers.utils.GenerationBatchResult"

# Step N's snapshot is read by its D2H, which is waited one iteration later; two
# results can be unprocessed (disagg prefill polling) while the third is written.
DEPTH = 3


@dataclass
class SnapshotSlot:
    buf: torch.Tensor
    reader: object = None  # copy_done of the D2H that read this slot, until waited on


class SnapshotRing:
    def __init__(self, depth: int = DEPTH):
        self.depth = depth
        self.slots: dict[tuple[torch.device, torch.dtype], list[SnapshotSlot | None]] = {}
        self.next: dict[tuple[torch.device, torch.dtype], int] = {}
        self.by_ptr: dict[int, SnapshotSlot] = {}
        self.allocations = 0
        self.reader_waits = 0  # device-side waits issued before a slot was rewritten

    def snapshot(self, view: torch.Tensor) -> torch.Tensor:
        key = (view.device, view.dtype)
        ring = self.slots.get(key)
        if ring is None:
            ring = self.slots[key] = [None] * self.depth
            self.next[key] = 0
        index = self.next[key]
        self.next[key] = (index + 1) % self.depth
        slot = ring[index]
        n = view.numel()
        if slot is None or slot.buf.numel() < n:
            if slot is not None:
                # async_d2h's record_stream keeps the old buffer alive until its D2H ran.
                self.by_ptr.pop(slot.buf.data_ptr(), None)
            capacity = max(n, 64, 0 if slot is None else 2 * slot.buf.numel())
            slot = ring[index] = SnapshotSlot(torch.empty((capacity,), dtype=view.dtype, device=view.device))
            self.by_ptr[slot.buf.data_ptr()] = slot
            self.allocations += 1
        else:
            self._wait_reader(slot)
        out = slot.buf[:n].view(view.shape)
        out.copy_(view)
        return out

    def _wait_reader(self, slot: SnapshotSlot) -> None:
        reader, slot.reader = slot.reader, None
        if reader is None or known_complete(reader):
            return  # (event_ring's copy_done already waited on by result processing)
        self.reader_waits += 1
        if isinstance(reader, torch.cuda.Event):
            torch.cuda.current_stream().wait_event(reader)
        else:  # HostCopyDone (async D2H worker thread): its only wait is on the host
            reader.synchronize()

    def note_reader(self, tensor, copy_done) -> None:
        if tensor is None or copy_done is None:
            return
        slot = self.by_ptr.get(tensor.data_ptr())
        if slot is not None:
            slot.reader = copy_done


_ring = SnapshotRing()


def ring() -> SnapshotRing:
    return _ring


def block_accept_lens_hook(original, self, **kwargs):
    out = original(self, **kwargs)
    epilogue = self._verify_epilogue
    graph_buf = None if epilogue is None else epilogue.block_accept_lens_buf
    if out is None or graph_buf is None or out._base is not graph_buf:
        return out  # eager path: a fresh tensor nobody rewrites
    return _ring.snapshot(out)


def copy_to_cpu_hook(original, self, *args, **kwargs):
    device_view = self.block_accept_lens
    result = original(self, *args, **kwargs)
    _ring.note_reader(device_view, self.copy_done)
    return result


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang#45450 follow-up (block_accept_lens snapshot)",
    summary="DSpark block_accept_lens snapshotted into a ring where the replay produced it (WAR fix)",
    default=True,
    inert=lambda f: not_speculative(f, "only DSpark's worker returns block_accept_lens", f.is_dspark()),
    targets=(
        HookTarget(
            f"{WORKER}._block_accept_lens", TargetKind.FUNCTION, hook=block_accept_lens_hook,
            params=("self", "accept", "folded_accept", "bs"), source_sha="c0cac043397eae3c",
        ),
        HookTarget(
            f"{RESULT}.copy_to_cpu", TargetKind.FUNCTION, hook=copy_to_cpu_hook,
            params=("self", "return_logprob", "return_hidden_states"), source_sha="8f500169a6b25b4e",
        ),
    ),
)
