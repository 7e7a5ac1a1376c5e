"""fused_tree_compact on a CUDA device: bit-identical to SGLang's real
``_finalize_accept_tree_path`` (its Triton kernels and its tiled all-layer KV copy) on random
tree batches, and no host sync on the hook's path.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers.tree_compact import RecordingPool, _call, make_case, make_pool, run_both, same
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def cases(seed, n):
    rng = random.Random(seed)
    fixed = [dict(bs=1, topk=4, steps=3), dict(bs=1, topk=4, steps=3, path_lens=[1]),
             dict(bs=8, topk=8, steps=7, hidden_dim=4096), dict(bs=64, topk=8, steps=7, hidden_dim=512),
             dict(bs=6, topk=4, steps=4, scatter_pads=True), dict(bs=2, topk=2, steps=5, hidden_dim=None),
             dict(bs=4, topk=4, steps=3, hidden_dim=12288, hidden_dtype=torch.float32)]
    for kw in fixed:
        yield rng, kw
    for _ in range(n):
        yield rng, dict(bs=rng.randint(1, 48), topk=rng.choice([2, 3, 4, 8]), steps=rng.randint(1, 7),
                        hidden_dim=rng.choice([None, 64, 4096]))


def test_bit_identical_to_stock_on_random_tree_batches():
    for i, (rng, kw) in enumerate(cases(23, 60)):
        inputs = make_case(rng, device=DEV, **kw)
        stock, plugin = run_both(inputs, device=DEV, seed=i)
        torch.cuda.synchronize()
        assert same(stock, plugin), (i, kw)


def test_hook_path_has_no_host_sync():
    inputs = make_case(random.Random(4), 4, 4, 3, hidden_dim=4096, device=DEV)
    run_both(inputs, device=DEV)  # compile outside the check
    pool = Pool(make_pool(inputs["size"], DEV, 0))
    torch.cuda.synchronize()

    def fell_back(*a, **k):
        raise AssertionError("fell back to SGLang's code")

    torch.cuda.set_sync_debug_mode("error")
    try:
        _call(lambda *a, **k: ftc.finalize_hook(fell_back, *a, **k), inputs, pool)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


class Pool(RecordingPool):
    def move_kv_cache(self, tgt, src):  # the pool's move only: recording clones nothing here
        self.pool.move_kv_cache(tgt, src)
