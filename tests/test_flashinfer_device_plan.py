"""The device plan writes what FlashInfer's CUDA-graph prefill plan writes (the CPU port of FlashInfer 0.7.2's
planner, ``flashinfer_split``, which the GPU tests hold against FlashInfer itself), on random lengths: page
boundaries, a single request, KV lengths of 0 and 1, non-uniform query widths, one KV head to eight."""

import random

import pytest
import torch
import triton

from sglang_hostsync_plugin import flashinfer_split as port
from sglang_hostsync_plugin.flashinfer_device_plan import decode_plan, prefill_plan

STALE = 0xA5  # the bytes a replayed workspace holds from earlier plans


def packed(sizes: dict) -> tuple[dict, int]:
    """FlashInfer's int workspace layout: each array after the last, 16-byte aligned (AlignedAllocator)."""
    offsets, at = {}, 0
    for field, size in sizes.items():
        offsets[field] = at
        at += -(-size // 16) * 16
    return offsets, at + 16


def untouched_outside(ws: torch.Tensor, written: list) -> bool:
    """Every byte outside the spans the plan may write still holds STALE: no array ran into another."""
    keep = torch.ones(ws.numel(), dtype=torch.bool)
    for at, n in written:
        keep[at: at + n] = False
    return bool((ws[keep] == STALE).all())


def prefill_layout(model, bs: int, rows: int) -> tuple[dict, int]:
    """A CUDA-graph prefill plan's plan_info (as a dict) over FlashInfer's packed layout, and its size."""
    padded = model.padded_batch_size
    info, size = packed({"request_indices_offset": 4 * padded, "qo_tile_indices_offset": 4 * padded,
                         "kv_tile_indices_offset": 4 * padded, "o_indptr_offset": 4 * (bs + 1),
                         "kv_chunk_size_ptr_offset": 4, "merge_indptr_offset": 4 * (rows + 1),
                         "block_valid_mask_offset": padded, "total_num_rows_offset": 4})
    info.update(cta_tile_q=model.cta_tile_q, padded_batch_size=padded, total_num_rows=rows, split_kv=1,
                enable_cuda_graph=1)
    return info, size


def stand_in_wrapper(info: dict, size: int, bs: int, masked: bool = False):
    """The attributes of a captured fa2 CUDA-graph wrapper that ``replan_prefill`` reads and writes."""
    from types import SimpleNamespace

    i32 = dict(dtype=torch.int32)
    return SimpleNamespace(
        is_cuda_graph_enabled=True, _backend="fa2", _plan_info=[info.get(f, 0) for f in port.PLAN_INFO_FIELDS],
        _qo_indptr_buf=torch.zeros(bs + 1, **i32), _paged_kv_indptr_buf=torch.zeros(bs + 1, **i32),
        _paged_kv_last_page_len_buf=torch.zeros(bs, **i32), _paged_kv_indices_buf=torch.zeros(20000, **i32),
        _int_workspace_buffer=torch.full((size,), STALE, dtype=torch.uint8),
        _mask_indptr_buf=torch.full((bs + 1,), -1, **i32) if masked else None,
        _custom_mask_buf=torch.full((8000,), STALE, dtype=torch.uint8) if masked else None)


def run_case(qo_lens, kv_tokens, *, qo_heads, kv_heads, page_size, captured_rows=None, num_sm=132):
    bs = len(qo_lens)
    qo_indptr = [0]
    for n in qo_lens:
        qo_indptr.append(qo_indptr[-1] + n)
    kv_indptr = port.page_indptr(kv_tokens, page_size)
    max_split = port.prefill_max_batch_size_if_split(num_sm, kv_heads)
    rows = captured_rows or qo_indptr[-1]
    model = port.prefill_split_qo_kv_indptr(
        qo_indptr, kv_indptr, total_num_rows=rows, batch_size=bs, num_qo_heads=qo_heads,
        num_kv_heads=kv_heads, head_dim=128, page_size=page_size, max_batch_size_if_split=max_split,
        enable_cuda_graph=True)
    padded = model.padded_batch_size
    info, size = prefill_layout(model, bs, rows)
    ws = torch.full((size,), STALE, dtype=torch.uint8)
    prefill_plan(torch.tensor(qo_indptr, dtype=torch.int32), torch.tensor(kv_indptr, dtype=torch.int32), ws, info,
                 batch_size=bs, gqa=qo_heads // kv_heads, max_batch_size_if_split=max_split, page_size=page_size)
    plan_info = [info.get(f, 0) for f in port.PLAN_INFO_FIELDS]
    n = model.new_batch_size
    written = [(info["request_indices_offset"], 4 * n), (info["qo_tile_indices_offset"], 4 * n),
               (info["kv_tile_indices_offset"], 4 * n), (info["o_indptr_offset"], 4 * (bs + 1)),
               (info["kv_chunk_size_ptr_offset"], 4), (info["merge_indptr_offset"], 4 * (qo_indptr[-1] + 1)),
               (info["block_valid_mask_offset"], padded), (info["total_num_rows_offset"], 4)]
    differ = port.compare(model, plan_info, ws, bs)
    if not untouched_outside(ws, written):
        differ.append("a byte outside the plan's arrays changed")
    return model, differ


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
    # the checks the tests rest on see a plan the device did not make, and a write past an array's end
    model, _ = run_case([4, 4], [300, 5000], qo_heads=32, kv_heads=8, page_size=1)
    info, size = packed({"request_indices_offset": 4 * model.padded_batch_size, "o_indptr_offset": 12})
    plan_info = [{"split_kv": 1, "enable_cuda_graph": 1}.get(f, info.get(f, 0)) for f in port.PLAN_INFO_FIELDS]
    stale = torch.full((size,), STALE, dtype=torch.uint8)
    assert port.compare(model, plan_info, stale, 2)
    stale[info["o_indptr_offset"] + 12] = 0
    assert not untouched_outside(stale, [(info["o_indptr_offset"], 12)])


def test_a_work_list_longer_than_the_padded_arrays_stays_in_them():
    # FlashInfer's decode search counts an empty request as no work: 100 empty and 4 long ones make a list of
    # 232 items for 132 slots; the device plan writes within the arrays all the same
    kv_indptr = port.page_indptr([0] * 100 + [30000] * 4, 1)
    model = port.decode_plan(kv_indptr, 8, 1, True, 1056)
    assert model.new_batch_size > model.padded_batch_size
    padded = model.padded_batch_size
    info, size = packed({"request_indices_offset": 4 * padded, "kv_tile_indices_offset": 4 * padded,
                         "o_indptr_offset": 4 * (padded + 1), "kv_chunk_size_ptr_offset": 4,
                         "block_valid_mask_offset": padded})
    info.update(padded_batch_size=padded, split_kv=True)
    ws = torch.full((size,), STALE, dtype=torch.uint8)
    decode_plan(torch.tensor(kv_indptr, dtype=torch.int32), ws, info, batch_size=104, page_size=1)
    assert untouched_outside(ws, [(info["request_indices_offset"], 4 * padded), (info["kv_tile_indices_offset"], 4 * padded),
                                  (info["o_indptr_offset"], 4 * 105), (info["kv_chunk_size_ptr_offset"], 4),
                                  (info["block_valid_mask_offset"], padded)])
    assert ws.view(torch.int32)[info["o_indptr_offset"] // 4] == 0


def decode_case(kv_tokens, *, kv_heads, page_size, max_grid):
    bs = len(kv_tokens)
    kv_indptr = port.page_indptr(kv_tokens, page_size)
    model = port.decode_plan(kv_indptr, kv_heads, page_size, True, max_grid)
    padded = model.padded_batch_size
    sizes = {"request_indices_offset": 4 * padded, "kv_tile_indices_offset": 4 * padded,
             "o_indptr_offset": 4 * (padded + 1), "kv_chunk_size_ptr_offset": 4}
    if model.split_kv:
        sizes["block_valid_mask_offset"] = padded
    info, size = packed(sizes)
    info.setdefault("block_valid_mask_offset", 0)  # FlashInfer's DecodePlanInfo leaves it 0 without split KV
    info.update(padded_batch_size=padded, split_kv=model.split_kv)
    ws = torch.full((size,), STALE, dtype=torch.uint8)
    decode_plan(torch.tensor(kv_indptr, dtype=torch.int32), ws, info, batch_size=bs, page_size=page_size)
    raw = ws.view(torch.int32)

    def i32(field, n):
        return tuple(raw[info[field] // 4: info[field] // 4 + n].tolist())

    n = model.new_batch_size
    got = {"request_indices": i32("request_indices_offset", n), "kv_tile_indices": i32("kv_tile_indices_offset", n),
           "o_indptr": i32("o_indptr_offset", bs + 1), "kv_chunk_size": i32("kv_chunk_size_ptr_offset", 1)[0]}
    want = {"request_indices": model.request_indices, "kv_tile_indices": model.kv_tile_indices,
            "o_indptr": model.o_indptr, "kv_chunk_size": model.kv_chunk_size_tokens}
    written = [(info["request_indices_offset"], 4 * n), (info["kv_tile_indices_offset"], 4 * n),
               (info["o_indptr_offset"], 4 * (bs + 1)), (info["kv_chunk_size_ptr_offset"], 4)]
    if model.split_kv:
        at = info["block_valid_mask_offset"]
        got["block_valid_mask"] = tuple(ws[at: at + padded].tolist())
        want["block_valid_mask"] = (1,) * n + (0,) * (padded - n)
        written.append((at, padded))
    got["outside"] = want["outside"] = untouched_outside(ws, written) or "a byte outside the plan's arrays changed"
    return model, got, want


@pytest.mark.parametrize("seed", range(30))
def test_the_device_decode_plan_is_flashinfers_cuda_core_decode_plan(seed):
    rng = random.Random(2000 + seed)
    bs = rng.choice([1, 2, 3, 5, 8, 16, 31, 64, 100])
    kv_heads = rng.choice([1, 2, 4, 8])
    page_size = rng.choice([1, 16])
    max_grid = rng.choice([132, 264, 528, 1056])  # num_blocks_per_sm x 132 SMs
    # KV of at least one token, as every SGLang decode row has: FlashInfer's decode search counts an empty
    # request as no work and its list then as one item, so enough empty ones make the list longer than the
    # padded arrays it is written into (the device plan writes only within them)
    kv = [rng.choice([1, rng.randrange(1, 200), rng.randrange(1, 40000), page_size * rng.randrange(1, 300)])
          for _ in range(bs)]
    model, got, want = decode_case(kv, kv_heads=kv_heads, page_size=page_size, max_grid=max_grid)
    assert got == want, (seed, bs, kv_heads, max_grid, model.split_kv)


def test_a_decode_batch_that_fills_the_grid_is_planned_unsplit():
    model, got, want = decode_case([5000] * 40, kv_heads=8, page_size=1, max_grid=264)  # 40 x 8 >= 264
    assert not model.split_kv and got == want


def test_replan_prefill_copies_sglangs_buffers_and_plans_into_the_wrappers_workspace():
    """``replan_prefill`` on a stand-in for a captured fa2 wrapper: the four device buffers as
    ``fast_prefill_plan`` copies them, the plan at the capture's ``_plan_info`` (which stays); a wrapper
    never planned, or not fa2, is refused."""
    from sglang_hostsync_plugin.flashinfer_device_plan import replan_prefill

    bs, qo, lens = 3, 4, [700, 5, 9000]
    qo_indptr = torch.arange(0, (bs + 1) * qo, qo, dtype=torch.int32)
    kv_indptr = torch.tensor(port.page_indptr(lens, 1), dtype=torch.int32)
    model = port.plan_prefill_for_lens(lens, qo)
    info, size = prefill_layout(model, bs, bs * qo)
    plan_info = [info.get(f, 0) for f in port.PLAN_INFO_FIELDS]
    i32 = dict(dtype=torch.int32)
    w = stand_in_wrapper(info, size, bs)
    indices = torch.arange(sum(lens), dtype=torch.int32)
    replan_prefill(w, qo_indptr, kv_indptr, indices, torch.ones(bs, **i32), num_qo_heads=32, num_kv_heads=8,
                   page_size=1, num_sm=port.H100_NUM_SM)
    assert torch.equal(w._qo_indptr_buf, qo_indptr) and torch.equal(w._paged_kv_indptr_buf, kv_indptr)
    assert torch.equal(w._paged_kv_indices_buf[: sum(lens)], indices) and int(w._paged_kv_last_page_len_buf.sum()) == bs
    assert port.compare(model, plan_info, w._int_workspace_buffer, bs) == []
    refusals = [({"_plan_info": None}, {}, "planned once"), ({"_backend": "fa3"}, {}, "planned once"),
                ({"is_cuda_graph_enabled": False}, {}, "planned once"),
                ({"_custom_mask_buf": torch.zeros(8, dtype=torch.uint8)}, {}, "only where the capture had one"),
                ({"_window_left": 512}, {}, "no sliding window"), ({}, {"fixed_split_size": 256}, "no fixed split"),
                ({}, {"num_sm": 264}, "another device's SM count"),  # its budget outgrows the captured arrays
                ({"_plan_info": [1 if f == "split_kv" else 0 if f == "enable_cuda_graph" else v
                                 for f, v in zip(port.PLAN_INFO_FIELDS, plan_info)]}, {}, "CUDA-graph plans")]
    for broken, kwargs, why in refusals:
        with pytest.raises(ValueError, match=why):
            replan_prefill(type(w)(**{**vars(w), **broken}), qo_indptr, kv_indptr, indices,
                           torch.ones(bs, **i32), **{"num_qo_heads": 32, "num_kv_heads": 8, "page_size": 1,
                                                     "num_sm": 132, **kwargs})


COMPILE = """
import sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from sglang_hostsync_plugin.flashinfer_device_plan import _plan_kernel as kernel
names = [p.name for p in kernel.params]
for variant in (dict(DECODE=False, SPLIT=True), dict(DECODE=True, SPLIT=True), dict(DECODE=True, SPLIT=False)):
    consts = {**variant, "BLOCK": 16, "BLOCK_P": 32, "SEARCH_STEPS": 32}
    sig = {n: "constexpr" if n in consts else "*u8" if n == "ws8" else
           "*i32" if n in ("qo_indptr", "kv_indptr", "ws32") else "i32" for n in names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()})
    try:
        asm = compile(src, target=GPUTarget("cuda", 90, 32)).asm
    except RuntimeError as exc:
        if "ptxas" in str(exc):
            print("no ptxas:", exc); sys.exit(3)
        raise
    print(variant, sorted(asm))
"""


def test_the_kernel_compiles_for_an_h100():
    """The interpreter runs the kernel's Python; this compiles it as a GPU would (Triton's own compiler to an
    sm_90 cubin, no GPU needed), where loop-carried types, runtime loop bounds and constexpr branches bite.
    In a process of its own: under TRITON_INTERPRET Triton's language functions are the interpreter's."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode == 3:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("'cubin'") == 3, out.stdout


@pytest.mark.parametrize("seed", range(4))
def test_replan_prefill_packs_a_topk_verify_mask_as_fast_prefill_plan_does(seed):
    """A topk > 1 verify's tree mask: the packed bytes and their indptr, summed on the device and packed with a
    grid from a KV bound, equal what SGLang's fast_prefill_plan makes from the exact host lengths."""
    from sglang.kernels.ops.speculative.pack_verify_mask import pack_verify_mask_into

    from sglang_hostsync_plugin.flashinfer_device_plan import replan_prefill

    rng = random.Random(seed)
    bs, width = rng.choice([1, 3, 8]), rng.choice([4, 8])
    lens = [rng.randrange(width, 900) for _ in range(bs)]
    qo_indptr = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32)
    kv_indptr = torch.tensor(port.page_indptr(lens, 1), dtype=torch.int32)
    mask = torch.rand(int(kv_indptr[-1]) * width) < 0.5
    model = port.plan_prefill_for_lens(lens, width)
    info, size = prefill_layout(model, bs, bs * width)
    i32 = dict(dtype=torch.int32)
    w = stand_in_wrapper(info, size, bs, masked=True)
    replan_prefill(w, qo_indptr, kv_indptr, torch.arange(int(kv_indptr[-1]), **i32), torch.ones(bs, **i32),
                   num_qo_heads=32, num_kv_heads=8, page_size=1, num_sm=132, custom_mask=mask, query_width=width,
                   max_kv_len_bound=4096)
    # fast_prefill_plan's own lines: the host indptr from the exact lengths, the grid from the exact maximum
    lens_host = torch.tensor(lens, **i32)
    want_indptr = torch.zeros(bs + 1, **i32)
    want_indptr[1:] = torch.cumsum((lens_host * width + 7) // 8, dim=0)
    want = torch.full((8000,), STALE, dtype=torch.uint8)
    pack_verify_mask_into(mask, kv_indptr, want_indptr, want, batch_size=bs, query_width=width, max_kv_len=max(lens))
    assert torch.equal(w._mask_indptr_buf, want_indptr)
    assert torch.equal(w._custom_mask_buf, want)
    assert port.compare(model, w._plan_info, w._int_workspace_buffer, bs) == []
    with pytest.raises(ValueError, match="KV length bound"):
        replan_prefill(w, qo_indptr, kv_indptr, torch.arange(int(kv_indptr[-1]), **i32), torch.ones(bs, **i32),
                       num_qo_heads=32, num_kv_heads=8, page_size=1, num_sm=132, custom_mask=mask, query_width=width)
