"""Stock vs plugin drivers for eagle_fixed_shape_tail, shared by the CPU and GPU tests."""

import random

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import eagle_worker_common as ewc


def make_pool(size: int, page_size: int, device: str, seed: int) -> MHATokenToKVPool:
    with get_context().override_server_args():
        pool = MHATokenToKVPool(
            size=size, page_size=page_size, dtype=torch.bfloat16, head_num=2, head_dim=8,
            layer_num=3, device=device, enable_memory_saver=False, enable_alt_stream=False,
            enable_kv_cache_copy=device != "cpu",
        )
    if device == "cpu":
        pool.use_native_move_kv_cache = True  # the pointer-based copy kernel needs a GPU
    gen = torch.Generator().manual_seed(seed)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
    return pool


def make_case(rng: random.Random, bs: int, topk: int, page_size: int, last_page=None, num_steps=None, device="cpu"):
    """Random inputs shaped like prepare_for_draft_decode's: rows are distinct non-zero slots."""
    num_steps = num_steps or rng.randint(1, 6)
    seq_lens = []
    for _ in range(bs):
        lp = rng.randrange(page_size) if last_page is None else last_page
        seq_lens.append(page_size * rng.randint(0, 4) + lp)
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    last = seq % page_size
    base = seq - last
    pages = (last + num_steps + page_size - 1) // page_size
    width = int((base + topk * pages * page_size).max()) + page_size
    perm = torch.randperm(bs * width, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) + 1
    rows = perm.view(bs, width).to(torch.int32)
    size = bs * width + page_size
    args = [t.to(device) for t in (rows, base, last, pages)]
    return size, args


def run_both(size, args, topk, page_size, plugin_fn, device="cpu", seed=0):
    stock_pool = make_pool(size, page_size, device, seed)
    plugin_pool = make_pool(size, page_size, device, seed)
    ewc.duplicate_prefix_tail_to_draft_branches(stock_pool, *args, topk, page_size)
    plugin_fn(plugin_pool, *args, topk, page_size)
    return stock_pool, plugin_pool


def pools_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.k_buffer + a.v_buffer, b.k_buffer + b.v_buffer))


def changed(pool, seed, size, page_size, device) -> bool:
    """Whether the call wrote anything (so an all-equal comparison is not vacuous)."""
    return not pools_equal(pool, make_pool(size, page_size, device, seed))
