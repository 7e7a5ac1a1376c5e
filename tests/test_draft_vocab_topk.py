"""draft_vocab_topk on the CPU (Triton interpreter): the candidate pass keeps, per block, the k
largest elements by torch's radix key (ties: the lower index) in index order; torch's CUDA
top-k rule (elements above the k-th key in index order, then the k-th key's first ones) picks
the same elements from the candidates as from the whole row; without ties the result is
torch.topk's; the hook leaves everything else to SGLang's fast_topk, and it is installed where
SGLang's EAGLE worker calls fast_topk. Bit-identity with torch.topk on CUDA (ties included):
test_gpu_draft_vocab_topk.py."""

import random

import pytest
import torch
import triton

from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import draft_vocab_topk as dvt

B = dvt.BLOCK


def radix_key(v: torch.Tensor) -> list[int]:
    """torch's TopKTypeConfig<float>::convert, on the CPU."""
    out = []
    for x, bits in zip(v.tolist(), (v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()):
        out.append(0xFFFFFFFF if x != x else (bits ^ 0xFFFFFFFF if bits >= 0x80000000 else bits | 0x80000000))
    return out


def cuda_rule(keys: list[int], k: int) -> list[int]:
    """The indices torch's CUDA top-k gathers (before its sort of k): above the k-th key in
    index order, then the k-th key's first ones in index order."""
    kth = sorted(keys, reverse=True)[k - 1]
    above = [i for i, key in enumerate(keys) if key > kth]
    return above + [i for i, key in enumerate(keys) if key == kth][: k - len(above)]


def candidates(x: torch.Tensor, k: int):
    rows, width = x.shape
    blocks = triton.cdiv(width, B)
    vals = torch.full((rows, blocks * k), 7.0)
    idx = torch.full((rows, blocks * k), -1, dtype=torch.int64)
    dvt._block_topk_kernel[(rows, blocks)](x, vals, idx, x.stride(0), width, K=k,
                                           KP=triton.next_power_of_2(k), BLOCK=B)
    return vals, idx


def tie_rows(rng: random.Random, rows: int, width: int) -> torch.Tensor:
    x = torch.tensor([[rng.randrange(-3, 4) / 7 for _ in range(width)] for _ in range(rows)])
    x[0, rng.randrange(width)] = float("nan")
    if rows > 1:
        x[1, :] = 0.0
        x[1, rng.sample(range(width), 40)] = -0.0  # -0.0 is below 0.0 in torch's key
    if rows > 2:
        x[2, :] = -float("inf")
        x[2, rng.sample(range(width), 3)] = float("inf")
    return x


def test_fits_on_the_interpreter():
    assert dvt._INTERPRET and dvt.fits(torch.zeros(2, 2 * B), 4, -1)  # so the tests below run the kernel


@pytest.mark.parametrize("width,k", [(2 * B, 2), (2 * B + 5, 4), (3 * B + 100, 8), (2 * B + 16, 16), (2 * B + 3, 3)])
def test_candidates_are_each_blocks_top_k_in_index_order(width, k):
    rng = random.Random(width * 31 + k)
    x = tie_rows(rng, 3, width)
    vals, idx = candidates(x, k)
    for r in range(3):
        keys = radix_key(x[r])
        want = []
        for start in range(0, width, B):
            block = range(start, min(width, start + B))
            want += sorted(sorted(block, key=lambda i: (-keys[i], i))[:k])
        assert idx[r].tolist() == want, r
        assert torch.equal(vals[r].view(torch.int32), x[r, want].view(torch.int32))  # the bits, NaN included


@pytest.mark.parametrize("k", [2, 4, 8])
def test_torchs_cuda_rule_picks_the_same_elements_from_the_candidates(k):
    rng = random.Random(k)
    x = tie_rows(rng, 3, 3 * B + 70)
    assert dvt.fits(x, k, -1)
    vals, idx = candidates(x, k)
    for r in range(3):
        whole = cuda_rule(radix_key(x[r]), k)
        picked = [idx[r, j].item() for j in cuda_rule(radix_key(vals[r]), k)]
        assert picked == whole, r  # same elements, same order: torch's sort of k then agrees


def test_without_ties_the_result_is_torch_topk():
    g = torch.Generator().manual_seed(1)
    for rows, width, k in [(1, 128256, 4), (4, 2 * B + 9, 2), (8, 3 * B, 8)]:
        # distinct values (CPU and CUDA top-k differ only in how they order ties)
        x = torch.stack([torch.randperm(width, generator=g) for _ in range(rows)]).float() / width - 0.5
        got, want = dvt.vocab_topk(x, k), torch.topk(x, k, dim=-1)
        assert type(got) is type(want)
        assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
        assert got.indices.dtype == torch.int64 and got.values.is_contiguous()


def test_a_row_view_with_a_padded_stride():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2 * B + 300, generator=g)[:, : 2 * B + 50]
    assert dvt.fits(x, 4, -1)
    got, want = dvt.vocab_topk(x, 4), torch.topk(x, 4, dim=-1)
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


@pytest.mark.parametrize("case", ["k1", "k_too_big", "narrow", "short_tail", "bf16", "1d", "dim0", "strided_cols",
                                  "empty", "grad", "not_a_tensor", "k_not_int", "too_wide"])
def test_what_it_leaves_to_sglang(case):
    x = torch.randn(2, 2 * B + 40)
    k, dim = 4, -1
    if case == "k1":
        k = 1
    elif case == "k_too_big":
        k = dvt.MAX_K + 1
    elif case == "narrow":
        x = torch.randn(4, 16)
    elif case == "short_tail":
        x, k = torch.randn(2, 2 * B + 3), 4  # the last block holds 3 < k elements
    elif case == "bf16":
        x = x.bfloat16()
    elif case == "1d":
        x = x[0]
    elif case == "dim0":
        dim = 0
    elif case == "strided_cols":
        x = torch.randn(2 * B + 40, 2).t()
    elif case == "empty":
        x = torch.zeros(0, 2 * B)
    elif case == "grad":
        x.requires_grad_(True)
    elif case == "not_a_tensor":
        x = [1.0] * 10
    elif case == "k_not_int":
        k = torch.tensor(4)
    elif case == "too_wide":  # more blocks than a launch grid's second dimension holds (shape only)
        x = torch.empty(2, (dvt.MAX_BLOCKS + 1) * B, device="meta")
    assert not dvt.fits(x, k, dim)
    calls = []

    def original(values, topk, dim):
        calls.append((values, topk, dim))
        return "sglang"

    assert dvt.fast_topk_hook(original, x, k, dim=dim) == "sglang" and len(calls) == 1


def test_the_hook_takes_a_fitting_call(monkeypatch):
    x = torch.randn(2, 2 * B + 40)
    want = torch.topk(x, 4, dim=-1)

    def original(values, topk, dim):
        raise AssertionError("fast_topk called for a row the candidate pass takes")

    topk, seen = torch.topk, []
    monkeypatch.setattr(torch, "topk", lambda t, k, dim: seen.append(tuple(t.shape)) or topk(t, k, dim=dim))
    got = dvt.fast_topk_hook(original, x, 4, dim=-1)
    assert seen == [(2, 3 * 4)]  # torch's top-k ran over the 3 blocks' candidates, not the row
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


def test_pins_target_and_inert_rules():
    assert check_slot(dvt.SLOT) is None
    assert dvt.SLOT.presets == ("eagle_host",) and not dvt.SLOT.default
    eagle = dict(speculative_algorithm="EAGLE", page_size=16, attention_backends=("triton", "triton"))
    assert dvt.inert(ServingFacts(topk=4, **eagle)) is None
    assert "topk is 1" in dvt.inert(ServingFacts(topk=1, **eagle))
    assert "NGRAM" in dvt.inert(ServingFacts(speculative_algorithm="NGRAM", topk=4, page_size=16,
                                             attention_backends=("triton", "triton")))


def test_installed_where_the_eagle_worker_calls_fast_topk():
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json
import torch
from sglang.srt.speculative import eagle_worker_v2, spec_utils
from sglang_hostsync_plugin.slots import draft_vocab_topk as dvt
calls = []
kernel = dvt._block_topk_kernel
class Counting:
    def __getitem__(self, grid):
        calls.append(grid)
        return kernel[grid]
dvt._block_topk_kernel = Counting()
x = torch.randn(2, 3 * dvt.BLOCK)
got = eagle_worker_v2.fast_topk(x, 4, dim=-1)
want = torch.topk(x, 4, dim=-1)
small = spec_utils.fast_topk(torch.randn(2, 16), 4, dim=-1)
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["draft_vocab_topk"].status.value,
      "calls": len(calls), "same": bool(torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)),
      "small": list(small.values.shape)}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit", TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["calls"] == 1 and res["same"] and res["small"] == [2, 4], res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout
