"""The FlashInfer plan slots on real FlashInfer wrappers (CUDA and flashinfer needed).

- ``flashinfer_tree_verify_plan``: SGLang's ``fast_prefill_plan``, fed the host layout
  that ``call_begin_forward`` builds, plans a topk > 1 tree verify exactly like
  FlashInfer's ``plan()``: same plan info, int workspace, packed mask, indptr buffers
  and the same attention output, bit for bit (random trees and lengths across page
  boundaries, bs 1 / 3 / 8).
- the same slot's NGRAM plan (``NgramHostPlan``, called with the arguments SGLang's
  ``call_begin_forward`` gives a verify wrapper) on NGRAM's full verify mask (prefix ones,
  then the draft tree): identical to ``plan()`` in the same fields and output.
- ``flashinfer_plan_guard``: a WAR stress test with a delayed reader. The stream sleeps
  before each plan's H2D runs, while the host plans the next batch into the same wrapper.
  Without the guard the copies read a later plan (mismatches, so the test can fail);
  with it, none.
"""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
flashinfer = pytest.importorskip("flashinfer")

from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan  # noqa: E402
from sglang_hostsync_plugin.slots.flashinfer_plan_guard import PlanGuard  # noqa: E402

QO_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # the e2e benchmark's Llama-8B shape
NDT = 8  # --speculative-num-draft-tokens at topk 4
MAX_TOKENS = 8 * (512 + NDT)
# The stress batches: one long request moving between slots, so that FlashInfer splits
# its KV into chunks and the two plans' work lists differ (short ones plan the same).
STRESS_LENS = ([6000, 17, 300], [17, 300, 6000])
STRESS_TOKENS = sum(STRESS_LENS[0]) + 3 * NDT + 64
DT = torch.bfloat16


def _wrapper(kind: str, bs: int, pool: int = MAX_TOKENS):
    w = _new_wrapper(kind, bs, pool)
    # Bytes a plan leaves unwritten are copied too: start them equal everywhere.
    w._int_workspace_buffer.zero_()
    w._pin_memory_int_workspace_buffer.zero_()
    return w


def _new_wrapper(kind: str, bs: int, pool: int):
    """A CUDA-graph wrapper of one batch size, with its buffers, as
    FlashInferAttnBackend._create_prefill_wrappers / _create_decode_wrappers make them."""
    dev = "cuda"
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    if kind == "decode":
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(pool, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev))
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, backend="fa2",
        qo_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.zeros(pool, dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.ones(bs, dtype=torch.int32, device=dev),
        custom_mask_buf=torch.zeros(pool * NDT // 8 + 64, dtype=torch.uint8, device=dev),
        mask_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=dev))


def _tree_mask(rng: random.Random, prefix: int) -> torch.Tensor:
    """One request's verify mask, row-major [NDT, prefix + NDT]: the prefix, then a
    random tree (node i sees itself and its ancestors)."""
    parent = [-1] + [rng.randrange(i) for i in range(1, NDT)]
    mask = torch.zeros(NDT, prefix + NDT, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(NDT):
        j = i
        while j >= 0:
            mask[i, prefix + j] = True
            j = parent[j]
    return mask.flatten()


def _batch(rng: random.Random, bs: int, seq_lens=None, pool: int = MAX_TOKENS):
    """A verify batch laid out as EagleVerifyInput.generate_attn_arg_prefill does, plus
    the host kwargs FlashInferIndicesUpdaterPrefill.call_begin_forward builds."""
    edges = [1, 15, 16, 17, 31, 32, 33, 255, 256, 257]
    if seq_lens is None:
        seq_lens = [rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, 500) for _ in range(bs)]
    kv_lens = torch.tensor(seq_lens, dtype=torch.int32) + NDT
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(kv_lens, 0)
    total = int(kv_indptr[-1])
    kv_indices = torch.randperm(pool, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))[:total]
    qo_indptr = torch.arange(0, (bs + 1) * NDT, NDT, dtype=torch.int32)
    mask = torch.cat([_tree_mask(rng, s) for s in seq_lens])
    dev = {k: v.cuda() for k, v in dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                                         kv_indices=kv_indices.to(torch.int32), mask=mask).items()}
    host = dict(qo_indptr_host=qo_indptr, kv_indptr_host=kv_indptr, kv_lens_host=kv_lens,
                max_q_len=NDT, max_kv_len=int(kv_lens.max()), uniform_verify_width=NDT)
    return dev, host, bs


def _stock_plan(w, dev, bs):
    w.plan(dev["qo_indptr"], dev["kv_indptr"], dev["kv_indices"], torch.ones(bs, dtype=torch.int32, device="cuda"),
           QO_HEADS, KV_HEADS, HEAD_DIM, 1, custom_mask=dev["mask"], q_data_type=DT, kv_data_type=DT,
           non_blocking=True)


def _fast_plan(w, dev, host, bs):
    fast_prefill_plan(w, dev["qo_indptr"], dev["kv_indptr"], dev["kv_indices"],
                      torch.ones(bs, dtype=torch.int32, device="cuda"), QO_HEADS, KV_HEADS, HEAD_DIM, 1,
                      custom_mask=dev["mask"], q_data_type=DT, kv_data_type=DT, non_blocking=True, **host)


def _decode_plan(w, dev, host, bs):
    from flashinfer import fast_decode_plan

    fast_decode_plan(w, dev["kv_indptr"], dev["kv_indices"], torch.ones(bs, dtype=torch.int32, device="cuda"),
                     QO_HEADS, KV_HEADS, HEAD_DIM, 1, q_data_type=DT, kv_data_type=DT, non_blocking=True,
                     global_override_indptr_cpu=host["kv_indptr_host"])


def test_tree_verify_fast_plan_is_identical_to_plan():
    rng = random.Random(15)
    pairs = {}
    for bs in (1, 2, 3, 5, 8):  # one wrapper pair per captured batch size
        pairs[bs] = _wrapper("prefill", bs), _wrapper("prefill", bs)
        dev, host, _ = _batch(rng, bs)
        for w in pairs[bs]:  # "capture": fast_prefill_plan needs the module plan() cached
            _stock_plan(w, dev, bs)
    k_cache = torch.randn(MAX_TOKENS, 1, KV_HEADS, HEAD_DIM, dtype=DT, device="cuda")
    v_cache = torch.randn(MAX_TOKENS, 1, KV_HEADS, HEAD_DIM, dtype=DT, device="cuda")
    checked = 0
    for bs in (1, 3, 8, 1, 3, 8, 2, 5):
        dev, host, bs = _batch(rng, bs)
        stock, fast = pairs[bs]
        _stock_plan(stock, dev, bs)
        _fast_plan(fast, dev, host, bs)
        torch.cuda.synchronize()
        assert fast._plan_info == stock._plan_info
        assert torch.equal(fast._int_workspace_buffer, stock._int_workspace_buffer)
        packed = int(fast._mask_indptr_buf[bs])
        assert packed == int(stock._mask_indptr_buf[bs]) > 0
        assert torch.equal(fast._mask_indptr_buf[: bs + 1], stock._mask_indptr_buf[: bs + 1])
        assert torch.equal(fast._custom_mask_buf[:packed], stock._custom_mask_buf[:packed])
        for name in ("_qo_indptr_buf", "_paged_kv_indptr_buf"):
            assert torch.equal(getattr(fast, name)[: bs + 1], getattr(stock, name)[: bs + 1]), name
        q = torch.randn(bs * NDT, QO_HEADS, HEAD_DIM, dtype=DT, device="cuda")
        out_stock = stock.run(q, (k_cache, v_cache))
        out_fast = fast.run(q, (k_cache, v_cache))
        assert torch.equal(out_fast, out_stock)
        checked += 1
    assert checked == 8


def _ngram_mask(rng: random.Random, prefix: int) -> torch.Tensor:
    """NGRAM's USE_FULL_MASK rows for one request: [NDT, prefix] ones, then a draft tree
    whose nodes may see any earlier node (NGRAM trees are irregular)."""
    tree = torch.tensor([[j == i or (j < i and rng.random() < 0.5) for j in range(NDT)] for i in range(NDT)])
    return torch.cat([torch.ones(NDT, prefix, dtype=torch.bool), tree], dim=1).flatten()


def test_ngram_host_plan_is_identical_to_plan():
    from sglang_hostsync_plugin.slots.flashinfer_tree_verify_plan import NgramHostPlan

    rng = random.Random(17)
    pairs = {}
    for bs in (1, 2, 3, 5, 8):
        pairs[bs] = _wrapper("prefill", bs), _wrapper("prefill", bs)
        dev, _, _ = _batch(rng, bs)
        for w in pairs[bs]:
            _stock_plan(w, dev, bs)  # capture
        fast = pairs[bs][1]
        fast.begin_forward = NgramHostPlan(fast, fast.begin_forward)
    k_cache = torch.randn(MAX_TOKENS, 1, KV_HEADS, HEAD_DIM, dtype=DT, device="cuda")
    v_cache = torch.randn(MAX_TOKENS, 1, KV_HEADS, HEAD_DIM, dtype=DT, device="cuda")
    for bs in (1, 3, 8, 1, 3, 8, 2, 5):
        dev, _, bs = _batch(rng, bs)
        lens = (dev["kv_indptr"].diff().cpu() - NDT).tolist()
        dev["mask"] = torch.cat([_ngram_mask(rng, s) for s in lens]).cuda()
        stock, fast = pairs[bs]
        _stock_plan(stock, dev, bs)
        fast.begin_forward.host = (torch.tensor(lens), NDT)  # what the slot's replay hook hands it
        # call_begin_forward's plain-branch call
        fast.begin_forward(dev["qo_indptr"], dev["kv_indptr"], dev["kv_indices"],
                           torch.ones(bs, dtype=torch.int32, device="cuda"), QO_HEADS, KV_HEADS, HEAD_DIM, 1,
                           q_data_type=DT, kv_data_type=DT, custom_mask=dev["mask"], non_blocking=True,
                           fixed_split_size=None, prefix_len_ptr=None, token_pos_in_items_ptr=None,
                           token_pos_in_items_len=0, max_item_len_ptr=None)
        torch.cuda.synchronize()
        assert fast._plan_info == stock._plan_info
        assert torch.equal(fast._int_workspace_buffer, stock._int_workspace_buffer)
        packed = int(fast._mask_indptr_buf[bs])
        assert packed == int(stock._mask_indptr_buf[bs]) > 0
        assert torch.equal(fast._custom_mask_buf[:packed], stock._custom_mask_buf[:packed])
        q = torch.randn(bs * NDT, QO_HEADS, HEAD_DIM, dtype=DT, device="cuda")
        assert torch.equal(fast.run(q, (k_cache, v_cache)), stock.run(q, (k_cache, v_cache)))
    assert sum(p[1].begin_forward.host_plans for p in pairs.values()) == 8


def _stress(kind: str, guard: PlanGuard | None, iters: int = 8) -> int:
    """Plans alternate between two batches while the stream sleeps before each plan's
    copy; returns how many copies delivered another plan than their own."""
    rng = random.Random(6)
    w = _wrapper(kind, 3, STRESS_TOKENS)
    batches = [_batch(rng, 3, lens, STRESS_TOKENS) for lens in STRESS_LENS]
    plan = _decode_plan if kind == "decode" else _fast_plan
    if kind == "decode":
        w.plan(batches[0][0]["kv_indptr"], batches[0][0]["kv_indices"], torch.ones(3, dtype=torch.int32, device="cuda"),
               QO_HEADS, KV_HEADS, HEAD_DIM, 1, q_data_type=DT, kv_data_type=DT)
    else:
        _stock_plan(w, batches[0][0], 3)
    expected = []
    for dev, host, bs in batches:  # each plan alone, fully synchronized
        plan(w, dev, host, bs)
        torch.cuda.synchronize()
        expected.append(w._int_workspace_buffer.clone())
    assert not torch.equal(expected[0], expected[1]), "the two plans must differ for the test to see a WAR"
    snaps = []
    for i in range(iters):
        dev, host, bs = batches[i % 2]
        torch.cuda._sleep(20_000_000)  # the reader (this plan's H2D) is delayed ~10 ms
        if guard is not None:
            guard.before_plan(w)
        plan(w, dev, host, bs)
        if guard is not None:
            guard.after_plan(w)
        snaps.append(w._int_workspace_buffer.clone())  # runs right after the plan's copy
    torch.cuda.synchronize()
    return sum(not torch.equal(s, expected[i % 2]) for i, s in enumerate(snaps))


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_plan_guard_war_stress_with_delayed_reader(kind):
    unguarded = _stress(kind, None)
    guard = PlanGuard()
    guarded = _stress(kind, guard)
    print(f"\n{kind}: unguarded mismatches {unguarded}/8, guarded {guarded}/8, "
          f"guard host waits {guard.host_waits}, extra pinned buffers {guard.allocations}")
    assert unguarded > 0, "without the guard the delayed copies must read a later plan"
    assert guarded == 0
    assert guard.host_waits > 0  # the host was three plans ahead: it had to wait
