"""Slot ``fused_tree_compact``: EAGLE tree verify's accepted-path compaction in one kernel
launch plus the pool's own KV move.

After each tree verify (EAGLE family, topk > 1) SGLang 0.5.23 runs
``_finalize_accept_tree_path`` (eagle_worker_common.py): ``move_accept_tokens_to_target_kvcache``
builds the (target, source) slot lists with two ``torch.zeros``, an ``arange``, a ``zeros_like``
and two Triton launches (``fill_front_out_cache_loc_func``, ``fill_accept_out_cache_loc_func``),
moves the KV rows with ``kvcache.move_kv_cache``, then ``_compact_accept_to_front`` gathers the
accepted path of ``predict`` and of the hidden states to the front of each request's block
(about six tensor ops each). On the H200 that is about 0.45 ms of host time per step at topk 4.

This slot computes both slot lists and both compactions in one Triton launch and hands the
lists to the same ``kvcache.move_kv_cache`` (so every KV pool layout keeps SGLang's own move).
Bit-identical to stock, including what stock writes where nothing reads:

- the source list is the slots of ``accept_index``'s non ``-1`` entries packed in row-major
  order, the target list request i's first ``accept_lens[i]`` window slots packed in request
  order, both zero-filled past their count (stock's ``torch.zeros``);
- a compacted row at a padded path position (``accept_index == -1``) holds node 0's row
  (stock's ``clamp(min=0)``), and rows past the path keep their own.

It steps aside, leaving SGLang's code, for a non-CUDA tensor (the CPU engine; the tests run the
kernel under ``TRITON_INTERPRET=1``), a non-contiguous or mis-shaped input, and a batch past
``MAX_LOCS`` accepted positions or ``MAX_WINDOW`` verify slots. Hook target: ``_finalize_accept_tree_path`` (AROUND).
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl
from sglang.srt.utils.async_probe import maybe_detect_oob

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .triton_replay_launch import replayed
from .upstream_switches import HOST_PRESET

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "fused_tree_compact"
COMMON = "sglang.srt.speculative.eagle_worker_common"
TARGET = f"{COMMON}._finalize_accept_tree_path"
# One program builds both slot lists in registers: bs * (spec_steps + 1) accepted positions and
# the bs x window block of verify slots stay bounded (larger batches run SGLang's code).
MAX_LOCS = 1024
MAX_WINDOW = 4096
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# What the kernel restates (SGLang 0.5.23); a change upstream refuses the slot.
PINS = (
    (COMMON, "_compact_accept_to_front", "fe8ca76699043e32"),
    ("sglang.srt.speculative.spec_utils", "move_accept_tokens_to_target_kvcache", "9f5d864b8ab0e97c"),
    ("sglang.kernels.ops.speculative.cache_locs", "fill_front_out_cache_loc_func", "219d8596532f4b96"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs", "4191253499ecf965"),
    ("sglang.kernels.ops.speculative.eagle", "fill_accept_out_cache_loc_func", "f2d2ccad169e141b"),
    ("sglang.kernels.ops.speculative.eagle", "fill_accept_out_cache_loc", "20234cb34ff0008f"),
)


@triton.jit
def _tree_compact_kernel(
    accept_index, accept_lens, out_cache_loc, tgt, src,
    x_pred, out_pred, x_hid, out_hid, hid_dim,
    bs, nd, s1, win,
    HAS_HIDDEN: tl.constexpr, LOCS: tl.constexpr, BS_P: tl.constexpr, WIN_P: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = bs * nd
    if pid < rows:
        # One compacted row: position k of request b takes path node accept_index[b, k].
        b = pid // nd
        k = pid % nd
        row = pid.to(tl.int64)
        if k < s1:
            row = tl.maximum(tl.load(accept_index + b * s1 + k), 0).to(tl.int64)
        tl.store(out_pred + pid, tl.load(x_pred + row))
        if HAS_HIDDEN:
            for start in range(0, hid_dim, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                m = cols < hid_dim
                v = tl.load(x_hid + row * hid_dim + cols, mask=m)
                tl.store(out_hid + pid.to(tl.int64) * hid_dim + cols, v, mask=m)
    else:
        n = bs * s1
        p = tl.arange(0, LOCS)
        inb = p < n
        # Sources: the slots of the non -1 accept_index entries, packed (fill_accept_out_cache_loc).
        a = tl.load(accept_index + p, mask=inb, other=-1)
        valid = a != -1
        v32 = valid.to(tl.int32)
        rank = tl.cumsum(v32, axis=0) - v32
        slot = tl.load(out_cache_loc + a, mask=valid, other=0)
        tl.store(src + rank, slot, mask=valid)
        tl.store(src + p, tl.zeros_like(slot), mask=inb & (p >= tl.sum(v32, axis=0)))
        # Targets: request r's first accept_lens[r] window slots, packed (fill_front_out_cache_loc).
        r = tl.arange(0, BS_P)
        front = tl.load(accept_lens + r, mask=r < bs, other=0)
        first = tl.cumsum(front, axis=0) - front
        j = tl.arange(0, WIN_P)
        at = first[:, None] + j[None, :]
        live = (j[None, :] < front[:, None]) & (r[:, None] < bs) & (at < n)
        win_slot = tl.load(out_cache_loc + r[:, None] * win + j[None, :], mask=live, other=0)
        tl.store(tgt + at, win_slot, mask=live)
        tl.store(tgt + p, tl.zeros_like(slot), mask=inb & (p >= tl.sum(front, axis=0)))


def compact(accept_index, accept_lens, out_cache_loc, predict, hidden, bs: int, num_draft_tokens: int):
    """(tgt_cache_loc, accept_out_cache_loc, predict, hidden) as stock computes them; hidden may be None."""
    if hidden is None:  # STANDALONE: a replayed wrapper must return tensors only
        return (*compact_plain(accept_index, accept_lens, out_cache_loc, predict, bs, num_draft_tokens), None)
    return compact_hidden(accept_index, accept_lens, out_cache_loc, predict, hidden, bs, num_draft_tokens)


@replayed
def compact_plain(accept_index, accept_lens, out_cache_loc, predict, bs: int, num_draft_tokens: int):
    """(tgt_cache_loc, accept_out_cache_loc, predict) without hidden states."""
    return _launch(accept_index, accept_lens, out_cache_loc, predict, None, bs, num_draft_tokens)[:3]


@replayed
def compact_hidden(accept_index, accept_lens, out_cache_loc, predict, hidden, bs: int, num_draft_tokens: int):
    """(tgt_cache_loc, accept_out_cache_loc, predict, hidden)."""
    return _launch(accept_index, accept_lens, out_cache_loc, predict, hidden, bs, num_draft_tokens)


def _launch(accept_index, accept_lens, out_cache_loc, predict, hidden, bs: int, num_draft_tokens: int):
    s1 = accept_index.shape[1]
    n = bs * s1
    win = out_cache_loc.numel() // bs
    tgt = torch.empty(n, dtype=torch.int64, device=predict.device)
    src = torch.empty(n, dtype=torch.int64, device=predict.device)
    out_pred = torch.empty_like(predict)
    out_hid = torch.empty_like(hidden) if hidden is not None else None
    hid_dim = hidden.numel() // hidden.shape[0] if hidden is not None else 0
    _tree_compact_kernel[(bs * num_draft_tokens + 1,)](
        accept_index, accept_lens, out_cache_loc, tgt, src,
        predict, out_pred, hidden if hidden is not None else predict, out_hid if hidden is not None else out_pred,
        hid_dim, bs, num_draft_tokens, s1, win,
        HAS_HIDDEN=hidden is not None, LOCS=triton.next_power_of_2(n), BS_P=triton.next_power_of_2(bs),
        WIN_P=triton.next_power_of_2(win), BLOCK=min(triton.next_power_of_2(max(hid_dim, 1)), 1024),
    )
    return tgt, src, out_pred, out_hid


def fits(batch, accept_index, accept_lens, predict, hidden, bs: int, num_draft_tokens: int) -> bool:
    """The shapes stock's code takes for granted, on tensors this kernel can read."""
    ocl = batch.out_cache_loc
    return (
        (predict.is_cuda or _INTERPRET) and bs > 0
        and accept_index.dim() == 2 and accept_index.shape[0] == bs and 0 < accept_index.shape[1] <= num_draft_tokens
        and bs * accept_index.shape[1] <= MAX_LOCS and accept_index.is_contiguous()
        and accept_lens.numel() == bs and accept_lens.is_contiguous()
        and ocl.dim() == 1 and ocl.is_contiguous() and ocl.numel() % bs == 0 and ocl.numel() <= MAX_WINDOW
        and predict.dim() == 1 and predict.numel() == bs * num_draft_tokens and predict.is_contiguous()
        and (hidden is None or (hidden.shape[0] == predict.numel() and hidden.is_contiguous()))
    )


def finalize_hook(original, batch, accept_index, accept_lens, predict, logits_output, bs, *,
                  token_to_kv_pool_allocator, num_draft_tokens):
    hidden = logits_output.hidden_states
    if not fits(batch, accept_index, accept_lens, predict, hidden, bs, num_draft_tokens):
        return original(batch, accept_index, accept_lens, predict, logits_output, bs,
                        token_to_kv_pool_allocator=token_to_kv_pool_allocator, num_draft_tokens=num_draft_tokens)
    maybe_detect_oob(accept_index, -1, batch.out_cache_loc.size(0), "spec v2 move_accept_tokens accept_index")
    tgt, src, predict, hidden = compact(accept_index, accept_lens, batch.out_cache_loc, predict, hidden, bs,
                                        num_draft_tokens)
    token_to_kv_pool_allocator.get_kvcache().move_kv_cache(tgt, src)
    if hidden is not None:
        logits_output.hidden_states = hidden
    return predict


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the code the fused kernel restates")


def inert(f) -> str | None:
    if not f.speculative_algorithm or not f.is_eagle_family():
        return not_speculative(f, "only EAGLE-family tree verify compacts the accepted path", False)
    if f.topk == 1:
        return "inert because --speculative-eagle-topk is 1; the accepted path is already the front chain"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE tree verify, topk > 1: accepted-path compaction)",
    summary="accepted-path compaction after tree verify (slot lists, predict, hidden) in one Triton launch",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, pinned_sources),
    inert=inert,
    targets=(
        HookTarget(
            TARGET, TargetKind.FUNCTION, hook=finalize_hook,
            params=("batch", "accept_index", "accept_lens", "predict", "logits_output", "bs",
                    "token_to_kv_pool_allocator", "num_draft_tokens"),
            source_sha="017df0344e1bf4dc",
        ),
    ),
)
