"""Slot ``greedy_row_argmax``: the greedy speculative argmax over the vocabulary in one
Triton program per row (GPU time per step, where topk 1 is GPU-bound).

SGLang 0.5.23 takes ``torch.argmax(next_token_logits, dim=-1)`` eagerly, outside the graphs,
in two places each step: the greedy verify (``eagle_sample``: EAGLE family and NGRAM, rows =
requests x draft tokens) and the topk-1 draft extend (``EagleDraftWorker._draft_extend_for_decode``,
one row per request). On the H200 with a 128k vocabulary each took about 56 µs of GPU time per
call at concurrency 1 (``benchmarks/profile_step_kernels.py``): torch's reduction over a few
long rows keeps a few SMs busy. This slot recompiles both functions from their pinned source
(``source_edit``) with that call replaced by ``row_argmax``: one program per row streams the
row in 4096-wide blocks, each lane keeping its earliest maximum, and reduces once at the end. The result is
torch's exactly (an index, no arithmetic): the first maximal index, NaN above everything
(the first NaN wins), and ``-0.0 == 0.0``. SGLang's own ``row_argmax`` (kernels/ops/speculative)
is not: its path for up to 64 rows drops NaN (test_sglang_row_argmax_is_not_torch_on_nan_rows).
Anything else (a CPU tensor outside the Triton interpreter, not 2-D, a strided row, an empty
batch, another dtype) calls ``torch.argmax``.
Hook targets: both functions (AROUND, each recompiles SGLang's own function; the draft extend is an
edit site shared with ``draft_extend_topk_graph``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..slot import Slot, SlotKind, config_precheck, not_eagle_or_ngram
from ..source_edit import PinnedEdit
from .edit_sites import DRAFT_EXTEND, DRAFT_EXTEND_SHA, DRAFT_EXTEND_SITE
from .triton_replay_launch import replayed
from .upstream_switches import HOST_PRESET

NAME = "greedy_row_argmax"
SAMPLE = "sglang.srt.speculative.eagle_utils.eagle_sample"
SAMPLE_SHA = "b497c62acadc5e71"
BLOCK = 4096
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

SAMPLE_EDIT = (
    "        target_predict = torch.argmax(next_token_logits, dim=-1)\n"
    "        target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
    "        target_predict = _hostsync_row_argmax(next_token_logits)\n"
    "        target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
)
DRAFT_EXTEND_EDIT = (
    "            ret_topk_index = torch.argmax(\n"
    "                draft_logits_output.next_token_logits, dim=-1, keepdim=True\n"
    "            )\n",
    "            ret_topk_index = _hostsync_row_argmax(\n"
    "                draft_logits_output.next_token_logits, keepdim=True\n"
    "            )\n",
)


@triton.jit
def _row_argmax_kernel(x_ptr, out_ptr, row_stride, width, BLOCK: tl.constexpr):
    # Each lane keeps its own earliest maximum and first NaN; one reduction at the end, so the
    # loop only streams the row.
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * row_stride
    lanes = tl.arange(0, BLOCK)
    best_val = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_idx = lanes
    first_nan = tl.zeros((BLOCK,), tl.int32) + width
    for start in range(0, width, BLOCK):
        cols = start + lanes
        x = tl.load(base + cols, mask=cols < width, other=float("-inf")).to(tl.float32)
        first_nan = tl.where((x != x) & (first_nan == width), cols, first_nan)
        take = x > best_val  # strictly (and never for NaN): a lane keeps its earliest maximum
        best_idx = tl.where(take, cols, best_idx)
        best_val = tl.where(take, x, best_val)
    top = tl.max(best_val, axis=0)
    idx = tl.min(tl.where(best_val == top, best_idx, width), axis=0)  # all -inf: index 0
    nan_at = tl.min(first_nan, axis=0)
    tl.store(out_ptr + row, tl.where(nan_at < width, nan_at, idx).to(tl.int64))


def fits(logits: torch.Tensor) -> bool:
    return ((logits.is_cuda or _INTERPRET) and logits.dim() == 2 and logits.dtype in DTYPES
            and logits.shape[0] > 0 and 0 < logits.shape[1] < 2**31 - BLOCK and logits.stride(1) == 1)


@replayed
def row_argmax(logits: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1, keepdim=keepdim)``, the same int64 values."""
    if not fits(logits):
        return torch.argmax(logits, dim=-1, keepdim=keepdim)
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    _row_argmax_kernel[(logits.shape[0],)](logits, out, logits.stride(0), logits.shape[1], BLOCK=BLOCK, num_warps=8)
    return out.unsqueeze(-1) if keepdim else out


def _bind():
    return {"_hostsync_row_argmax": row_argmax}


SAMPLE_ONCE = PinnedEdit(NAME, SAMPLE, (SAMPLE_EDIT,), _bind, SAMPLE_SHA)
# Shared with draft_extend_topk_graph, which edits the topk > 1 branch of the same function.
DRAFT_EXTEND_ONCE = DRAFT_EXTEND_SITE.edit(NAME, (DRAFT_EXTEND_EDIT,), _bind)


def inert(f) -> str | None:
    return not_eagle_or_ngram(f, "only EAGLE-family and NGRAM verify take the greedy argmax in eagle_sample")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (greedy EAGLE-family / NGRAM verify and topk-1 draft extend)",
    summary="the greedy verify and topk-1 draft-extend argmax in one Triton program per row",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, lambda: SAMPLE_ONCE.check() or DRAFT_EXTEND_ONCE.check()),
    inert=inert,
    targets=(SAMPLE_ONCE.target(), DRAFT_EXTEND_ONCE.target()),
)
