"""ngram_full_mask on a CUDA device: stock's USE_FULL_MASK loop (run on the device, as SGLang
runs it) and the kernel give the same bool tensor on random batches (bs 1-64, lengths on page
and block edges and up to 40k, draft widths 1-16), and the kernel does not sync. Host and GPU
time per call: benchmarks/bench_ngram_full_mask.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import numpy as np
import pytest
import torch

from sglang_hostsync_plugin.slots import ngram_full_mask as nfm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def stock_full_mask(mask, seq_lens_cpu, d, device="cuda"):
    """SGLang 0.5.23's loop (ngram_worker.py ~326-370), on ``device``."""
    bs = len(seq_lens_cpu)
    ones_masks = [torch.ones((d, seq_lens_cpu[i]), device=device) for i in range(bs)]
    mask = mask.reshape(bs, d, d)
    out = []
    for i in range(bs):
        req = torch.cat((ones_masks[i], torch.from_numpy(mask[i]).to(device=device, non_blocking=True)), dim=1)
        out.append(req.to(torch.bool).flatten())
    return torch.cat(out, dim=0)


def case(rng, bs, d):
    lens = [rng.choice([1, 15, 16, 17, 255, 256, nfm.BLOCK - d, nfm.BLOCK, nfm.BLOCK + 1, rng.randrange(1, 40000)])
            for _ in range(bs)]
    mask = (np.random.default_rng(rng.randrange(1 << 30)).random(bs * d * d) < 0.4).astype(np.uint8)
    tree = torch.from_numpy(mask).to("cuda").to(torch.bool)  # stock: tree_mask.copy_(from_numpy(mask))
    seq_lens = torch.tensor(lens, device="cuda", dtype=rng.choice([torch.int32, torch.int64]))
    return tree, mask, seq_lens, torch.tensor(lens, dtype=torch.int64)


def test_identical_to_stock_on_random_batches():
    rng = random.Random(7)
    n = 0
    for d in (1, 4, 8, 16):
        for bs in (1, 2, 3, 8, 17, 64):
            tree, mask, seq_lens, seq_lens_cpu = case(rng, bs, d)
            got = nfm.full_mask(tree, seq_lens, seq_lens_cpu, d)
            want = stock_full_mask(mask, seq_lens_cpu.tolist(), d)
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), (d, bs)
            n += 1
    print(f"ngram_full_mask: {n} random batches identical to stock's loop")


def test_no_host_sync():
    tree, _, seq_lens, seq_lens_cpu = case(random.Random(1), 8, 8)
    nfm.full_mask(tree, seq_lens, seq_lens_cpu, 8)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        nfm.full_mask(tree, seq_lens, seq_lens_cpu, 8)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
