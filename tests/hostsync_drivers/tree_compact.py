"""Stock vs plugin drivers for fused_tree_compact, shared by the CPU and GPU tests: SGLang's
real ``_finalize_accept_tree_path`` against the slot's hook on a copy of the same inputs."""

import random
from types import SimpleNamespace

import torch

from hostsync_drivers import eagle_tail
from sglang.srt.speculative import eagle_worker_common as ewc

from sglang_hostsync_plugin.slots import fused_tree_compact as ftc


class RecordingPool:
    """A real MHA pool that also records the (tgt, src) lists each move received."""

    def __init__(self, pool):
        self.pool = pool
        self.moves = []

    def get_kvcache(self):
        return self

    def move_kv_cache(self, tgt, src):
        self.moves.append((tgt.clone(), src.clone()))
        self.pool.move_kv_cache(tgt, src)


def make_pool(size: int, device: str, seed: int):
    return eagle_tail.make_pool(size, 1, device, seed)  # a real MHA pool, random KV


def make_case(rng: random.Random, bs: int, topk: int, steps: int, nd: int | None = None, hidden_dim: int | None = 16,
              hidden_dtype=torch.bfloat16, path_lens=None, scatter_pads: bool = False, device: str = "cpu"):
    """Inputs shaped like run_eagle_verify's at topk > 1: each request's accepted path starts at its
    root and climbs through increasing node ids of its own block; ``accept_index`` is -1 padded.
    ``scatter_pads`` moves some -1 entries inside a path (not what eagle_sample writes; stock's
    packing is then still what both must reproduce)."""
    nd = nd or min(topk * steps + 1, 64)
    s1 = steps + 1
    accept_index = torch.full((bs, s1), -1, dtype=torch.int32)
    accept_lens = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        n = path_lens[b] if path_lens is not None else rng.randint(1, s1)
        nodes = sorted(rng.sample(range(1, nd), n - 1)) if n > 1 else []
        path = [b * nd] + [b * nd + x for x in nodes]
        accept_index[b, :n] = torch.tensor(path, dtype=torch.int32)
        accept_lens[b] = n
        if scatter_pads and n > 1 and rng.random() < 0.5:
            accept_index[b, rng.randrange(1, n)] = -1
    size = bs * nd * 3 + 8
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    out_cache_loc = (torch.randperm(size - 1, generator=gen)[: bs * nd] + 1).to(torch.int64)
    predict = torch.randint(0, 32000, (bs * nd,), dtype=torch.int32, generator=gen)
    hidden = (torch.randn(bs * nd, hidden_dim, generator=gen).to(hidden_dtype) if hidden_dim else None)
    case = dict(accept_index=accept_index, accept_lens=accept_lens, out_cache_loc=out_cache_loc,
                predict=predict, hidden=hidden, bs=bs, nd=nd, size=size)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def _call(fn, case, pool):
    batch = SimpleNamespace(seq_lens=torch.zeros(case["bs"], dtype=torch.int64, device=case["predict"].device),
                            out_cache_loc=case["out_cache_loc"].clone())
    hidden = case["hidden"].clone() if case["hidden"] is not None else None
    logits = SimpleNamespace(hidden_states=hidden)
    predict = fn(batch, case["accept_index"].clone(), case["accept_lens"].clone(), case["predict"].clone(), logits,
                 case["bs"], token_to_kv_pool_allocator=pool, num_draft_tokens=case["nd"])
    return predict, logits.hidden_states


def run_both(case, device: str = "cpu", seed: int = 0):
    """(stock, plugin): each a dict of predict, hidden, the recorded moves and the pool."""
    out = []
    def fell_back(*args, **kwargs):
        raise AssertionError("the hook left this batch to SGLang's code: the comparison would be vacuous")

    for fn in (ewc._finalize_accept_tree_path, lambda *a, **k: ftc.finalize_hook(fell_back, *a, **k)):
        pool = RecordingPool(make_pool(case["size"], device, seed))
        predict, hidden = _call(fn, case, pool)
        out.append(dict(predict=predict, hidden=hidden, moves=pool.moves, pool=pool.pool))
    return out[0], out[1]


def pools_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.k_buffer + a.v_buffer, b.k_buffer + b.v_buffer))


def same(stock, plugin) -> bool:
    return (
        torch.equal(stock["predict"], plugin["predict"])
        and ((stock["hidden"] is None and plugin["hidden"] is None)
             or (stock["hidden"] is not None and plugin["hidden"] is not None
                 and stock["hidden"].dtype == plugin["hidden"].dtype
                 and torch.equal(stock["hidden"].view(torch.uint8), plugin["hidden"].view(torch.uint8))))
        and len(stock["moves"]) == len(plugin["moves"])
        and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(stock["moves"], plugin["moves"]))
        and pools_equal(stock["pool"], plugin["pool"])
    )
