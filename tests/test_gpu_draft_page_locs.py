"""fused_draft_page_locs on a CUDA device: SGLang's real ``prepare_for_draft`` against the slot's
recompiled copy on random paged tree batches (the draft pool uses SGLang's tiled KV copy), and
no host sync on the fused path (stock's tail gather syncs on ``numel()``).

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers.draft_page_locs import make_case, run_both, same

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def cases(seed, n):
    rng = random.Random(seed)
    fixed = [dict(bs=1, topk=2, page_size=4, num_steps=1), dict(bs=1, topk=4, page_size=16, num_steps=3, last_page=0),
             dict(bs=3, topk=3, page_size=16, num_steps=5, last_page=15), dict(bs=64, topk=4, page_size=64, num_steps=3),
             dict(bs=8, topk=8, page_size=64, num_steps=7, last_page=63)]
    for kw in fixed:
        yield rng, kw
    for _ in range(n):
        yield rng, dict(bs=rng.randint(1, 48), topk=rng.choice([2, 3, 4, 8]), page_size=rng.choice([2, 4, 16, 32, 64]),
                        num_steps=rng.randint(1, 7))


def test_bit_identical_to_stock_on_random_paged_tree_batches(monkeypatch):
    for i, (rng, kw) in enumerate(cases(31, 50)):
        stock, plugin = run_both(make_case(rng, device=DEV, **kw), monkeypatch, seed=i)
        torch.cuda.synchronize()
        assert plugin[0]["fused_calls"] == 1 and same(stock, plugin), (i, kw)


def test_fused_path_has_no_host_sync(monkeypatch):
    import sglang_hostsync_plugin.slots.fused_draft_page_locs as fdl
    from hostsync_drivers import eagle_tail

    case = make_case(random.Random(2), 4, 4, 16, 3, device=DEV)
    run_both(case, monkeypatch)  # compile outside the check
    pool = eagle_tail.make_pool(case["size"], 16, DEV, 0)
    batch = type("B", (), {})()
    batch.seq_lens, batch.req_pool_indices = case["seq_lens"], case["req_pool_indices"]
    rtp = type("R", (), {})()
    rtp.req_to_token = case["req_to_token"]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert fdl.page_locs_fit(batch, rtp, 4, 3, 16)
        fdl.page_locs(batch, rtp, pool, 4, 3, 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
