"""The device plan against FlashInfer 0.7.2's own CUDA-graph planners: the prefill planner through SGLang's
``fast_prefill_plan`` (as SGLang replays verify and draft extend) and the CUDA-core decode planner (the
multi-step draft at GQA below 4). The bytes it writes at plan_info's offsets equal the ones FlashInfer wrote
into its pinned buffer, on random lengths near chunk boundaries, for every batch size and query width SGLang
captures; it runs inside a CUDA graph; and FlashInfer's attention after ``replan_prefill`` is bit for bit the
attention after SGLang's ``fast_prefill_plan``. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
flashinfer = pytest.importorskip("flashinfer")

from sglang_hostsync_plugin import flashinfer_split as fs  # noqa: E402
from sglang_hostsync_plugin.flashinfer_device_plan import (  # noqa: E402
    DECODE_PLAN_INFO_FIELDS, decode_plan, prefill_plan)
from test_gpu_flashinfer_certified_plan import DT, HEADS, POOL, Prefill, _indptr, _lens, _workspace  # noqa: E402


def _device_plan(site: Prefill, kv_lens, info: dict, ws: torch.Tensor) -> None:
    qo = torch.arange(0, (site.bs + 1) * site.qo, site.qo, dtype=torch.int32, device="cuda")
    prefill_plan(qo, _indptr(kv_lens).cuda(), ws, info, batch_size=site.bs, gqa=site.hq // site.hkv,
                 max_batch_size_if_split=fs.prefill_max_batch_size_if_split(fs.Device.current().num_sm, site.hkv),
                 page_size=1)


def test_the_device_plan_writes_what_flashinfers_planner_writes():
    rng = random.Random(3)
    device = fs.Device.current()
    checked = 0
    for bs in (1, 2, 3, 4, 7, 8, 16, 32, 64):
        for qo in (1, 2, 4, 8):
            site = Prefill(bs, qo, rng.choice(HEADS))
            fixed = list(site.w._plan_info)  # the capture's: the device plan leaves it as it is
            for _ in range(8):
                lens = _lens(rng, bs)
                call, plan_info, pinned = site.plan(lens)
                assert plan_info == fixed, (bs, qo, lens)  # no field of it moves with the lengths
                info = dict(zip(fs.PLAN_INFO_FIELDS, (int(x) for x in plan_info)))
                ws = torch.zeros(pinned.numel(), dtype=torch.uint8, device="cuda")
                _device_plan(site, lens, info, ws)
                model = fs.plan_call(call, device)
                assert fs.read_written(plan_info, ws.cpu(), model, bs) == fs.read_written(plan_info, pinned, model, bs), \
                    (bs, qo, lens)
                checked += 1
    assert checked == 9 * 4 * 8


def test_the_device_plan_replays_in_a_cuda_graph_from_the_lengths_on_the_device():
    rng = random.Random(4)
    site = Prefill(8, 4, (32, 8))
    lens = _lens(rng, 8)
    _, plan_info, pinned = site.plan(lens)
    info = dict(zip(fs.PLAN_INFO_FIELDS, (int(x) for x in plan_info)))
    ws = torch.zeros(pinned.numel(), dtype=torch.uint8, device="cuda")
    qo = torch.arange(0, 9 * 4, 4, dtype=torch.int32, device="cuda")
    kv = _indptr(lens).cuda()
    gqa, split = 4, fs.prefill_max_batch_size_if_split(fs.Device.current().num_sm, 8)
    prefill_plan(qo, kv, ws, info, batch_size=8, gqa=gqa, max_batch_size_if_split=split, page_size=1)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill_plan(qo, kv, ws, info, batch_size=8, gqa=gqa, max_batch_size_if_split=split, page_size=1)
    for _ in range(10):
        lens = _lens(rng, 8)
        call, plan_info, pinned = site.plan(lens)
        kv.copy_(_indptr(lens).cuda())
        ws.zero_()
        graph.replay()
        model = fs.plan_call(call, fs.Device.current())
        assert fs.read_written(plan_info, ws.cpu(), model, 8) == fs.read_written(plan_info, pinned, model, 8), lens





def _decode_written(info: dict, ws: torch.Tensor, bs: int) -> dict:
    raw = ws.cpu()
    i32 = raw.view(torch.int32)
    o = i32[info["o_indptr_offset"] // 4: info["o_indptr_offset"] // 4 + bs + 1].tolist()
    n = o[-1]
    out = {"o_indptr": o, "request_indices": i32[info["request_indices_offset"] // 4:][:n].tolist(),
           "kv_tile_indices": i32[info["kv_tile_indices_offset"] // 4:][:n].tolist(),
           "kv_chunk_size": int(i32[info["kv_chunk_size_ptr_offset"] // 4])}
    if info["split_kv"]:
        at = info["block_valid_mask_offset"]
        out["block_valid_mask"] = raw[at: at + info["padded_batch_size"]].tolist()
    return out


@pytest.mark.parametrize("heads", [(8, 8), (16, 8), (32, 32)])  # GQA below 4: SGLang's CUDA-core draft decode
def test_the_device_decode_plan_writes_what_flashinfers_cuda_core_planner_writes(heads):
    rng = random.Random(5)
    hq, hkv = heads
    for bs in (1, 2, 4, 8, 16, 48):
        i32 = dict(dtype=torch.int32, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True,
            use_tensor_cores=False, paged_kv_indptr_buffer=torch.zeros(bs + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(1 << 20, **i32), paged_kv_last_page_len_buffer=torch.ones(bs, **i32))
        last = torch.ones(bs, **i32)
        for _ in range(10):
            lens = _lens(rng, bs)
            indptr = _indptr(lens)
            w.plan(indptr.cuda(), torch.zeros(int(indptr[-1]), **i32), last, hq, hkv, 128, 1,
                   data_type=torch.bfloat16, q_data_type=torch.bfloat16)
            info = dict(zip(DECODE_PLAN_INFO_FIELDS, (int(x) for x in w._plan_info)))
            ws = torch.zeros(w._pin_memory_int_workspace_buffer.numel(), dtype=torch.uint8, device="cuda")
            decode_plan(indptr.cuda(), ws, info, batch_size=bs, page_size=1)
            assert _decode_written(info, ws, bs) == _decode_written(info, w._pin_memory_int_workspace_buffer, bs), \
                (bs, heads, lens)


def test_attention_after_the_device_replan_is_bit_identical_to_attention_after_sglangs():
    """The whole point: FlashInfer's kernels, given the plan made on the device (no host lengths), compute the
    same bits as after SGLang's fast_prefill_plan from the exact host lengths."""
    from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan
    from sglang_hostsync_plugin.flashinfer_device_plan import replan_prefill

    rng = random.Random(6)
    torch.manual_seed(6)
    hq, hkv, hd, pool = 32, 8, 128, 50000
    k = torch.randn(pool, 1, hkv, hd, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(pool, 1, hkv, hd, dtype=torch.bfloat16, device="cuda")
    num_sm = fs.Device.current().num_sm
    for bs, qo in ((1, 4), (2, 8), (4, 4), (8, 2), (16, 1), (3, 8)):
        stock, mine = Prefill(bs, qo, (hq, hkv)), Prefill(bs, qo, (hq, hkv))
        for _ in range(6):
            lens = [min(n, 20000) for n in _lens(rng, bs)]
            qo_host = torch.arange(0, (bs + 1) * qo, qo, dtype=torch.int32)
            kv_host = _indptr(lens)
            idx = torch.randint(0, pool, (int(kv_host[-1]),), dtype=torch.int32, device="cuda")
            last = torch.ones(bs, dtype=torch.int32, device="cuda")
            fast_prefill_plan(stock.w, qo_host.cuda(), kv_host.cuda(), idx, last, hq, hkv, hd, 1,
                              q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, non_blocking=True,
                              qo_indptr_host=qo_host, kv_indptr_host=kv_host,
                              kv_lens_host=torch.tensor(lens, dtype=torch.int32), max_q_len=qo, max_kv_len=max(lens))
            replan_prefill(mine.w, qo_host.cuda(), kv_host.cuda(), idx, last, num_qo_heads=hq, num_kv_heads=hkv,
                           page_size=1, num_sm=num_sm)
            q = torch.randn(bs * qo, hq, hd, dtype=torch.bfloat16, device="cuda")
            a, b = stock.w.run(q, (k, v)), mine.w.run(q, (k, v))
            assert torch.equal(a, b), (bs, qo, lens, (a.float() - b.float()).abs().max().item())


def _tree_mask(lens, width, gen):
    """A verify's mask as SGLang hands it over: per request, ``width`` query rows over its KV, row-major; the
    prefix visible to every row, the draft tokens a random tree with each token seeing itself."""
    parts = []
    for n in lens:
        m = torch.ones(width, n, dtype=torch.bool)
        tree = torch.rand(width, width, generator=gen) < 0.5
        m[:, n - width:] = tree | torch.eye(width, dtype=torch.bool)
        parts.append(m.flatten())
    return torch.cat(parts).cuda()


def test_attention_after_the_device_replan_with_a_tree_mask_is_bit_identical_to_sglangs():
    """A topk > 1 verify: the packed tree mask and the plan made on the device (grid from a host KV bound,
    larger than every length) give FlashInfer's kernels the bits SGLang's fast_prefill_plan gives them."""
    from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan
    from sglang_hostsync_plugin.flashinfer_device_plan import replan_prefill

    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    hq, hkv, hd, pool = 32, 8, 128, 50000
    k = torch.randn(pool, 1, hkv, hd, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(pool, 1, hkv, hd, dtype=torch.bfloat16, device="cuda")
    num_sm = fs.Device.current().num_sm
    i32 = dict(dtype=torch.int32, device="cuda")

    def masked_wrapper(bs, width):
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            _workspace(), "NHD", use_cuda_graph=True, backend="fa2", qo_indptr_buf=torch.zeros(bs + 1, **i32),
            paged_kv_indptr_buf=torch.zeros(bs + 1, **i32), paged_kv_indices_buf=torch.zeros(POOL, **i32),
            paged_kv_last_page_len_buf=torch.ones(bs, **i32),
            custom_mask_buf=torch.zeros(bs * 20000 * width // 8 + bs, dtype=torch.uint8, device="cuda"),
            mask_indptr_buf=torch.zeros(bs + 1, **i32))
        lens = [width + 1] * bs  # the capture, as SGLang's: one plan() with a mask
        qo_host, kv_host = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32), _indptr(lens)
        w.plan(qo_host.cuda(), kv_host.cuda(), torch.zeros(int(kv_host[-1]), **i32), torch.ones(bs, **i32), hq, hkv,
               hd, 1, custom_mask=_tree_mask(lens, width, gen), causal=False, q_data_type=DT, kv_data_type=DT)
        return w

    for bs, width in ((1, 4), (2, 8), (4, 4), (8, 8), (3, 8)):
        stock, mine = masked_wrapper(bs, width), masked_wrapper(bs, width)
        for _ in range(5):
            lens = [max(min(n, 20000), width) for n in _lens(rng, bs)]
            qo_host = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32)
            kv_host = _indptr(lens)
            idx = torch.randint(0, pool, (int(kv_host[-1]),), **i32)
            last = torch.ones(bs, **i32)
            mask = _tree_mask(lens, width, gen)
            fast_prefill_plan(stock, qo_host.cuda(), kv_host.cuda(), idx, last, hq, hkv, hd, 1, custom_mask=mask,
                              q_data_type=DT, kv_data_type=DT, non_blocking=True, qo_indptr_host=qo_host,
                              kv_indptr_host=kv_host, kv_lens_host=torch.tensor(lens, dtype=torch.int32),
                              max_q_len=width, max_kv_len=max(lens), uniform_verify_width=width)
            replan_prefill(mine, qo_host.cuda(), kv_host.cuda(), idx, last, num_qo_heads=hq, num_kv_heads=hkv,
                           page_size=1, num_sm=num_sm, custom_mask=mask, query_width=width,
                           max_kv_len_bound=max(lens) + 777)
            q = torch.randn(bs * width, hq, hd, dtype=torch.bfloat16, device="cuda")
            a, b = stock.run(q, (k, v)), mine.run(q, (k, v))
            assert not a.isnan().any()
            assert torch.equal(a, b), (bs, width, lens, (a.float() - b.float()).abs().max().item())

