"""Slot ``fused_draft_page_locs``: EAGLE's paged tree-draft slot gather and prefix-tail lists in
one kernel launch.

SGLang 0.5.23 ``prepare_for_draft`` (eagle_worker_common.py), EAGLE family with page_size > 1
and topk > 1, builds each draft step's KV slots inline with about eighteen small tensor ops
(the ``req_to_token`` row gather, page arithmetic, two ``arange``, the ``gather``) and then
calls ``duplicate_prefix_tail_to_draft_branches``, whose boolean-mask gather syncs on
``numel()`` (``eagle_fixed_shape_tail`` removes that sync, not the ops around it). On the H200
that branch costs about 0.55 ms of host time per step at topk 4 page 16.

This slot recompiles ``prepare_for_draft`` from its pinned source (``source_edit``) with that
block behind one test: where the batch fits, one Triton launch writes ``out_cache_loc`` (the
same slots, in the ``req_to_token`` dtype stock's gather returns) and the fixed-shape
(target, source) prefix-tail lists, which go to the draft pool's own ``move_kv_cache``; lanes
past ``last_page`` carry (0, 0), which copies the pool's padding slot 0 onto itself, as in
``eagle_fixed_shape_tail``. Anything else (a CPU tensor outside the Triton interpreter, a
non-contiguous ``req_to_token`` row, a page over 1024 or more than 64 draft steps) runs
SGLang's own block, unchanged. With this slot applied, the tail slot's hook is not reached on
this path. Hook target: ``prepare_for_draft`` (AROUND, recompiles SGLang's own function).
"""

from __future__ import annotations

import os
import textwrap

import torch
import triton
import triton.language as tl

from ..slot import Slot, SlotKind, config_precheck, not_speculative
from ..source_edit import PinnedEdit
from .triton_replay_launch import replayed
from .upstream_switches import HOST_PRESET

NAME = "fused_draft_page_locs"
TARGET = "sglang.srt.speculative.eagle_worker_common.prepare_for_draft"
PREPARE_SHA = "cce2ddd443d964f8"
MAX_PAGE = 1024
MAX_STEPS = 64
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# The tail helper's semantics the kernel restates (SGLang 0.5.23).
PINS = (("sglang.srt.speculative.eagle_worker_common", "duplicate_prefix_tail_to_draft_branches",
         "5db39f8b9fd2ee4f"),)

STOCK_BLOCK = """            rows = req_to_token_pool.req_to_token[batch.req_pool_indices.long()]
            seq_lens = batch.seq_lens.to(torch.int64)
            last_page = seq_lens % page_size
            prefix_base = seq_lens - last_page
            num_new_pages = (last_page + num_steps + page_size - 1) // page_size
            topk_ids = torch.arange(topk, device=rows.device, dtype=torch.int64).view(
                1, topk
            )
            starts = (
                prefix_base.view(bs, 1)
                + topk_ids * (num_new_pages.view(bs, 1) * page_size)
                + last_page.view(bs, 1)
            )
            steps = torch.arange(num_steps, device=rows.device, dtype=torch.int64).view(
                1, 1, num_steps
            )
            pos = (starts.view(bs, topk, 1) + steps).reshape(bs, topk * num_steps)
            batch.out_cache_loc = torch.gather(rows, 1, pos).reshape(-1).contiguous()

            # Each branch's page-aligned region starts with `last_page` hole slots
            # overlapping the prefix tail page; duplicate the real prefix-tail KV
            # into them so whole-page reads stay coherent (see helper docstring).
            duplicate_prefix_tail_to_draft_branches(
                draft_model_runner.token_to_kv_pool,
                rows,
                prefix_base,
                last_page,
                num_new_pages,
                topk,
                page_size,
            )
"""
EDIT = (STOCK_BLOCK, (
    "            if _hostsync_page_locs_fit(batch, req_to_token_pool, topk, num_steps, page_size):\n"
    "                batch.out_cache_loc = _hostsync_page_locs(\n"
    "                    batch, req_to_token_pool, draft_model_runner.token_to_kv_pool, topk, num_steps, page_size)\n"
    "            else:\n" + textwrap.indent(STOCK_BLOCK, "    ", lambda line: line.strip() != "")))


@triton.jit
def _page_locs_kernel(
    req_to_token, row_stride, req_pool_indices, seq_lens, out_loc, tgt, src,
    topk, num_steps, page_size, STEPS_P: tl.constexpr, PAGE_P: tl.constexpr,
):
    r = tl.program_id(0)
    t = tl.program_id(1)
    seq = tl.load(seq_lens + r).to(tl.int64)
    last = seq % page_size
    base = seq - last
    pages = (last + num_steps + page_size - 1) // page_size
    row = req_to_token + tl.load(req_pool_indices + r).to(tl.int64) * row_stride
    branch = base + t * pages * page_size  # this branch's page-aligned region
    s = tl.arange(0, STEPS_P)
    ms = s < num_steps
    slots = tl.load(row + branch + last + s, mask=ms)
    tl.store(out_loc + (r * topk + t).to(tl.int64) * num_steps + s, slots, mask=ms)
    if t > 0:
        # Branch t's first-page holes [0, last) take the prefix tail; other lanes (0, 0).
        o = tl.arange(0, PAGE_P)
        in_page = o < page_size
        live = in_page & (o < last)
        lane = (r * (topk - 1) + t - 1).to(tl.int64) * page_size + o
        tl.store(tgt + lane, tl.load(row + branch + o, mask=live, other=0), mask=in_page)
        tl.store(src + lane, tl.load(row + base + o, mask=live, other=0), mask=in_page)


def page_locs_fit(batch, req_to_token_pool, topk: int, num_steps: int, page_size: int) -> bool:
    rt = req_to_token_pool.req_to_token
    return ((batch.seq_lens.is_cuda or _INTERPRET) and topk > 1 and 1 < page_size <= MAX_PAGE
            and 0 < num_steps <= MAX_STEPS and rt.dim() == 2 and rt.stride(1) == 1
            and batch.seq_lens.is_contiguous() and batch.req_pool_indices.is_contiguous())


def page_locs(batch, req_to_token_pool, token_to_kv_pool, topk: int, num_steps: int, page_size: int):
    """``out_cache_loc`` as stock's gather makes it; the prefix tail moved in ``token_to_kv_pool``."""
    out, tgt, src = page_locs_launch(req_to_token_pool.req_to_token, batch.req_pool_indices, batch.seq_lens,
                                     topk, num_steps, page_size)
    if batch.seq_lens.shape[0]:
        token_to_kv_pool.move_kv_cache(tgt, src)
    return out


@replayed
def page_locs_launch(rt, req_pool_indices, seq_lens, topk: int, num_steps: int, page_size: int):
    """(out_cache_loc, tail targets, tail sources): one launch over tensors only (replayable)."""
    bs = seq_lens.shape[0]
    out = torch.empty(bs * topk * num_steps, dtype=rt.dtype, device=rt.device)
    lanes = bs * (topk - 1) * page_size
    tgt = torch.empty(lanes, dtype=rt.dtype, device=rt.device)
    src = torch.empty(lanes, dtype=rt.dtype, device=rt.device)
    if bs:
        _page_locs_kernel[(bs, topk)](
            rt, rt.stride(0), req_pool_indices, seq_lens, out, tgt, src, topk, num_steps, page_size,
            STEPS_P=triton.next_power_of_2(num_steps), PAGE_P=triton.next_power_of_2(page_size),
        )
    return out, tgt, src


PREPARE = PinnedEdit(NAME, TARGET, (EDIT,),
                     lambda: {"_hostsync_page_locs_fit": page_locs_fit, "_hostsync_page_locs": page_locs}, PREPARE_SHA)


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the tail semantics the kernel restates")


def inert(f) -> str | None:
    if not f.speculative_algorithm or not f.is_eagle_family():
        return not_speculative(f, "only EAGLE-family drafts gather paged tree slots", False)
    if f.topk == 1:
        return "inert because --speculative-eagle-topk is 1; the paged tree branch runs only at topk > 1"
    if f.page_size == 1:
        return "inert because --page-size is 1; the paged tree branch runs only at page size > 1"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE paged tree-draft KV slots, page > 1, topk > 1)",
    summary="paged tree-draft slot gather and prefix-tail lists in one Triton launch (prepare_for_draft)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, lambda: pinned_sources() or PREPARE.check()),
    inert=inert,
    targets=(PREPARE.target(params=("draft_input", "req_to_token_pool", "batch", "cuda_graph_runner",
                                    "draft_model_runner", "topk", "num_steps", "target_translator",
                                    "num_draft_tokens")),),
)
