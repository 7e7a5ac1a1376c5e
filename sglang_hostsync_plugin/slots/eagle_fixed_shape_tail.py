"""Slot ``eagle_fixed_shape_tail``: EAGLE's draft-branch tail copy without a host sync.

SGLang 0.5.23 ``duplicate_prefix_tail_to_draft_branches`` (eagle_worker_common.py,
EAGLE with page_size > 1 and topk > 1) gathers the slots with a boolean mask and
branches on ``numel()``: a hidden D2H sync on every draft step. This slot computes
the (target, source) slots for every (request, branch, page offset) lane with one
fixed-shape kernel and hands them to the pool's own ``move_kv_cache``:

- lanes in [0, last_page) carry the stock slots;
- lanes past ``last_page`` carry (0, 0), which copies the pool's padding slot 0 onto
  itself (SGLang routes every dummy KV write there; no request owns it).

Two implementations: Triton (below) and CUDA C++ (``csrc/eagle_tail.cu``, built on
first use). ``SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL`` = ``auto`` (default: the faster one
measured on the H200 where it can be built, else the other; while the csrc module is
still building at ready, Triton serves until it loads) / ``triton`` / ``cuda`` (loaded
before ready).
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl

from .. import csrc
from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .triton_replay_launch import replayed

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "eagle_fixed_shape_tail"
TARGET = "sglang.srt.speculative.eagle_worker_common.duplicate_prefix_tail_to_draft_branches"
ENV_IMPL = "SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL"
# auto takes csrc: faster than Triton in the first H200 run, within noise in the
# rerun (benchmarks/results/2026-11-29-h200-slots*/bench_eagle_tail.txt).


@triton.jit
def _tail_slots_kernel(
    rows, row_stride, prefix_base, last_page, num_new_pages, tgt, src,
    branches, page_size, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    branch = tl.program_id(1) + 1
    off = tl.arange(0, BLOCK)
    in_page = off < page_size
    live = in_page & (off < tl.load(last_page + req))
    base = tl.load(prefix_base + req)
    row = rows + req.to(tl.int64) * row_stride
    s = tl.load(row + base + off, mask=live, other=0)
    t = tl.load(row + base + branch * tl.load(num_new_pages + req) * page_size + off, mask=live, other=0)
    out = (req.to(tl.int64) * branches + branch - 1) * page_size + off
    tl.store(tgt + out, t, mask=in_page)
    tl.store(src + out, s, mask=in_page)


@replayed
def tail_slots_triton(rows, prefix_base, last_page, num_new_pages, topk: int, page_size: int):
    bs = rows.shape[0]
    total = bs * (topk - 1) * page_size
    tgt = torch.empty(total, dtype=rows.dtype, device=rows.device)
    src = torch.empty(total, dtype=rows.dtype, device=rows.device)
    if total:
        _tail_slots_kernel[(bs, topk - 1)](
            rows, rows.stride(0), prefix_base, last_page, num_new_pages, tgt, src,
            topk - 1, page_size, BLOCK=triton.next_power_of_2(page_size),
        )
    return tgt, src


def tail_slots_cuda(rows, prefix_base, last_page, num_new_pages, topk: int, page_size: int):
    tgt, src = csrc.load("eagle_tail").tail_slots(rows, prefix_base, last_page, num_new_pages, topk, page_size)
    return tgt, src


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


def choose_impl(env=None) -> tuple[str, str]:
    """(implementation, why) for this process."""
    return csrc.choose_impl(ENV_IMPL, "triton", os.environ if env is None else env)


_impl: str | None = None


def _tail_slots(rows, prefix_base, last_page, num_new_pages, topk, page_size):
    global _impl
    if _impl is None:
        _impl, why = choose_impl()
        logger.info("hostsync: %s uses the %s kernel (%s)", NAME, _impl, why)
    fn = tail_slots_cuda if _impl == "cuda" else tail_slots_triton
    return fn(rows, _as_int64(prefix_base), _as_int64(last_page), _as_int64(num_new_pages), topk, page_size)


def _path_used(facts) -> bool:
    """SGLang calls the tail copy for EAGLE-family drafts with topk > 1 and page > 1 (or not resolved yet)."""
    return facts.is_eagle_family() and facts.topk != 1 and facts.page_size != 1


def inert(facts) -> str | None:
    if not facts.speculative_algorithm or not facts.is_eagle_family():
        return not_speculative(facts, "only EAGLE-family drafts copy the prefix tail", False)
    if facts.topk == 1:
        return "inert because --speculative-eagle-topk is 1; the tail copy runs only at topk > 1"
    if facts.page_size == 1:
        return "inert because --page-size is 1; the tail copy runs only at page size > 1"
    return None


def kernels(facts) -> tuple[str, ...]:
    return ("eagle_tail",) if _path_used(facts) and choose_impl(facts.env)[0] == "cuda" else ()


def _use_cuda() -> None:
    global _impl
    _impl = "cuda"


def prepare(facts) -> str:
    """Pick the kernel and load it before ready. Under ``auto`` the wait is at most
    ``csrc.AUTO_WAIT_S``: Triton (bit-identical) serves until the csrc module is loaded."""
    global _impl
    if not _path_used(facts):
        return ""
    _impl, why = choose_impl()
    logger.info("hostsync: %s uses the %s kernel (%s)", NAME, _impl, why)
    if _impl != "cuda":
        return "triton kernel"
    if csrc.asked_for_cuda(ENV_IMPL):
        return csrc.load_before_ready("eagle_tail")
    _impl = "triton"
    return csrc.load_in_background(NAME, "eagle_tail", on_loaded=_use_cuda)


def duplicate_prefix_tail(original, token_to_kv_pool, rows, prefix_base, last_page, num_new_pages, topk, page_size):
    if topk <= 1:
        return None
    tgt, src = _tail_slots(rows, prefix_base, last_page, num_new_pages, topk, page_size)
    token_to_kv_pool.move_kv_cache(tgt, src)
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE page>1, topk>1)",
    summary="fixed-shape kernel for the draft-branch prefix-tail KV copy (no numel() sync)",
    default=True,
    precheck=config_precheck(choose_impl),
    inert=inert,
    kernels=kernels,
    prepare=prepare,
    targets=(
        HookTarget(
            TARGET, TargetKind.FUNCTION, hook=duplicate_prefix_tail,
            params=("token_to_kv_pool", "rows", "prefix_base", "last_page", "num_new_pages", "topk", "page_size"),
            source_sha="5db39f8b9fd2ee4f",
        ),
    ),
)
