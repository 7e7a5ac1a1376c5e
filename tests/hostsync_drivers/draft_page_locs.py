"""Stock vs plugin drivers for fused_draft_page_locs, shared by the CPU and GPU tests: SGLang's
real ``prepare_for_draft`` and the slot's recompiled copy of it, on the same paged tree batch,
with ``ForwardBatch.init_new`` stood in by a recorder (the part after the edited block)."""

import random
from types import SimpleNamespace

import torch

from hostsync_drivers import eagle_tail
from sglang.srt.speculative import eagle_worker_common as ewc

from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl


class InitNew:
    """Stands in for ``ForwardBatch`` in eagle_worker_common while a driver runs."""

    calls: list = []

    @staticmethod
    def init_new(batch, model_runner, **kwargs):
        InitNew.calls.append(kwargs)
        return SimpleNamespace(kind="forward batch")


def make_case(rng: random.Random, bs: int, topk: int, page_size: int, num_steps: int, last_page=None,
              device: str = "cpu"):
    """A req_to_token table (distinct non-zero slots, rows in random pool order) and seq lens."""
    seq = []
    for _ in range(bs):
        lp = rng.randrange(page_size) if last_page is None else last_page
        seq.append(page_size * rng.randint(0, 4) + lp)
    seq_lens = torch.tensor(seq, dtype=torch.int64)
    last = seq_lens % page_size
    pages = (last + num_steps + page_size - 1) // page_size
    width = int((seq_lens - last + topk * pages * page_size).max()) + page_size
    pool_rows = bs + 3
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    req_to_token = (torch.randperm(pool_rows * width, generator=gen) + 1).view(pool_rows, width).to(torch.int32)
    req_pool_indices = torch.randperm(pool_rows, generator=gen)[:bs].to(torch.int64)
    size = pool_rows * width + page_size
    case = dict(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens)
    case = {k: v.to(device) for k, v in case.items()}
    return dict(case, bs=bs, topk=topk, page_size=page_size, num_steps=num_steps, size=size, device=device)


def _run(fn, case, pool):
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False), seq_lens=case["seq_lens"].clone(),
        req_pool_indices=case["req_pool_indices"].clone(), device=case["device"], out_cache_loc=None,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=case["page_size"]),
    )
    draft_input = SimpleNamespace()
    runner = SimpleNamespace(token_to_kv_pool=pool, spec_algorithm=SimpleNamespace(is_standalone=lambda: True))
    InitNew.calls = []
    got = fn(draft_input, SimpleNamespace(req_to_token=case["req_to_token"].clone()), batch, None, runner,
             case["topk"], case["num_steps"], num_draft_tokens=case["topk"] * case["num_steps"] + 1)
    return dict(out_cache_loc=batch.out_cache_loc, positions=draft_input.positions,
                per_req=draft_input.num_tokens_per_req, ret=got, init_kwargs=InitNew.calls)


def run_both(case, patcher, seed: int = 0, plugin_original=None):
    """(stock, plugin) results and pools; ``patcher`` stands ``ForwardBatch`` in (monkeypatch)."""
    patcher.setattr(ewc, "ForwardBatch", InitNew)
    fused = []
    real = fdl.page_locs
    patcher.setattr(fdl, "page_locs", lambda *a: fused.append(1) or real(*a))
    patcher.setattr(fdl.PREPARE, "_edited", None)  # recompile (binding the counter) from the live function
    original = plugin_original or ewc.prepare_for_draft
    out = []
    for fn in (ewc.prepare_for_draft, lambda *a, **k: fdl.PREPARE.hook(original, *a, **k)):
        pool = eagle_tail.make_pool(case["size"], case["page_size"], case["device"], seed)
        out.append((_run(fn, case, pool), pool))
    out[1][0]["fused_calls"] = len(fused)
    return out[0], out[1]


def same(stock, plugin) -> bool:
    (s, sp), (p, pp) = stock, plugin
    return (s["out_cache_loc"].dtype == p["out_cache_loc"].dtype and torch.equal(s["out_cache_loc"], p["out_cache_loc"])
            and torch.equal(s["positions"], p["positions"]) and s["per_req"] == p["per_req"]
            and s["ret"][1:] == p["ret"][1:] and len(s["init_kwargs"]) == len(p["init_kwargs"]) == 1
            and eagle_tail.pools_equal(sp, pp))
