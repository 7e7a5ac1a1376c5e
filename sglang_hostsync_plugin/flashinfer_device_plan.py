"""FlashInfer 0.7.2's fa2 CUDA-graph plans (prefill, CUDA-core decode) made on the device from its own lengths.

No host lengths, no sync. Under CUDA graphs everything the planner writes that depends on the KV lengths
lives in the device int workspace: the chunk size, the (request, qo tile, kv tile) work list,
``merge_indptr``, ``o_indptr``, ``block_valid_mask`` and the row count. ``plan_info`` (the offsets, the
padded batch size, ``cta_tile_q``, ``split_kv``, which is always true under CUDA graphs) is fixed by the
captured shape. So the plan a replay needs can be computed on the stream from the exact device lengths:
``prefill_plan`` is ``scheduler.cuh``'s ``PrefillBinarySearchKVChunkSize`` + ``PrefillSplitQOKVIndptr`` for
that case (no sliding window, no fixed split, split KV on); ``decode_plan`` is ``DecodePlan``'s (the CUDA-core
decode kernel's planner). Both are checked against the CPU port (``flashinfer_split``) in
``tests/test_flashinfer_device_plan.py``.

Wired into SGLang by the slot ``flashinfer_device_plan`` (docs/flashinfer-bound-plan.md,
"A plan made on the device").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .flashinfer_split import PLAN_INFO_FIELDS, prefill_max_batch_size_if_split


# FlashInfer 0.7.2's DecodePlanInfo::ToVector (scheduler.cuh): a CUDA-core decode plan's plan_info.
DECODE_PLAN_INFO_FIELDS = ("padded_batch_size", "v_offset", "s_offset", "request_indices_offset",
                           "kv_tile_indices_offset", "o_indptr_offset", "block_valid_mask_offset",
                           "kv_chunk_size_ptr_offset", "enable_cuda_graph", "split_kv")
# Every integer argument changes with the captured bucket or the layout: none of them makes a compiled variant
# (``BLOCK``, the batch rounded up to a power of two, at least 16, does).
INT_ARGS = ["bs", "gqa", "cta_tile_q", "budget", "min_kv_chunk_size", "page_size", "padded", "max_rows", "request_off",
            "qo_tile_off", "kv_tile_off", "merge_off", "o_off", "chunk_off", "mask_off", "rows_off"]


@triton.jit(do_not_specialize=INT_ARGS)
def _plan_kernel(
    qo_indptr, kv_indptr,  # int32 [bs + 1] each, KV in pages (qo_indptr unread by a decode plan)
    ws32, ws8,  # the device int workspace as int32 and as uint8 (block_valid_mask is bytes)
    bs, gqa, cta_tile_q, budget, min_kv_chunk_size, page_size, padded, max_rows,
    request_off, qo_tile_off, kv_tile_off, merge_off, o_off, chunk_off, mask_off, rows_off,  # int32 / byte offsets
    DECODE: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    live = offs < bs
    kv = tl.load(kv_indptr + offs + 1, mask=live, other=0) - tl.load(kv_indptr + offs, mask=live, other=0)
    kv1 = tl.maximum(kv, 1)
    if DECODE:  # one query row, one tile per request
        qo_lo = offs
        qo_len = live.to(tl.int32)
        tiles_q = qo_len
    else:
        qo_lo = tl.load(qo_indptr + offs, mask=live, other=0)
        qo_len = tl.load(qo_indptr + offs + 1, mask=live, other=0) - qo_lo
        tiles_q = tl.where(live, (qo_len * gqa + cta_tile_q - 1) // cta_tile_q, 0)

    if SPLIT:
        # PrefillBinarySearchKVChunkSize / PartitionPagedKVCacheBinarySearchMinNumPagePerBatch: the smallest
        # chunk whose work list fits the budget (the decode search counts an empty request as no work)
        low = min_kv_chunk_size
        if DECODE:
            high = tl.max(tl.where(live, kv, 0), axis=0)
        else:
            high = tl.maximum(tl.max(tl.where(live, kv1, 1), axis=0), 1)
        for _ in range(SEARCH_STEPS):
            active = low < high
            mid = tl.maximum((low + high) // 2, 1)
            if DECODE:
                work = tl.sum(tl.where(live, (kv + mid - 1) // mid, 0), axis=0)
            else:
                work = tl.sum(tiles_q * ((kv1 + mid - 1) // mid), axis=0)
            low = tl.where(active & (work > budget), mid + 1, low)
            high = tl.where(active & (work <= budget), mid, high)
        chunk = low
    else:  # a decode batch that fills the grid on its own: one chunk per request, as long as the longest
        chunk = tl.maximum(tl.max(tl.where(live, kv, 1), axis=0), 1)

    chunks = tl.where(live, (kv1 + chunk - 1) // chunk, 0)
    per_request = tiles_q * chunks
    start = tl.cumsum(per_request, axis=0) - per_request  # each request's first work item
    new_batch_size = tl.sum(per_request, axis=0)
    outs = qo_len * chunks
    tl.store(ws32 + o_off, 0)
    tl.store(ws32 + o_off + 1 + offs, tl.cumsum(outs, axis=0), mask=live)
    tl.store(ws32 + chunk_off, chunk * page_size)

    # The work list, item p: its request is the last whose start is <= p; within it, qo tiles outer, kv tiles inner
    for p0 in range(0, padded, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        owns = (start[None, :] <= p[:, None]) & live[None, :] & (per_request[None, :] > 0)
        r = tl.max(tl.where(owns, offs[None, :], -1), axis=1)  # requests with no work (no query rows) own none
        pick = offs[None, :] == r[:, None]
        r_start = tl.sum(tl.where(pick, start[None, :], 0), axis=1)
        r_chunks = tl.maximum(tl.sum(tl.where(pick, chunks[None, :], 0), axis=1), 1)
        j = p - r_start
        valid = (p < new_batch_size) & (p < padded)  # within the arrays, whatever the lengths
        tl.store(ws32 + request_off + p, r, mask=valid)
        tl.store(ws32 + kv_tile_off + p, j % r_chunks, mask=valid)
        if not DECODE:
            tl.store(ws32 + qo_tile_off + p, j // r_chunks, mask=valid)
        if SPLIT:
            tl.store(ws8 + mask_off + p, valid.to(tl.uint8), mask=p < padded)

    if not DECODE:
        total_rows = tl.load(qo_indptr + bs)
        tl.store(ws32 + rows_off, total_rows)
        # merge_indptr: one entry per query row, each row adding its request's chunk count
        row_out = tl.cumsum(outs, axis=0) - outs  # merge_indptr before each request's first row
        tl.store(ws32 + merge_off, 0)
        for q0 in range(0, max_rows, BLOCK_P):  # the captured row count bounds the real one
            q = q0 + tl.arange(0, BLOCK_P)
            mine = (qo_lo[None, :] <= q[:, None]) & live[None, :] & (qo_len[None, :] > 0)
            r = tl.max(tl.where(mine, offs[None, :], -1), axis=1)
            pick = offs[None, :] == r[:, None]
            base = tl.sum(tl.where(pick, row_out[None, :], 0), axis=1)
            lo = tl.sum(tl.where(pick, qo_lo[None, :], 0), axis=1)
            n = tl.sum(tl.where(pick, chunks[None, :], 0), axis=1)
            tl.store(ws32 + merge_off + 1 + q, base + (q - lo + 1) * n, mask=q < total_rows)


def launch_plan(kv_indptr, workspace, qo_indptr, *ints_and_flags) -> None:
    """One plan kernel launch from tensors and ints fixed per CUDA-graph wrapper (``prefill_args`` /
    ``decode_args``), so SGLang's ``replay_launches`` can relaunch it (slot ``triton_replay_launch``). Each tensor
    is passed once, as its recording maps every kernel pointer to exactly one input: the workspace's int32 view is
    taken here, and a decode plan's ``qo_indptr`` is None (the kernel gets ``kv_indptr`` there, unread)."""
    *ints, decode, split, block = ints_and_flags
    _plan_kernel[(1,)](kv_indptr if qo_indptr is None else qo_indptr, kv_indptr, workspace.view(dtype=torch.int32),
                       workspace, *ints, DECODE=decode, SPLIT=split, BLOCK=block, BLOCK_P=32, SEARCH_STEPS=32)


def prefill_args(qo_indptr, kv_indptr, workspace, plan_info: dict, *, batch_size: int, gqa: int,
                 max_batch_size_if_split: int, page_size: int) -> tuple:
    """``launch_plan``'s arguments for what FlashInfer's CUDA-graph prefill plan writes for these lengths into
    ``workspace`` (the device int workspace, uint8) at ``plan_info``'s offsets (byte offsets, as
    ``flashinfer_split.PLAN_INFO_FIELDS`` names them; ``cta_tile_q`` and ``padded_batch_size`` from the same
    plan_info). ``kv_indptr`` in pages; both int32 with ``batch_size + 1`` entries on the device. The caller
    keeps the real row count within the captured one (``plan_info``'s ``total_num_rows``) and passes the
    capture's split budget: then the work list fits the padded arrays, as FlashInfer's checks require."""
    if not (plan_info["enable_cuda_graph"] and plan_info["split_kv"]):
        # without split KV (disable_split_kv) merge_indptr has no array of its own: its offset is 0
        raise ValueError("the device plan covers CUDA-graph plans with split KV only")
    if max_batch_size_if_split > plan_info["padded_batch_size"]:
        raise ValueError(f"a split budget of {max_batch_size_if_split} exceeds the captured padded batch size "
                         f"{plan_info['padded_batch_size']} (another device's SM count?)")
    return (
        kv_indptr, workspace, qo_indptr,
        batch_size, gqa, plan_info["cta_tile_q"], max_batch_size_if_split, max(128 // page_size, 1), page_size,
        plan_info["padded_batch_size"], plan_info["total_num_rows"],
        plan_info["request_indices_offset"] // 4, plan_info["qo_tile_indices_offset"] // 4,
        plan_info["kv_tile_indices_offset"] // 4, plan_info["merge_indptr_offset"] // 4,
        plan_info["o_indptr_offset"] // 4, plan_info["kv_chunk_size_ptr_offset"] // 4,
        plan_info["block_valid_mask_offset"], plan_info["total_num_rows_offset"] // 4,
        False, True, max(16, triton.next_power_of_2(batch_size)),
    )


def decode_args(kv_indptr, workspace, plan_info: dict, *, batch_size: int, page_size: int) -> tuple:
    """The same for FlashInfer's CUDA-core decode plan (``DecodePlan`` under CUDA graphs: plan_info by
    ``DECODE_PLAN_INFO_FIELDS``). Its split budget is the grid's blocks over the KV heads, which under CUDA
    graphs is the plan's padded batch size: ``nb * gdy > max_grid`` holds exactly when ``nb > max_grid // gdy``."""
    padded = plan_info["padded_batch_size"]
    return (
        kv_indptr, workspace, None,
        batch_size, 1, 1, padded, max(128 // page_size, 1), page_size, padded, 0,
        plan_info["request_indices_offset"] // 4, 0, plan_info["kv_tile_indices_offset"] // 4, 0,
        plan_info["o_indptr_offset"] // 4, plan_info["kv_chunk_size_ptr_offset"] // 4,
        plan_info["block_valid_mask_offset"], 0,
        True, bool(plan_info["split_kv"]), max(16, triton.next_power_of_2(batch_size)),
    )


def prefill_plan(*args, **kwargs) -> None:
    """Writes, on the current stream, the prefill plan ``prefill_args`` describes."""
    launch_plan(*prefill_args(*args, **kwargs))


def decode_plan(*args, **kwargs) -> None:
    """Writes, on the current stream, the decode plan ``decode_args`` describes."""
    launch_plan(*decode_args(*args, **kwargs))


def replan_prefill(wrapper, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, *,
                   num_qo_heads: int, num_kv_heads: int, page_size: int, num_sm: int | None = None,
                   fixed_split_size: int | None = None, custom_mask=None, query_width: int | None = None,
                   max_kv_len_bound: int | None = None) -> None:
    """SGLang's ``fast_prefill_plan`` for a captured fa2 CUDA-graph wrapper without any host lengths: the
    device buffers copied as it copies them, and the planner's arrays made on the device into the wrapper's
    int workspace, at the capture's ``_plan_info``, which stays. ``_qo_indptr_last`` is left too (only an eager
    ``run()`` reads it; SGLang's sites replay a fixed width). A topk > 1 verify's ``custom_mask`` is packed as
    SGLang packs it (``pack_verify_mask_into``), its indptr summed on the device, its grid sized from
    ``max_kv_len_bound``, a host bound on every request's KV length (programs past a request's mask store
    nothing). Refused: a sliding window, a fixed split size (its ``split_kv`` follows the lengths).
    ``num_sm``: the wrapper's device's."""
    if not (wrapper.is_cuda_graph_enabled and getattr(wrapper, "_backend", None) == "fa2"
            and getattr(wrapper, "_plan_info", None) is not None):
        raise ValueError("replan_prefill needs an fa2 CUDA-graph wrapper planned once (the capture)")
    masked = getattr(wrapper, "_custom_mask_buf", None) is not None
    if (masked != (custom_mask is not None) or getattr(wrapper, "_window_left", -1) >= 0
            or (fixed_split_size or 0) > 0 or len(wrapper._plan_info) != len(PLAN_INFO_FIELDS)
            or num_qo_heads % num_kv_heads):
        raise ValueError("replan_prefill covers a custom mask only where the capture had one, no sliding window "
                         "and no fixed split size")
    if masked and (page_size != 1 or not query_width or not max_kv_len_bound):
        raise ValueError("a custom mask needs page size 1, its query width and a KV length bound")
    if num_sm is None:
        num_sm = torch.cuda.get_device_properties(wrapper.device).multi_processor_count
    batch_size = len(paged_kv_last_page_len)
    wrapper._qo_indptr_buf.copy_(qo_indptr, non_blocking=True)
    wrapper._paged_kv_indptr_buf.copy_(paged_kv_indptr, non_blocking=True)
    wrapper._paged_kv_last_page_len_buf.copy_(paged_kv_last_page_len, non_blocking=True)
    wrapper._paged_kv_indices_buf[: len(paged_kv_indices)].copy_(
        paged_kv_indices, non_blocking=paged_kv_indices.device == wrapper._paged_kv_indices_buf.device)
    if masked:
        from sglang.kernels.ops.speculative.pack_verify_mask import pack_verify_mask_into

        kv = paged_kv_indptr[: batch_size + 1].to(torch.int64)
        packed = (kv[1:] - kv[:-1]) * query_width + 7  # bytes per request's mask, as fast_prefill_plan sums them
        wrapper._mask_indptr_buf[:1].zero_()
        torch.cumsum(packed // 8, dim=0, dtype=wrapper._mask_indptr_buf.dtype,
                     out=wrapper._mask_indptr_buf[1: batch_size + 1])
        pack_verify_mask_into(custom_mask, wrapper._paged_kv_indptr_buf, wrapper._mask_indptr_buf,
                              wrapper._custom_mask_buf, batch_size=batch_size, query_width=query_width,
                              max_kv_len=max_kv_len_bound)
    info = dict(zip(PLAN_INFO_FIELDS, (int(x) for x in wrapper._plan_info)))
    prefill_plan(wrapper._qo_indptr_buf, wrapper._paged_kv_indptr_buf, wrapper._int_workspace_buffer, info,
                 batch_size=batch_size, gqa=num_qo_heads // num_kv_heads,
                 max_batch_size_if_split=prefill_max_batch_size_if_split(num_sm, num_kv_heads), page_size=page_size)
