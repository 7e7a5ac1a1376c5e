"""greedy_row_argmax on a CUDA device: torch.argmax's exact indices on random vocab-wide rows
(ties, NaN, infinities, fp32 / bf16 / fp16, the row counts verify and draft extend use) and no
host sync. Time per call: benchmarks/bench_greedy_row_argmax.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang_hostsync_plugin.slots import greedy_row_argmax as gra

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
VOCAB = 128256


def _rows(rng, rows, width, dtype):
    g = torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30))
    x = torch.randn(rows, width, device="cuda", generator=g).to(dtype)
    kind = rng.choice(["plain", "ties", "nan", "inf", "coarse"])
    if kind == "ties":
        top = x.max()
        for r in range(rows):
            x[r, rng.sample(range(width), 3)] = top + 1
    elif kind == "nan":
        x[rng.randrange(rows), rng.randrange(width)] = float("nan")
    elif kind == "inf":
        x[:, rng.randrange(width)] = float("inf")
        x[0, :] = -float("inf")
    elif kind == "coarse":
        x = torch.randint(-3, 4, (rows, width), device="cuda").to(dtype)
    return x, kind


def test_identical_to_torch_argmax_on_random_rows():
    rng = random.Random(5)
    n = 0
    for rows in (1, 2, 4, 8, 32, 64, 256):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for width in (VOCAB, 32000, rng.randrange(1, 3 * gra.BLOCK)):
                x, kind = _rows(rng, rows, width, dtype)
                assert gra.fits(x)
                got, want = gra.row_argmax(x), torch.argmax(x, dim=-1)
                assert torch.equal(got, want), (rows, dtype, width, kind)
                assert torch.equal(gra.row_argmax(x, keepdim=True), torch.argmax(x, dim=-1, keepdim=True))
                n += 1
    print(f"greedy_row_argmax: {n} random cases identical to torch.argmax")


def test_no_host_sync():
    x = torch.randn(8, VOCAB, device="cuda")
    gra.row_argmax(x)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gra.row_argmax(x)
        gra.row_argmax(x, keepdim=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()

