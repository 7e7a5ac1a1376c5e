"""Slot ``fused_relay_stash``: the overlap scheduler's per-step relay stash in one Triton
launch.

After each EAGLE-family v2 forward SGLang 0.5.23's ``FutureMap.stash`` (overlap_utils.py) writes
the next step's draft input into its request-indexed buffers, one advanced-index write per
field: ``output_tokens_buf[indices] = bonus_tokens.to(int64)`` (a cast kernel and an index
write), ``topk_p_buf[indices] = ...``, ``topk_index_buf[indices] = ...`` and, for EAGLE (not
STANDALONE), ``hidden_states_buf[indices] = ...``. Each index write costs the host tens of µs
of PyTorch dispatch; in a py-spy of a host-bound server the stash's lines were 2-3.5% of the
scheduler's step (``benchmarks/results/2026-12-02-h200-e/llama-1b-pyspy/``).

This slot writes every row of every field in one launch (one program per request: its row of
each buffer, cast as stock's ``.to``). Bit-identical to stock for unique indices (the requests
of a batch; with repeated indices both pick an unspecified writer). It steps aside, leaving
SGLang's code, for NGRAM, a step without a draft input, a beam-search tail, an empty batch (DP
idle), a relay that also carries draft probabilities or DSA top-k indices, a source that is not
row-contiguous or lies inside its buffer, a float cast (only equal dtypes and integer widening are
fused), and a CPU tensor outside the Triton interpreter. Hook target: the scheduler's
``_relay_forward_payload`` (AROUND; ``FutureMap.stash`` itself is NGRAM's
``ngram_accept_readback`` target), whose EAGLE-family branch it restates. On the H200 it took
that function from 134 to 108 µs per step (``benchmarks/results/2026-12-03-h200-c/t1-stash-ab/``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from sglang.srt.managers.overlap_utils import RelayPayload

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .triton_replay_launch import replayed
from .upstream_switches import HOST_PRESET

NAME = "fused_relay_stash"
OVERLAP = "sglang.srt.managers.overlap_utils"
TARGET = "sglang.srt.managers.scheduler.Scheduler._relay_forward_payload"
BLOCK = 1024
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64)

# What the hook restates (SGLang 0.5.23: the stash, its lazy buffer inits, the payload); a change refuses the slot.
PINS = (
    (OVERLAP, "FutureMap.stash", "7a98d72c6902171e"),
    (OVERLAP, "FutureMap._maybe_init_forward_bufs", "76213dc67a915c6e"),
    (OVERLAP, "FutureMap._maybe_init_dsa_topk_indices_buf", "6fc6fc2a1177849b"),
    (OVERLAP, "RelayPayload", "0fdf48df80a2cbf9"),
)


@triton.jit
def _copy_row(src, dst, r, d, width, src_stride, BLOCK: tl.constexpr):
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < width
        v = tl.load(src + r * src_stride + cols, mask=m)
        tl.store(dst + d * width + cols, v.to(dst.dtype.element_ty), mask=m)


@triton.jit
def _stash_kernel(
    indices,
    b_src, b_dst, b_stride, p_src, p_dst, p_w, p_stride, i_src, i_dst, i_w, i_stride, h_src, h_dst, h_w, h_stride,
    HAS_B: tl.constexpr, HAS_P: tl.constexpr, HAS_I: tl.constexpr, HAS_H: tl.constexpr,
    P_BLOCK: tl.constexpr, I_BLOCK: tl.constexpr, H_BLOCK: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    d = tl.load(indices + r).to(tl.int64)
    if HAS_B:
        tl.store(b_dst + d, tl.load(b_src + r * b_stride).to(b_dst.dtype.element_ty))
    if HAS_P:
        _copy_row(p_src, p_dst, r, d, p_w, p_stride, P_BLOCK)
    if HAS_I:
        _copy_row(i_src, i_dst, r, d, i_w, i_stride, I_BLOCK)
    if HAS_H:
        _copy_row(h_src, h_dst, r, d, h_w, h_stride, H_BLOCK)


def _geometry(src, dst) -> tuple[int, int, int]:
    """(row width, source row stride, block) of one field; zeros for an absent one."""
    if src is None:
        return 0, 0, 1
    width = dst.numel() // dst.shape[0]
    return width, src.stride(0), min(triton.next_power_of_2(max(width, 1)), BLOCK)


@replayed
def stash_rows(indices, b_src, b_dst, p_src, p_dst, i_src, i_dst, h_src, h_dst):
    """``dst[indices[r]] = src[r]`` (cast to dst's dtype) for each given (src, dst) pair, in one launch."""
    pw, ps, pb = _geometry(p_src, p_dst)
    iw, is_, ib = _geometry(i_src, i_dst)
    hw, hs, hb = _geometry(h_src, h_dst)

    def ptr(t):  # an absent field's pointer is never read (its flag is off)
        return indices if t is None else t

    _stash_kernel[(indices.shape[0],)](
        indices,
        ptr(b_src), ptr(b_dst), 0 if b_src is None else b_src.stride(0),
        ptr(p_src), ptr(p_dst), pw, ps, ptr(i_src), ptr(i_dst), iw, is_, ptr(h_src), ptr(h_dst), hw, hs,
        HAS_B=b_src is not None, HAS_P=p_src is not None, HAS_I=i_src is not None, HAS_H=h_src is not None,
        P_BLOCK=pb, I_BLOCK=ib, H_BLOCK=hb,
    )


def _castable(src: torch.Tensor, dst: torch.Tensor) -> bool:
    if src.dtype == dst.dtype:
        return True
    return src.dtype in _INTS and dst.dtype in _INTS and src.element_size() <= dst.element_size()


def _fits(src, dst, bs: int) -> bool:
    """Whether the kernel writes ``dst[indices] = src.to(dst.dtype)`` exactly as stock does."""
    shape = src.shape
    if shape[0] != bs or shape[1:] != dst.shape[1:] or not dst.is_contiguous() or not _castable(src, dst):
        return False
    if not (len(shape) == 1 or (len(shape) == 2 and src.stride(1) == 1) or src.is_contiguous()):
        return False
    # A source overlapping the buffer it writes would race with the writes (stock writes field by field).
    return src.device == dst.device and not _overlap(src, dst)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` can address: [first, end)."""
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, a1 = _span(a)
    b0, b1 = _span(b)
    return a0 < b1 and b0 < a1


def stash(fm, indices, payload, fallback) -> None:
    """``fm.stash(indices, payload)`` (SGLang's ``FutureMap.stash``) with the index writes fused;
    ``fallback(indices, payload)`` for what the kernel does not take."""
    bs = indices.shape[0]
    if (
        bs == 0 or fm.spec_algo.is_ngram() or payload.bonus_tokens is None
        or not (indices.is_cuda or _INTERPRET) or indices.dim() != 1
        or indices.dtype not in (torch.int32, torch.int64) or not indices.is_contiguous()
    ):
        return fallback(indices, payload)
    # Stock's lazy buffer inits first (idempotent: a fallback below runs them again as no-ops).
    fm._maybe_init_forward_bufs(payload)
    fm._maybe_init_dsa_topk_indices_buf(payload)
    if (fm.draft_probs_buf is not None and payload.draft_probs is not None) or (
        fm.dsa_topk_indices_buf is not None and payload.dsa_topk_indices is not None
    ):
        return fallback(indices, payload)
    relay = fm._relay
    published = relay is not None and payload.bonus_tokens is relay.published_bonus
    fields = {}  # name -> (src, dst): what stock writes for this payload
    if not published:
        fields["b"] = (payload.bonus_tokens, fm.output_tokens_buf)
    if fm.need_topk and payload.topk_p is not None:
        if payload.topk_index is None:
            return fallback(indices, payload)  # stock's assert
        fields["p"] = (payload.topk_p, fm.topk_p_buf)
        fields["i"] = (payload.topk_index, fm.topk_index_buf)
    if fm.need_hidden_states and payload.hidden_states is not None:
        fields["h"] = (payload.hidden_states, fm.hidden_states_buf)
    if not all(_fits(src, dst, bs) for src, dst in fields.values()):
        return fallback(indices, payload)
    if published:
        relay.published_bonus = None
    if fields:
        none = (None, None)
        stash_rows(indices, *fields.get("b", none), *fields.get("p", none), *fields.get("i", none),
                   *fields.get("h", none))
    return None


def relay_hook(original, self, batch, future_indices, batch_result):
    """``Scheduler._relay_forward_payload`` for an EAGLE-family step: the same payload, stashed fused."""
    draft = batch_result.next_draft_input
    if self.spec_algorithm.is_ngram() or draft is None or batch.beam_tail is not None:
        return original(self, batch, future_indices, batch_result)
    fm = self.future_map
    stash(fm, future_indices, RelayPayload.from_draft_input(draft), fm.stash)
    self.beam_coordinator.maybe_select_and_relay(batch, batch_result, chunked_req=self.chunked_req)
    return None


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the code the fused stash restates")


def inert(f) -> str | None:
    ok = bool(f.speculative_algorithm) and f.is_eagle_family()
    return not_speculative(f, "only the EAGLE family relays draft inputs through FutureMap.stash's fields", ok)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (spec-v2 overlap relay stash, EAGLE family)",
    summary="FutureMap.stash's per-field index writes (bonus token, top-k, hidden states) in one Triton launch",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, pinned_sources),
    inert=inert,
    targets=(
        HookTarget(
            TARGET, TargetKind.FUNCTION, hook=relay_hook,
            params=("self", "batch", "future_indices", "batch_result"),
            source_sha="410e7b206eb2b532",
        ),
    ),
)
