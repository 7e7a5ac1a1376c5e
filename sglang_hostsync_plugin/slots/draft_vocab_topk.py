"""Slot ``draft_vocab_topk``: the EAGLE draft's top-k over the vocabulary (topk > 1) through a
candidate pass, torch's own top-k over the candidates (GPU time per step, where topk 4
is GPU-bound).

At ``--speculative-eagle-topk`` > 1 SGLang 0.5.23 takes ``fast_topk(probs, topk, dim=-1)``
(``torch.topk``) over the whole vocabulary three times a step (draft extend, draft steps). For a
few 128k-wide rows torch runs its multi-block radix select: on the H200 about 19 kernels and 3
memsets, 72-80 µs of GPU time per call at 1-8 rows; in a real server at topk 4 page 16 its top-k took
162 µs of an 8.1 ms step with one request and 248 µs of a 10.2 ms step with eight
(``benchmarks/profile_step_kernels.py``).

Here one Triton program per 4096-wide block of a row picks that block's k largest elements in
torch's order (the radix key torch's top-k compares: NaN above everything, ``-0.0`` below
``0.0``; equal keys by lower index) and writes them in index order; then ``torch.topk`` runs on
the candidates and their indices are mapped back. The candidates hold every element torch would
select and keep their index order, and torch's top-k writes the elements above its k-th value
and then the k-th value's first ones, both in index order, before sorting k of them; so values
and indices are torch's exactly (ties included), which the GPU test checks against ``torch.topk``.
Anything else (k < 2, a row under two blocks or over MAX_BLOCKS, a last block with fewer than k elements, another
dtype, a strided row, autograd, ``torch.compile`` tracing, a CPU tensor outside the Triton
interpreter) calls SGLang's ``fast_topk``.
Hook target: ``fast_topk`` (AROUND; SGLang's modules bind it by name, rebound by the registry).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .upstream_switches import HOST_PRESET

NAME = "draft_vocab_topk"
TARGET = "sglang.srt.utils.common.fast_topk"
TARGET_SHA = "9f726d9c84d83fa4"
BLOCK = 4096
MAX_K = 16
MAX_BLOCKS = 65535  # the blocks of a row are the launch grid's second dimension (CUDA's limit)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _block_topk_kernel(x_ptr, vals_ptr, idx_ptr, row_stride, width, K: tl.constexpr, KP: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < width
    x = tl.load(x_ptr + row * row_stride + cols, mask=valid, other=0.0)
    bits = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    # torch's radix key (TopKTypeConfig<float>::convert): order-preserving, every NaN the largest.
    key = tl.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    key = tl.where(x != x, 0xFFFFFFFF, key)
    key = tl.where(valid, key, -1)
    slots = tl.arange(0, KP)
    sel = tl.zeros((KP,), tl.int32) + width  # unused slots sort last
    for j in tl.static_range(K):
        top = tl.max(key, axis=0)
        at = tl.min(tl.where(key == top, cols, width), axis=0)  # equal keys: the lower index
        sel = tl.where(slots == j, at, sel)
        key = tl.where(cols == at, -1, key)
    # Stored in index order, so the candidates of a row keep the row's order.
    rank = tl.sum((sel[None, :] < sel[:, None]).to(tl.int32), axis=1)
    keep = slots < K
    out = row * (tl.num_programs(1) * K) + blk * K + rank
    tl.store(vals_ptr + out, tl.load(x_ptr + row * row_stride + sel, mask=keep), mask=keep)
    tl.store(idx_ptr + out, sel.to(tl.int64), mask=keep)


def fits(values, k, dim) -> bool:
    """Whether the candidate pass gives ``torch.topk(values, k, dim)`` exactly (every block holds
    at least k elements)."""
    if not isinstance(values, torch.Tensor) or not isinstance(k, int) or dim not in (-1, 1):
        return False
    if values.dim() != 2 or values.dtype != torch.float32 or not (values.is_cuda or _INTERPRET):
        return False
    rows, width = values.shape
    tail = width % BLOCK
    return (2 <= k <= MAX_K and rows > 0 and 2 * BLOCK <= width <= MAX_BLOCKS * BLOCK and (tail == 0 or tail >= k)
            and values.stride(1) == 1 and not values.requires_grad)


def vocab_topk(values: torch.Tensor, k: int):
    """``torch.topk(values, k, dim=-1)`` for rows that ``fits``: the same values and indices."""
    rows, width = values.shape
    blocks = triton.cdiv(width, BLOCK)
    cand = torch.empty((rows, blocks * k), dtype=values.dtype, device=values.device)
    cand_idx = torch.empty((rows, blocks * k), dtype=torch.int64, device=values.device)
    _block_topk_kernel[(rows, blocks)](values, cand, cand_idx, values.stride(0), width, K=k,
                                       KP=triton.next_power_of_2(k), BLOCK=BLOCK, num_warps=4)
    top, at = torch.topk(cand, k, dim=-1)
    return torch.return_types.topk((top, torch.gather(cand_idx, 1, at)))


def fast_topk_hook(original, values, topk, dim):
    """SGLang's ``fast_topk(values, topk, dim)``: vocabulary-wide rows through ``vocab_topk``."""
    if torch.compiler.is_compiling() or not fits(values, topk, dim):
        return original(values, topk, dim)
    return vocab_topk(values, topk)


def inert(f) -> str | None:
    if not (f.speculative_algorithm and f.is_eagle_family()):
        return not_speculative(f, "only the EAGLE family's draft takes a vocabulary-wide top-k", False)
    if f.topk == 1:
        return "inert because --speculative-eagle-topk is 1: fast_topk takes torch.max"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE draft top-k over the vocabulary at topk > 1)",
    summary="the draft's vocabulary-wide top-k through a per-block candidate pass and torch's top-k of the candidates",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None),
    inert=inert,
    targets=(
        HookTarget(TARGET, TargetKind.FUNCTION, hook=fast_topk_hook, params=("values", "topk", "dim"),
                   source_sha=TARGET_SHA),
    ),
)
