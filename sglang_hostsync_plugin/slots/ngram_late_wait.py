"""Slot ``ngram_late_wait``: NGRAM's one wait per step for step N-1 moves from the start of
``run_batch`` to the draft prep that needs its values (GPU idle inside the step).

NGRAM drafts on the host from the tokens step N-1 accepted, so step N cannot launch its verify
before step N-1 is done: the GPU is idle from step N-1's end until step N's verify graph starts,
and every host line run after the wait is in that idle. In stock SGLang 0.5.23 under overlap
(with ``ngram_accept_readback``) the wait is ``FutureMap.resolve_seq_lens_cpu``'s synchronize of
its private D2H stream, at the top of ``Scheduler.run_batch``; after it, before the draft prep
reads anything of step N-1, run ``resolve_forward_inputs``, the forward isolation's snapshot of
every batch field, the worker's own glue and the verify prep's accept-independent part (about
0.2-0.5 ms of the 1.5 ms of GPU idle per step the audit's markers found on an H100,
``benchmarks/results/2026-12-05-h100-f/ngram-marks/``).

With the slot, ``resolve_seq_lens_cpu`` (through ``ngram_accept_readback``'s hook) runs SGLang's
stream-side part (the event wait and the device gather of ``batch.seq_lens``), queues the same
D2H copies on the same private stream (relay buffers behind the last stash, seq lens behind the
publish event) and does not synchronize. The batch gets host tensors to be filled in place:
``seq_lens_cpu`` and the draft input's accept tokens and lengths (``seq_lens_sum`` stays None
until then, as SGLang leaves it wherever it has no host lengths). The wait itself, SGLang's same
``Stream.synchronize``, runs where ``NGRAMWorker._prepare_draft_tokens`` starts, which fills them
before its first read. The values are the ones stock reads; only the wait's place changes.

Nothing between the two reads them: ``run_batch`` from the resolve to the worker, the worker's
glue and ``_prepare_for_speculative_decoding`` up to the draft prep read neither
``seq_lens_cpu``'s values nor ``seq_lens_sum`` (pinned sources; ``tests/test_ngram_late_wait.py``
reads them) once ``ngram_full_mask`` sizes the verify mask after the draft prep. Stock's per-request
``torch.ones((D, seq_lens_cpu[i]))`` would read them before it, so the slot requires that slot,
defers only while that slot's edit runs (not after a failed edit, where SGLang's function runs),
and a batch the edit leaves to stock's loop takes the wait first (``ngram_full_mask.fits``).

It defers only where SGLang's resolve would have synchronized that stream (the readback's own
conditions), for a decode batch, without SGLang's debug asserts (``SGLANG_IS_IN_CI``, which
poison the device rows the copy reads), and once the wait point's hook has run in this process:
the first NGRAM decode step waits where stock does. A wait left over (never expected: every
decode step's draft prep takes it) completes when the next resolve starts, before the
readback queues copies into the mirrors it gathers from, and the process stops deferring (a warning
in the log). Opt-in, like
``ngram_full_mask``: ``ngram_worker`` imports only beside ``sgl_kernel``. Hook target:
``NGRAMWorker._prepare_draft_tokens`` (AROUND); the deferral is in ``ngram_accept_readback``'s
``resolve_seq_lens_cpu`` hook, behind this slot's wait point.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..checks import file_pins
from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from . import audit_phases, ngram_full_mask
from .ngram_full_mask import NGRAM_PRESET

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "ngram_late_wait"
NGRAM_WORKER = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
DRAFT_TOKENS = f"{NGRAM_WORKER}._prepare_draft_tokens"
# Read nothing of step N-1 before the draft prep (the forward, the verify prep as ngram_full_mask edits it).
PINS = ((f"{NGRAM_WORKER}.forward_batch_generation", "62a0fa9f388804a7"),
        (f"{NGRAM_WORKER}._prepare_for_speculative_decoding", "7417a9ce177df775"))


@dataclass
class Pending:
    """Step N-1's copies, queued on SGLang's private stream; the host tensors they fill."""

    future_map: object
    batch: object
    index: torch.Tensor  # batch.req_pool_indices_cpu, the rows SGLang's mirror gather takes
    readback: object  # ngram_accept_readback's state: its pinned relay mirrors
    seq_lens_cpu: torch.Tensor
    tokens: torch.Tensor
    lens: torch.Tensor


_live = False  # the wait point's hook has run in this process: a deferred wait will be taken
_pending: Pending | None = None
deferred = 0  # steps whose wait ran at the draft prep


def defer(original, fm, batch, readback, stream_ordered: bool) -> bool:
    """Instead of ``resolve_seq_lens_cpu``'s synchronize: queue its copy and leave the wait to the
    draft prep. ``readback`` is ngram_accept_readback's state whose relay copies are queued
    already. False (nothing done) where the wait must stay where SGLang has it."""
    global _pending, deferred
    from sglang.srt.managers import overlap_utils

    # Stock's verify prep reads the host lengths before the draft prep: only ngram_full_mask's edit does not.
    if (not _live or not ngram_full_mask.PREPARE_ONCE.live() or overlap_utils._DEBUG_ASSERT
            or not batch.forward_mode.is_decode()):
        return False
    fm.needs_cpu_seq_lens = False  # SGLang's own event wait and device gather, without the D2H
    try:
        original(fm, batch, stream_ordered=stream_ordered)
    finally:
        fm.needs_cpu_seq_lens = True
    d2h = fm.fwd_prepare_d2h_stream
    d2h.wait_event(fm.publish_ready)  # SGLang's copy, as its private-stream branch queues it
    with torch.get_device_module(fm.device).stream(d2h):
        fm.new_seq_lens_cpu_pinned.copy_(fm.new_seq_lens_buf, non_blocking=True)
    index = batch.req_pool_indices_cpu
    rows = index.shape[0]
    batch.seq_lens_cpu = torch.empty(rows, dtype=fm.new_seq_lens_cpu_pinned.dtype)
    batch.seq_lens_sum = None
    tokens = torch.empty(rows * readback.tokens.shape[1], dtype=readback.tokens.dtype)
    lens = torch.empty(rows, dtype=readback.lens.dtype)
    readback.ready = (batch.spec_info, tokens, lens)
    _pending = Pending(fm, batch, index, readback, batch.seq_lens_cpu, tokens, lens)
    deferred += 1
    return True


def finish() -> None:
    """The deferred wait: SGLang's synchronize of its private stream, then the host gathers it
    would have made at the resolve, straight into the tensors the batch already holds."""
    global _pending
    p, _pending = _pending, None
    if p is None:
        return
    # The audit times it as the resolve's wait it is (phase seq_lens_resolve), not as draft prep.
    audit_phases.run_as(audit_phases.SEQ_LENS_RESOLVE, p.future_map.fwd_prepare_d2h_stream.synchronize)
    torch.index_select(p.future_map.new_seq_lens_cpu_pinned, 0, p.index, out=p.seq_lens_cpu)
    p.batch.seq_lens_sum = int(p.seq_lens_cpu.sum())
    torch.index_select(p.readback.tokens, 0, p.index, out=p.tokens.view(p.index.shape[0], -1))
    torch.index_select(p.readback.lens, 0, p.index, out=p.lens)


def left_over() -> None:
    """At the next resolve: a deferred wait no draft prep took (never expected) completes, and the
    process defers no more, since its batch ran on host tensors filled only now."""
    global _live
    if _pending is not None:
        finish()
        _live = False
        logger.warning("hostsync: %s: a deferred wait was not taken by the draft prep; NGRAM waits where "
                       "SGLang does from now on", NAME)


def draft_tokens_hook(original, self, batch):
    global _live
    _live = True
    finish()
    return original(self, batch)


def check_pins() -> str | None:
    """The pinned NGRAM sources, read from ``ngram_worker``'s file (it imports only beside sgl_kernel)."""
    return file_pins(PINS, "reads before the draft prep")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (NGRAM's in-step GPU idle)",
    summary="NGRAM's per-step wait for step N-1 moves from the top of run_batch to the draft prep that "
            "reads its values: the scheduler and worker glue in between runs under step N-1's GPU work",
    default=False,
    seq_lens_read="where the read stays, its wait moves from the top of the step to the draft prep",
    requires=("ngram_accept_readback", "ngram_full_mask"),
    presets=(NGRAM_PRESET,),
    precheck=config_precheck(None, check_pins),
    inert=lambda f: not_speculative(f, "only NGRAM waits for step N-1 to draft", bool(f.speculative_algorithm)
                                    and f.is_ngram()),
    targets=(HookTarget(DRAFT_TOKENS, TargetKind.FUNCTION, hook=draft_tokens_hook, params=("self", "batch"),
                        source_sha="2f429d144dc2d6f1"),),
)
