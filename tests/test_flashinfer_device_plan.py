"""The device plan writes what FlashInfer's CUDA-graph prefill plan writes (the CPU port of FlashInfer 0.7.2's
planner, ``flashinfer_split``, which the GPU tests hold against FlashInfer itself), on random lengths: page
boundaries, a single request, KV lengths of 0 and 1, non-uniform query widths, one KV head to eight."""

import random

import pytest
import torch

from sglang_hostsync_plugin import flashinfer_split as port
from sglang_hostsync_plugin.flashinfer_device_plan import prefill_plan

FIELDS = ("request_indices_offset", "qo_tile_indices_offset", "kv_tile_indices_offset", "merge_indptr_offset",
          "o_indptr_offset", "kv_chunk_size_ptr_offset", "block_valid_mask_offset", "total_num_rows_offset")
SLOT = 4096  # bytes between two arrays of the synthetic layout


def layout(model) -> dict:
    info = {f: 64 + i * SLOT for i, f in enumerate(FIELDS)}
    info.update(cta_tile_q=model.cta_tile_q, padded_batch_size=model.padded_batch_size,
                total_num_rows=model.total_num_rows)
    return info


def run_case(qo_lens, kv_tokens, *, qo_heads, kv_heads, page_size, captured_rows=None, num_sm=132):
    bs = len(qo_lens)
    qo_indptr = [0]
    for n in qo_lens:
        qo_indptr.append(qo_indptr[-1] + n)
    kv_indptr = port.page_indptr(kv_tokens, page_size)
    max_split = port.prefill_max_batch_size_if_split(num_sm, kv_heads)
    model = port.prefill_split_qo_kv_indptr(
        qo_indptr, kv_indptr, total_num_rows=captured_rows or qo_indptr[-1], batch_size=bs, num_qo_heads=qo_heads,
        num_kv_heads=kv_heads, head_dim=128, page_size=page_size, max_batch_size_if_split=max_split,
        enable_cuda_graph=True)
    info = layout(model)
    ws = torch.full((64 + len(FIELDS) * SLOT,), 0xA5, dtype=torch.uint8)  # stale bytes, as a replayed workspace has
    prefill_plan(torch.tensor(qo_indptr, dtype=torch.int32), torch.tensor(kv_indptr, dtype=torch.int32), ws, info,
                 batch_size=bs, gqa=qo_heads // kv_heads, max_batch_size_if_split=max_split, page_size=page_size)
    plan_info = [0] * len(port.PLAN_INFO_FIELDS)
    for i, f in enumerate(port.PLAN_INFO_FIELDS):
        plan_info[i] = {"split_kv": 1, "enable_cuda_graph": 1}.get(f, info.get(f, 0))
    return model, port.compare(model, plan_info, ws, bs)


@pytest.mark.parametrize("seed", range(40))
def test_the_device_plan_is_flashinfers_on_random_uniform_batches(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 1, 2, 3, 4, 7, 8, 16, 33, 64])
    kv_heads = rng.choice([1, 2, 8])
    qo_heads = kv_heads * rng.choice([1, 4, 8])
    page_size = rng.choice([1, 16])
    width = rng.choice([1, 2, 4, 8])  # draft decode (tensor cores), verify, draft extend
    top = rng.choice([40, 700, 5000, 70000])
    kv = [rng.choice([rng.randrange(1, top), page_size * rng.randrange(1, 64), page_size * rng.randrange(1, 64) + 1, 1])
          for _ in range(bs)]
    model, differ = run_case([width] * bs, kv, qo_heads=qo_heads, kv_heads=kv_heads, page_size=page_size)
    assert differ == [], (seed, model)


@pytest.mark.parametrize("seed", range(20))
def test_the_device_plan_is_flashinfers_on_uneven_widths_and_padded_rows(seed):
    rng = random.Random(1000 + seed)
    bs = rng.randrange(1, 20)
    qo = [rng.randrange(0, 9) for _ in range(bs)]
    qo[0] = max(qo[0], 1)
    kv = [rng.randrange(0, 3000) for _ in range(bs)]
    rows = sum(qo)
    model, differ = run_case(qo, kv, qo_heads=32, kv_heads=8, page_size=1, captured_rows=rows + rng.randrange(0, 8))
    assert differ == [], (seed, model)


def test_one_request_that_fits_the_smallest_chunk_and_one_that_splits_to_the_budget():
    for kv in ([1], [127], [128], [129], [100000]):
        model, differ = run_case([4], kv, qo_heads=32, kv_heads=8, page_size=1)
        assert differ == [], (kv, model)
    assert run_case([4], [100000], qo_heads=32, kv_heads=8, page_size=1)[0].new_batch_size > 1


def test_a_wrong_plan_is_caught_by_the_comparison():
    # the comparison the tests rest on sees a plan the device did not make (stale bytes left in place)
    model, _ = run_case([4, 4], [300, 5000], qo_heads=32, kv_heads=8, page_size=1)
    plan_info = [{"split_kv": 1, "enable_cuda_graph": 1}.get(f, layout(model).get(f, 0)) for f in port.PLAN_INFO_FIELDS]
    stale = torch.full((64 + len(FIELDS) * SLOT,), 0xA5, dtype=torch.uint8)
    assert port.compare(model, plan_info, stale, 2)
