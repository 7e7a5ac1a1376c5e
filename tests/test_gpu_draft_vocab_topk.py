"""draft_vocab_topk on a CUDA device: torch.topk's exact values and indices (ties, NaN, signed
zeros, infinities, softmax of bf16-rounded logits, the row counts and k the EAGLE draft takes,
vocabulary widths), through SGLang's fast_topk hooked, inside a CUDA graph, and without a host
sync. Time per call: benchmarks/bench_draft_vocab_topk.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang_hostsync_plugin.slots import draft_vocab_topk as dvt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
VOCAB = 128256
KINDS = ("softmax", "bf16_softmax", "coarse", "nan", "inf", "zeros", "flat")


def _rows(rng, rows, width, kind):
    g = torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30))
    x = torch.randn(rows, width, device="cuda", generator=g)
    if kind == "softmax":
        return torch.softmax(x * 3, dim=-1)
    if kind == "bf16_softmax":  # bf16 logits: many equal probabilities, as a real draft head gives
        return torch.softmax(x.bfloat16().float() * 4, dim=-1)
    if kind == "coarse":
        return torch.randint(-3, 4, (rows, width), device="cuda", generator=g).float()
    if kind == "nan":
        for r in range(rows):
            x[r, rng.sample(range(width), rng.randrange(1, 4))] = float("nan")
        return x
    if kind == "inf":
        x[:, rng.sample(range(width), 5)] = float("inf")
        x[0, :] = -float("inf")
        return x
    if kind == "zeros":
        x = torch.zeros(rows, width, device="cuda")
        x[:, rng.sample(range(width), 50)] = -0.0
        return x
    return torch.full((rows, width), 0.25, device="cuda")


def _same(x, k):
    got, want = dvt.vocab_topk(x, k), torch.topk(x, k, dim=-1)
    return (torch.equal(got.values.view(torch.int32), want.values.view(torch.int32))
            and torch.equal(got.indices, want.indices))


def test_identical_to_torch_topk_on_random_rows():
    rng = random.Random(11)
    n = 0
    for rows in (1, 2, 4, 8, 16, 32, 64):
        for width in (VOCAB, 151936, 32000, 2 * dvt.BLOCK + 16):
            for k in (2, 3, 4, 8, 16):
                for kind in KINDS:
                    x = _rows(rng, rows, width, kind)
                    assert dvt.fits(x, k, -1)
                    assert _same(x, k), (rows, width, k, kind)
                    n += 1
    print(f"draft_vocab_topk: {n} random cases identical to torch.topk")


def test_through_sglangs_fast_topk_and_in_a_cuda_graph():
    from sglang.srt.utils.common import fast_topk

    x = torch.softmax(torch.randn(4, VOCAB, device="cuda").bfloat16().float() * 4, dim=-1)
    got, want = dvt.fast_topk_hook(fast_topk, x, 4, dim=-1), fast_topk(x, 4, dim=-1)
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dvt.vocab_topk(static, 4)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dvt.vocab_topk(static, 4)
    rng = random.Random(2)
    for kind in KINDS:
        static.copy_(_rows(rng, 4, VOCAB, kind))
        graph.replay()
        want = torch.topk(static, 4, dim=-1)
        assert torch.equal(out.values.view(torch.int32), want.values.view(torch.int32)), kind
        assert torch.equal(out.indices, want.indices), kind


def test_no_host_sync():
    x = torch.softmax(torch.randn(4, VOCAB, device="cuda"), dim=-1)
    dvt.vocab_topk(x, 4)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dvt.vocab_topk(x, 4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
