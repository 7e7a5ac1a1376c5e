"""Slot ``chain_tree_full_mask``: the topk 1 verify tree with a full attention mask (the triton
backend's) in one Triton launch.

At ``--speculative-eagle-topk`` 1 the draft is a chain. SGLang 0.5.23 builds its verify input in
one launch (``build_chain_tree``) only for backends that read the short ``QLEN_ONLY`` mask; for the
``FULL_MASK`` backends (triton) ``build_eagle_verify_input`` takes ``build_tree_kernel_efficient``:
a ``torch.cat`` of the tokens, the mask fill, a ``torch.full`` of the retrieve buffers, an empty
positions tensor and the general tree kernel, which walks parent lists the chain does not need.
In a real STANDALONE topk 1 server on the H200 that function held about 1.6% of the scheduler
thread's busy samples (about 120 µs of host work per step; py-spy, 2026-12-04 14:37,
``benchmarks/results/2026-12-04-h200-g/pyspy-t1/``), the largest single function left there.

Here, under SGLang's own chain conditions (those ``build_chain_tree`` is called under: topk 1,
``num_verify_tokens == spec_steps + 1``, draft tokens ``(bs, spec_steps)``) with ``FULL_MASK``,
the mask keeps SGLang's fill (or allocation) and one Triton program per request writes what the
tree kernel writes for a chain: the tokens (bonus, then the draft's), positions ``seq_len + d``,
the retrieve index / next token / next sibling lists, and the mask's tree cells (token ``d``
attends tree tokens ``0..d``) at the request's offset in the full layout (each request's rows are
``seq_len + num_verify_tokens`` wide, after the rows of the requests before it). Everything else,
and any other case (topk > 1, other mask modes, an empty batch, a CPU tensor outside the Triton
interpreter), is SGLang's function. The launch goes through ``triton_replay_launch``'s replay
when that slot is applied. Hook target: ``eagle_utils.build_tree_kernel_efficient`` (AROUND).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .triton_replay_launch import promote, replayed
from .upstream_switches import HOST_PRESET

NAME = "chain_tree_full_mask"
TARGET = "sglang.srt.speculative.eagle_utils.build_tree_kernel_efficient"
TARGET_SHA = "4663a0ad18708537"
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# What the kernel restates (SGLang 0.5.23): the tree kernel's outputs for a chain, the chain
# conditions SGLang's own one-launch path is taken under, and its topk 1 parent lists.
PINS = (
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_build_tree_kernel_efficient_triton", "3b21001c6db6e1fc"),
    ("sglang.kernels.ops.speculative.eagle", "build_chain_tree", "976255c1276a5a26"),
    ("sglang.srt.speculative.eagle_worker_common", "build_eagle_verify_input", "710372aeb30979fe"),
)


@triton.jit
def _chain_tree_kernel(bonus, draft, seq, mask, tokens, positions, retrieve, BS,
                       WIDTH: tl.constexpr, WP: tl.constexpr, BONUS_STRIDE: tl.constexpr,
                       DRAFT_ROW: tl.constexpr, DRAFT_COL: tl.constexpr, SEQ_STRIDE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    length = tl.load(seq + b * SEQ_STRIDE).to(tl.int64)
    before = tl.zeros((), dtype=tl.int64)  # the mask rows of the requests before this one
    for j in range(0, b):
        before += tl.load(seq + j * SEQ_STRIDE).to(tl.int64)
    d = tl.arange(0, WP)
    live = d < WIDTH
    first = tl.load(bonus + b * BONUS_STRIDE)
    rest = tl.load(draft + b * DRAFT_ROW + (d - 1) * DRAFT_COL, live & (d > 0), other=0)
    out = b * WIDTH + d
    kind = tokens.dtype.element_ty  # torch.cat's promotion of the two token dtypes
    tl.store(tokens + out, tl.where(d == 0, first.to(kind), rest.to(kind)), live)
    tl.store(positions + out, length + d, live)
    tl.store(retrieve + out, out, live)
    tl.store(retrieve + BS * WIDTH + out, tl.where(d + 1 < WIDTH, d + 1, -1), live)
    tl.store(retrieve + 2 * BS * WIDTH + out, tl.full((WP,), -1, tl.int64), live)
    row = d[:, None]
    col = d[None, :]
    start = WIDTH * WIDTH * b + before * WIDTH + length  # row 0's first tree column
    cell = start + row * (length + WIDTH) + col
    tl.store(mask + cell, (col <= row).to(mask.dtype.element_ty), (row < WIDTH) & (col < WIDTH))


@replayed
def chain_tree(bonus_tokens, draft_tokens, seq_lens, mask, token_dtype: torch.dtype):
    """(tokens, positions, retrieve (3, bs, width)); writes the mask's tree cells in place."""
    bs, steps = draft_tokens.shape
    width = steps + 1
    device = seq_lens.device
    tokens = torch.empty((bs * width,), dtype=token_dtype, device=device)
    positions = torch.empty((bs * width,), dtype=torch.int64, device=device)
    retrieve = torch.empty((3, bs, width), dtype=torch.int64, device=device)
    _chain_tree_kernel[(bs,)](bonus_tokens, draft_tokens, seq_lens, mask, tokens, positions, retrieve, bs,
                              WIDTH=width, WP=triton.next_power_of_2(width), BONUS_STRIDE=bonus_tokens.stride(0),
                              DRAFT_ROW=draft_tokens.stride(0), DRAFT_COL=draft_tokens.stride(1),
                              SEQ_STRIDE=seq_lens.stride(0))
    return tokens, positions, retrieve


def fits(bonus_tokens, draft_tokens, seq_lens, topk, spec_steps, num_verify_tokens, tree_mask_mode,
         tree_mask_buf) -> bool:
    """SGLang's chain conditions with the full mask, on tensors this kernel reads."""
    bs = seq_lens.numel()
    return (
        topk == 1 and num_verify_tokens == spec_steps + 1 and tree_mask_mode == TreeMaskMode.FULL_MASK
        and (seq_lens.is_cuda or _INTERPRET) and bs > 0 and seq_lens.dim() == 1
        # SGLang's CUDA tree kernel takes int64 lengths only (it raises on others): those stay SGLang's.
        and seq_lens.dtype == torch.int64
        and bonus_tokens.dim() == 1 and bonus_tokens.numel() == bs
        and draft_tokens.dim() == 2 and tuple(draft_tokens.shape) == (bs, spec_steps)
        and bonus_tokens.device == draft_tokens.device == seq_lens.device
        and (tree_mask_buf is None or (tree_mask_buf.is_contiguous() and tree_mask_buf.device == seq_lens.device))
    )


def build_tree_hook(original, bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, seq_lens_sum,
                    topk, spec_steps, num_verify_tokens, tree_mask_mode=TreeMaskMode.FULL_MASK,
                    tree_mask_buf=None, fill_prefix_mask=True):
    if not fits(bonus_tokens, draft_tokens, seq_lens, topk, spec_steps, num_verify_tokens, tree_mask_mode,
                tree_mask_buf):
        return original(bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, seq_lens_sum, topk,
                        spec_steps, num_verify_tokens, tree_mask_mode, tree_mask_buf, fill_prefix_mask)
    bs = seq_lens.numel()
    if tree_mask_buf is not None:  # SGLang's own fill (or none) of the buffer, as stock
        tree_mask = tree_mask_buf
        if fill_prefix_mask:
            tree_mask.fill_(True)
    else:
        shape = (seq_lens_sum * num_verify_tokens + num_verify_tokens * num_verify_tokens * bs,)
        tree_mask = (torch.full(shape, True, dtype=torch.bool, device=seq_lens.device) if fill_prefix_mask
                     else torch.empty(shape, dtype=torch.bool, device=seq_lens.device))
    token_dtype = promote(bonus_tokens.dtype, draft_tokens.dtype)  # torch.cat's result dtype
    # A mask allocated here is sized by this step's lengths: a new replay signature every step, whose
    # recording costs more than the JIT dispatch, so that case launches through the JIT.
    launch = chain_tree if tree_mask_buf is not None else chain_tree.__wrapped__
    tokens, positions, retrieve = launch(bonus_tokens, draft_tokens, seq_lens, tree_mask, token_dtype)
    retrieve_index, retrieve_next_token, retrieve_next_sibling = retrieve
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the chain's tree the kernel restates")


def inert(f) -> str | None:
    if not f.speculative_algorithm or not f.is_eagle_family():
        return not_speculative(f, "only EAGLE-family drafts build a verify tree", False)
    if f.topk is not None and f.topk != 1:
        return "inert because --speculative-eagle-topk is not 1: the draft is a tree, not a chain"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE topk 1 verify input, full-mask backends)",
    summary="the topk 1 verify tree (tokens, positions, retrieve lists, full-mask tree cells) in one Triton launch",
    default=False,
    # In the preset since its GPU test passed and a real server showed verify_input 0.81x beyond the
    # host speed, outputs identical (benchmarks/results/2026-12-05-h200-c/t1-chain/).
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, pinned_sources),
    inert=inert,
    targets=(
        HookTarget(
            TARGET, TargetKind.FUNCTION, hook=build_tree_hook,
            params=("bonus_tokens", "parent_list", "top_scores_index", "draft_tokens", "seq_lens", "seq_lens_sum",
                    "topk", "spec_steps", "num_verify_tokens", "tree_mask_mode", "tree_mask_buf", "fill_prefix_mask"),
            source_sha=TARGET_SHA,
        ),
    ),
)
