"""Slot ``ngram_accept_readback``: NGRAM's draft prep reads step N-1's accepted tokens
from the copy SGLang's one per-step wait already covers, not with two blocking reads.

Stock SGLang 0.5.23 under overlap, step N of an NGRAM decode:

1. ``FutureMap.resolve_seq_lens_cpu`` (``overlap_utils.py`` ~587): NGRAM forces
   ``needs_cpu_seq_lens`` (``decide_needs_cpu_seq_lens``), so a private D2H stream,
   gated on step N-1's publish event, copies the seq lens to a pinned mirror, and the
   host synchronizes that stream (1 sync).
2. ``FutureMap._resolve_spec_extras`` (~476): gathers the batch's rows of the NGRAM
   relay buffers ``accept_tokens_buf`` / ``accept_lens_buf`` on the forward stream.
3. ``NGRAMWorker._prepare_draft_tokens`` (``ngram_worker.py`` ~264-269): ``.cpu()`` of
   both gathers, two blocking copies, each waiting for everything queued (2 syncs).

With the slot, step 1's private stream also copies the two relay buffers into pinned
host mirrors. It waits first on an event recorded behind the last ``FutureMap.stash``
that wrote them. SGLang's own synchronize in step 1 then covers these copies too. The host gathers the
batch's rows by ``req_pool_indices_cpu`` (the index SGLang's seq-lens mirror uses),
and step 2 hands the draft input these host tensors instead of device gathers.
``_prepare_draft_tokens`` then takes its own ``is_cpu`` branch: no copy, no wait.
3 syncs per step become 1. The values are the ones stock reads. The host still waits
for step N-1 once per step: NGRAM drafts from a host corpus keyed on the tokens step N-1
accepted.

Inert (SGLang's path runs) unless: NGRAM, CUDA (the private stream exists), the relay
buffers exist, a stash was recorded, and SGLang's resolve takes its private-stream branch.

Hook targets (AROUND, SGLang's bodies pinned): ``FutureMap.stash``,
``FutureMap.resolve_seq_lens_cpu``, ``FutureMap._resolve_spec_extras``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_speculative
from . import ngram_late_wait

NAME = "ngram_accept_readback"
FUTURE_MAP = "sglang.srt.managers.overlap_utils.FutureMap"


@dataclass
class Readback:
    stash_done: object | None = None  # event behind the last NGRAM stash
    tokens: torch.Tensor | None = None  # host mirror of accept_tokens_buf
    lens: torch.Tensor | None = None  # host mirror of accept_lens_buf
    # (draft input, its accept tokens, its accept lens): set by resolve, taken once by extras.
    ready: tuple | None = None
    staged: int = 0  # steps whose accept tokens came from the mirrors


_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def state(future_map) -> Readback:
    found = _states.get(future_map)
    if found is None:
        found = _states[future_map] = Readback()
    return found


def new_event(future_map):
    return torch.get_device_module(future_map.device).Event()


def _mirror(have: torch.Tensor | None, like: torch.Tensor, pinned: bool) -> torch.Tensor:
    if have is not None and have.shape == like.shape and have.dtype == like.dtype:
        return have
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinned)


def stash_hook(original, self, future_indices, payload):
    original(self, future_indices, payload)
    if (future_indices.shape[0] == 0 or not self.spec_algo.is_ngram() or self.accept_tokens_buf is None
            or self.fwd_prepare_d2h_stream is None):
        return
    st = state(self)
    if st.stash_done is None:
        st.stash_done = new_event(self)
    st.stash_done.record()  # on the stash's (forward) stream, behind its writes


def _stage(fm, batch, stream_ordered: bool) -> Readback | None:
    """Queue the relay buffers' D2H on SGLang's private stream, where SGLang's resolve
    is about to synchronize; None where that resolve would not synchronize it."""
    draft_input = batch.spec_info
    st = _states.get(fm)
    if (st is None or st.stash_done is None or stream_ordered or not fm.needs_cpu_seq_lens
            or draft_input is None or draft_input.future_indices is None
            or draft_input.future_indices.shape[0] == 0 or batch.req_pool_indices_cpu is None
            or fm.fwd_prepare_d2h_stream is None or fm.publish_ready is None or fm.accept_tokens_buf is None):
        return None
    rows = int(batch.req_pool_indices_cpu.max()) + 1  # the mirrors need only rows up to the batch's last
    pinned = fm.new_seq_lens_cpu_pinned is not None and fm.new_seq_lens_cpu_pinned.is_pinned()
    st.tokens = _mirror(st.tokens, fm.accept_tokens_buf, pinned)
    st.lens = _mirror(st.lens, fm.accept_lens_buf, pinned)
    d2h = fm.fwd_prepare_d2h_stream
    d2h.wait_event(st.stash_done)
    with torch.get_device_module(fm.device).stream(d2h):
        st.tokens[:rows].copy_(fm.accept_tokens_buf[:rows], non_blocking=True)
        st.lens[:rows].copy_(fm.accept_lens_buf[:rows], non_blocking=True)
    return st


def resolve_seq_lens_cpu_hook(original, self, batch, stream_ordered=False):
    ngram_late_wait.left_over()  # a wait slot ngram_late_wait left over reads the mirrors _stage rewrites
    st = _stage(self, batch, stream_ordered) if self.spec_algo.is_ngram() else None
    if st is not None and ngram_late_wait.defer(original, self, batch, st, stream_ordered):
        return  # slot ngram_late_wait: the synchronize runs at the draft prep
    original(self, batch, stream_ordered=stream_ordered)
    if st is not None:  # SGLang's synchronize of the private stream has returned
        idx = batch.req_pool_indices_cpu
        st.ready = (batch.spec_info, st.tokens[idx].flatten(), st.lens[idx])


def resolve_spec_extras_hook(original, self, batch):
    st = _states.get(self)
    ready = st.ready if st is not None else None
    if st is not None:
        st.ready = None
    if ready is None or ready[0] is not batch.spec_info or not self.spec_algo.is_ngram():
        return original(self, batch)
    # SGLang's NGRAM branch: the same rows, gathered on the device for a blocking .cpu() later.
    batch.spec_info.accept_tokens, batch.spec_info.accept_lens = ready[1], ready[2]
    st.staged += 1
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (NGRAM accepted-token readback)",
    summary="NGRAM draft prep reads step N-1's accept tokens/lens from pinned mirrors copied under "
            "SGLang's seq-lens synchronize: 3 syncs per step -> 1",
    default=True,
    seq_lens_read=("where the read stays, it also brings back step N-1's accepted tokens (stock reads them with two "
                   "more blocking copies): one wait per step"),
    inert=lambda f: not_speculative(f, "only NGRAM drafts from step N-1's accepted tokens on the host", f.is_ngram()),
    targets=(
        HookTarget(f"{FUTURE_MAP}.stash", TargetKind.FUNCTION, hook=stash_hook,
                   params=("self", "future_indices", "payload"), source_sha="7a98d72c6902171e"),
        HookTarget(f"{FUTURE_MAP}.resolve_seq_lens_cpu", TargetKind.FUNCTION, hook=resolve_seq_lens_cpu_hook,
                   params=("self", "batch", "stream_ordered"), source_sha="f7d9d6e12fc4040c"),
        HookTarget(f"{FUTURE_MAP}._resolve_spec_extras", TargetKind.FUNCTION, hook=resolve_spec_extras_hook,
                   params=("self", "batch"), source_sha="df5270ea6d9a45e1"),
    ),
)
