"""Hand-checked cases of benchmarks/flashinfer_split_model.py, the CPU port of
FlashInfer 0.7.2's FA2 split-KV planner (wheel flashinfer_python-0.7.2,
__git_commit__ d84335d8c54e0c8f9f7e22faa15c7e34a58abf94).

Each expected value below was derived by hand from the C++ (file:line in the
comment), not by running the model. No GPU is involved.
"""

import importlib.util
import os
import random
import sys

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location(
    "flashinfer_split_model", os.path.join(REPO, "benchmarks", "flashinfer_split_model.py")
)
m = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = m  # dataclasses look their module up while the class is built
_spec.loader.exec_module(m)


# utils.cuh:411-488, H100 (cc 9.0, 227 KiB opt-in smem), head_dim 128:
#   <=16 -> 16 because 16*128*2 + (128+128)*16*4*2 = 36864 <= 232448;
#   17..64 -> 64; >64 and head_dim < 256 -> 128; head_dim 256 never takes 128;
#   head_dim 512 -> 16 / 32 around 32; pre-Ampere -> 64.
@pytest.mark.parametrize(
    "avg,head_dim,cc,expected",
    [(1, 128, 9, 16), (16, 128, 9, 16), (17, 128, 9, 64), (64, 128, 9, 64), (65, 128, 9, 128),
     (65, 256, 9, 64), (32, 512, 9, 16), (33, 512, 9, 32), (4, 128, 7, 64)],
)
def test_cta_tile_q(avg, head_dim, cc, expected):
    assert m.fa2_determine_cta_tile_q(avg, head_dim, cc_major=cc) == expected


def test_max_batch_size_if_split():
    # PrefillPlanImpl :788-791: num_blocks_per_sm = 2; (2*num_sm - colocated) / num_kv_heads.
    assert m.prefill_max_batch_size_if_split(132, 8) == 33
    assert m.prefill_max_batch_size_if_split(132, 1) == 264
    assert m.prefill_max_batch_size_if_split(132, 8, num_colocated_ctas=10) == 31


def test_binary_search_kv_chunk_size_hand_cases():
    bs = m.prefill_binary_search_kv_chunk_size
    # :113-129 with min_kv_chunk_size 128 (page 1, :579) and 33 CTAs of budget.
    # One request of 1000 tokens: 128 already fits (8 tiles) -> 128; split since 128 < 1000.
    assert bs(False, 33, [16], [1000], 16, 128) == (True, 128)
    # 100 tokens: the loop never runs (128 >= 100) -> 128, no split without CUDA graphs...
    assert bs(False, 33, [16], [100], 16, 128) == (False, 128)
    # ...but always split under CUDA graphs (:129 enable_cuda_graph || low < max_kv_len).
    assert bs(True, 33, [16], [100], 16, 128) == (True, 128)
    # 5000 tokens: ceil(5000/152) = 33 fits, ceil(5000/151) = 34 does not -> 152.
    assert bs(True, 33, [16], [5000], 16, 128) == (True, 152)
    # Two 4000-token requests: 2*ceil(4000/250) = 32 fits, 2*ceil(4000/249) = 34 not -> 250.
    assert bs(True, 33, [16, 16], [4000, 4000], 16, 128) == (True, 250)
    # One token more on one request: 17 + 16 = 33 still fits -> still 250.
    assert bs(True, 33, [16, 16], [4001, 4000], 16, 128) == (True, 250)
    # One token more on both: 17 + 17 = 34 > 33 -> 251 (ceil(4001/251) = 16).
    assert bs(True, 33, [16, 16], [4001, 4001], 16, 128) == (True, 251)
    # A packed qo length over cta_tile_q multiplies the tiles: 2 q-tiles * ceil(kv/c) <= 33.
    assert bs(True, 33, [200], [1000], 128, 1)[1] == 63  # 2*ceil(1000/63)=32, 2*ceil(1000/62)=34


def test_prefill_split_verify_cuda_graph_hand_case():
    # bs 2, 4 tokens per request, 32/8 heads (gqa 4), head_dim 128, page 1, CUDA graph:
    # :603 max_seq_len = 8 - 2 + 1 = 7 -> max_qo_len 28 -> cta_tile_q 64;
    # :611 total_num_tiles_q = ceil(8*4/64) + 2 - 1 = 2; padded = max(33, 2) = 33 (:673);
    # packed 16 -> 1 q tile per request; kv [4000, 4000] -> chunk 250 -> 16 chunks each.
    p = m.plan_prefill_for_lens([4000, 4000], 4)
    assert (p.split_kv, p.cta_tile_q, p.kv_chunk_size_tokens, p.padded_batch_size) == (True, 64, 250, 33)
    assert p.num_chunks == (16, 16) and p.new_batch_size == 32
    assert p.merge_indptr == (0, 16, 32, 48, 64, 80, 96, 112, 128)  # :667, one entry per query row
    assert p.o_indptr == (0, 64, 128)
    assert p.kv_tile_indices[:3] == (0, 1, 2) and p.request_indices[16] == 1


def test_prefill_no_split_without_cuda_graph_short_kv():
    # non-CG :618 avg packed 16 -> cta 16; kv 100 < min chunk 128 -> no split; padded = new_batch_size.
    p = m.plan_prefill_for_lens([100], 4, enable_cuda_graph=False)
    assert (p.split_kv, p.cta_tile_q, p.num_chunks, p.new_batch_size, p.padded_batch_size) == (
        False, 16, (1,), 1, 1)


def test_disable_split_kv_plan_is_length_independent():
    # :637-638 kv_chunk_size = INT64_MAX, one chunk per request, split_kv stays false.
    a = m.plan_prefill_for_lens([10, 7000], 4, disable_split_kv=True)
    b = m.plan_prefill_for_lens([300, 8000], 4, disable_split_kv=True)
    assert a == b and not a.split_kv and a.num_chunks == (1, 1)


def test_fixed_split_size_sets_split_from_lengths():
    # :639-640 and :653-654: with a fixed chunk, split_kv = any(num_chunks > 1).
    short = m.plan_prefill_for_lens([500, 900], 4, fixed_split_size=1024)
    long = m.plan_prefill_for_lens([500, 1100], 4, fixed_split_size=1024)
    assert not short.split_kv and short.num_chunks == (1, 1)
    assert long.split_kv and long.num_chunks == (1, 2)


def test_bound_plan_layout_mismatch_is_incorrect_for_multi_row_queries():
    # Real [4000, 4000]; host bound [4001, 4000] keeps chunk 250 but plans 17 chunks for
    # request 0 while the kernel (prefill.cuh:4293) writes 16 per row -> rows mis-strided.
    real, bound = [4000, 4000], [4001, 4000]
    e, b = m.plan_prefill_for_lens(real, 4), m.plan_prefill_for_lens(bound, 4)
    assert b.num_chunks == (17, 16) and b.kv_chunk_size_tokens == e.kv_chunk_size_tokens == 250
    assert m.classify(e, b, real, 4) == m.INCORRECT
    # Same bound with one query row per request (tensor-core decode): the extra tile is
    # empty (chunk_start clamped to kv_len, prefill.cuh:3830) -> same real chunking.
    e1, b1 = m.plan_prefill_for_lens(real, 1), m.plan_prefill_for_lens(bound, 1)
    assert m.classify(e1, b1, real, 1) == m.EQUAL_BITS
    # Bound on both requests moves the chunk to 251: correct layout, reordered reduction.
    e2, b2 = m.plan_prefill_for_lens(real, 1), m.plan_prefill_for_lens([4001, 4001], 1)
    assert b2.kv_chunk_size_tokens == 251 and m.classify(e2, b2, real, 1) == m.REORDERED


def test_decode_planner_hand_cases():
    # 4 blocks/SM assumed -> max_grid 528, gdy 8 (:183): bs 1 -> binary search with lower
    # bound 128 pages (page 1, :199): ceil(1000/c)*8 <= 528 holds at 128 -> chunk 128,
    # new_batch_size 8 != 1 -> split (:200-206); padded CG = 528/8 = 66, non-CG = 8 (:444).
    p = m.plan_decode_for_lens([1000])
    assert (p.split_kv, p.kv_chunk_size_tokens, p.new_batch_size, p.padded_batch_size) == (True, 128, 8, 66)
    assert m.plan_decode_for_lens([1000], enable_cuda_graph=False).padded_batch_size == 8
    # bs*gdy >= max_grid (66*8 = 528): no split whatever the lengths, padded = bs.
    q = m.plan_decode_for_lens([50] * 66)
    assert (q.split_kv, q.padded_batch_size) == (False, 66)


def test_decode_kernel_tile_past_real_length_is_incorrect():
    # decode.cuh:435-438: chunk_start = t*c is not clamped; bound 1030 plans 9 chunks of 128
    # but the real 1000 tokens end inside chunk 7 -> tile 8 starts at 1024 > 1000 -> underflow.
    e, b = m.plan_decode_for_lens([1000]), m.plan_decode_for_lens([1030])
    assert b.num_chunks == (9,) and m.classify(e, b, [1000], 1, kernel="decode") == m.INCORRECT
    # Bound 1024 plans the same 8 chunks -> identical plan.
    assert m.classify(e, m.plan_decode_for_lens([1024]), [1000], 1, kernel="decode") == m.IDENTICAL


def test_chunk_size_monotone_and_window_certificate():
    # The binary search returns min(first feasible chunk, max_kv_len), both non-decreasing
    # in the lengths; so plan(lo) == plan(hi) pins the plan for every length in between.
    rng = random.Random(7)
    for _ in range(60):
        bs = rng.randint(1, 8)
        qo = rng.randint(1, 8)
        lo = [rng.randint(1, 8000) for _ in range(bs)]
        hi = [x + rng.randint(0, 8) for x in lo]
        mid = [rng.randint(a, b) for a, b in zip(lo, hi)]
        plo, pmid, phi = (m.plan_prefill_for_lens(x, qo) for x in (lo, mid, hi))
        assert plo.kv_chunk_size_pages <= pmid.kv_chunk_size_pages <= phi.kv_chunk_size_pages
        if plo == phi:
            assert pmid == plo


def test_step_certified_hand_cases():
    # steps 3, topk 1 -> ntpr 4; seq in [c+1, c+4]. Verify plans kv = seq + 4 (qo 4), the two
    # draft-decode plans kv = seq + 1 and seq + 2 (qo 1). bs 1, so the chunk is clamped at the
    # 128-token minimum (:579) and only the verify chunk COUNT can move.
    assert m.step_certified([100])  # verify kv 105..108: one chunk at both ends
    assert not m.step_certified([122])  # verify kv 127..130: 1 chunk at lo, 2 at hi
    assert m.step_certified([124])  # verify kv 129..132: 2 chunks at both ends;
    # its draft-decode kv 126..129 crosses 128 but tensor-core decode only needs the same chunk
