"""A CPU port of FlashInfer 0.7.2's split-KV planners: the FA2 prefill planner (``PrefillPlan``), which
plans SGLang's verify, draft-extend and tensor-core draft-decode CUDA-graph replays, and a model of the
CUDA-core decode planner.

Usage::

    from sglang_hostsync_plugin import flashinfer_split as fs

    plan = fs.plan_prefill_for_lens([4000, 4000], 4)        # a verify of 4 tokens per request, H100
    call = fs.PlannerCall.from_args(args)                   # one ``_cached_module.plan(*args)`` call
    site = fs.SplitSite(call, fs.Device.current())
    site.key(call.kv_lens) == site.key(other_lens)          # the same plan (``SplitSite.key``)
    fs.compare(fs.plan_call(call, device), plan_info, pinned_buffer)   # [] when FlashInfer agrees

Ported from FlashInfer 0.7.2 (wheel flashinfer_python-0.7.2, ``_build_meta``
``__git_commit__ d84335d8c54e0c8f9f7e22faa15c7e34a58abf94``; the version SGLang 0.5.23 pins):

  include/flashinfer/attention/scheduler.cuh
    PartitionPagedKVCacheBinarySearchMinNumPagePerBatch   :74
    PrefillBinarySearchKVChunkSize                        :101-130
    BatchDecodeWithPagedKVCacheWorkEstimationDispatched   :150-210
    DecodeSplitKVIndptr                                   :349-364
    DecodePlanImpl (padded_batch_size)                    :443-445
    PrefillSplitQOKVIndptr                                :545-683
    PrefillPlanInfo (the plan_info vector)                :686-760
    PrefillPlanImpl (max_batch_size_if_split, what it writes into the pinned buffer,
                     the partial-rows check)              :764-928
  include/flashinfer/utils.cuh  FA2DetermineCtaTileQ      :411-488
  csrc/batch_prefill.cu  BatchPrefillWithKVCachePlan      :47-72 (the 20 arguments; kv_len_arr is not
                                                          forwarded to the planner)

What the prefill planner writes is a function of the query layout, the arguments that are not lengths,
the device (SM count, compute capability, opt-in shared memory) and, of the KV lengths, only three
things: the chunk size, the split flag and each request's chunk count (``SplitSite.key``). Every array
it writes, its plan_info vector and its refusals (``new_batch_size > padded_batch_size``, the partial
rows check) follow from those. The chunk size is monotone non-decreasing in every KV length (the
smallest feasible chunk of a feasibility test that only gets harder with longer rows, clamped by the
longest row), and so is each chunk count at a fixed chunk: equal keys at two length vectors ``lo <=
hi`` mean the same plan for every vector between them (tests/test_flashinfer_certified_plan.py).

The CUDA-core decode planner's grid (``max_grid_size``) comes from the decode kernel's occupancy, which
the CPU cannot compute: ``decode_plan`` takes it as a parameter and nothing certifies from it.

Nothing here ran on a GPU; ``compare`` is how a GPU host checks the port against FlashInfer's own
planner (the slot ``flashinfer_certified_plan``, not registered, on the planner calls it watches: every
call of its first 1000, then every 8th; tests/test_gpu_flashinfer_certified_plan.py on random batches).
That slot's bit-identity rests on this port matching FlashInfer: the GPU tests passing is the
precondition for registering it. The CPU tests check the port against itself (property tests) and
against cases derived by hand from the C++ (tests/test_flashinfer_split_model.py, and the hand-derived
planner in tests/test_flashinfer_certified_plan.py).
"""

from __future__ import annotations

import array
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

__all__ = [
    "FLASHINFER_VERSION", "INT64_MAX", "Device", "H100", "PrefillPlanModel", "DecodePlanModel", "PlannerCall",
    "SplitSite", "ceil_div", "fa2_determine_cta_tile_q", "prefill_binary_search_kv_chunk_size",
    "prefill_split_qo_kv_indptr", "prefill_max_batch_size_if_split", "partition_paged_kv_binary_search",
    "decode_plan", "page_indptr", "plan_prefill_for_lens", "plan_decode_for_lens", "plan_call", "compare",
    "read_written", "other_flashinfer",
]

FLASHINFER_VERSION = "0.7.2"
INT64_MAX = (1 << 63) - 1


def other_flashinfer() -> str | None:
    """The installed flashinfer-python's version where it is not FLASHINFER_VERSION (SGLang 0.5.23's pin), else
    None (also without FlashInfer, or without its distribution metadata)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    if find_spec("flashinfer") is None:
        return None
    try:
        have = version("flashinfer-python")
    except PackageNotFoundError:
        return None
    return None if have == FLASHINFER_VERSION else have

# H100 SXM defaults (the numbers the planner reads from the device).
H100_NUM_SM = 132
H100_MAX_SMEM_OPTIN = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KiB)


@dataclass(frozen=True)
class Device:
    """What the planner reads from the current device: the SM count
    (``cudaDevAttrMultiProcessorCount``), the compute capability's major and the opt-in shared memory
    per block (``cudaDevAttrMaxSharedMemoryPerBlockOptin``)."""

    __slots__ = ("num_sm", "cc_major", "max_smem_optin")
    num_sm: int
    cc_major: int
    max_smem_optin: int

    @classmethod
    def current(cls) -> "Device":
        """The current CUDA device's values (the planner asks ``cudaGetDevice``'s device)."""
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return cls(props.multi_processor_count, props.major, int(props.shared_memory_per_block_optin))


H100 = Device(H100_NUM_SM, 9, H100_MAX_SMEM_OPTIN)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# utils.cuh:411 FA2DetermineCtaTileQ
# ---------------------------------------------------------------------------
def fa2_determine_cta_tile_q(
    avg_packed_qo_len: int,
    head_dim: int,
    head_dim_qk: int = 0,
    kv_dtype_bytes: int = 2,
    cc_major: int = 9,
    max_smem_per_block_optin: int = H100_MAX_SMEM_OPTIN,
) -> int:
    qk = head_dim_qk if head_dim_qk else head_dim
    if head_dim >= 512:
        return 16 if avg_packed_qo_len <= 32 else 32
    if qk >= 512:
        return 16
    if avg_packed_qo_len > 64 and head_dim < 256:
        return 128
    if cc_major >= 8:
        if avg_packed_qo_len > 16:
            return 64
        q_tile_smem = 16 * qk * 2
        kv_step_smem_1x4 = (qk + head_dim) * 16 * 4 * kv_dtype_bytes
        if q_tile_smem + kv_step_smem_1x4 > max_smem_per_block_optin:
            return 64
        return 16
    return 64


# ---------------------------------------------------------------------------
# scheduler.cuh:101 PrefillBinarySearchKVChunkSize
# ---------------------------------------------------------------------------
def prefill_binary_search_kv_chunk_size(
    enable_cuda_graph: bool,
    max_batch_size_if_split: int,
    packed_qo_len_arr: Sequence[int],
    kv_len_arr: Sequence[int],
    qo_chunk_size: int,
    min_kv_chunk_size: int = 1,
) -> Tuple[bool, int]:
    max_kv_len = 1
    for kv_len in kv_len_arr:
        max_kv_len = max(max_kv_len, kv_len)
    low, high = min_kv_chunk_size, max_kv_len
    while low < high:
        mid = (low + high) // 2
        new_batch_size = 0
        for q, kv in zip(packed_qo_len_arr, kv_len_arr):
            new_batch_size += ceil_div(q, qo_chunk_size) * ceil_div(max(kv, 1), mid)
        if new_batch_size > max_batch_size_if_split:
            low = mid + 1
        else:
            high = mid
    return (enable_cuda_graph or low < max_kv_len), low


@dataclass(frozen=True)
class PrefillPlanModel:
    """What PrefillPlan writes (host side) for one call."""

    split_kv: bool
    new_batch_size: int
    padded_batch_size: int
    cta_tile_q: int
    kv_chunk_size_pages: int  # before scheduler.cuh:679's *= page_size
    page_size: int
    num_chunks: Tuple[int, ...]  # per request (the layout of tmp_v / merge_indptr)
    request_indices: Tuple[int, ...]
    qo_tile_indices: Tuple[int, ...]
    kv_tile_indices: Tuple[int, ...]
    merge_indptr: Tuple[int, ...]
    o_indptr: Tuple[int, ...]
    total_num_rows: int = 0  # the argument, stored in plan_info
    enable_cuda_graph: bool = False
    qo_rows: int = 0  # qo_indptr[batch_size], written at total_num_rows_offset under CUDA graphs

    @property
    def kv_chunk_size_tokens(self) -> int:
        # scheduler.cuh:679. With disable_split_kv this is INT64_MAX*page_size in
        # C++ (overflow for page_size > 1) and is then truncated to IdType when
        # stored; the kernel ignores it because split_kv is false.
        return self.kv_chunk_size_pages * self.page_size

    @property
    def kv_chunk_size_written(self) -> int:
        """``kv_chunk_size_ptr_h[0]``: the int64 product, wrapped, stored as the int32 IdType."""
        low = (self.kv_chunk_size_pages * self.page_size) & 0xFFFFFFFF
        return low - (1 << 32) if low >= 1 << 31 else low


# ---------------------------------------------------------------------------
# scheduler.cuh:545 PrefillSplitQOKVIndptr  (+ PrefillPlanImpl:784-791, :855-861)
# ---------------------------------------------------------------------------
def prefill_split_qo_kv_indptr(
    qo_indptr_h: Sequence[int],
    kv_indptr_h: Sequence[int],  # PAGE indptr (what plan() gets from paged_kv_indptr)
    total_num_rows: int,
    batch_size: int,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    max_batch_size_if_split: int,
    enable_cuda_graph: bool,
    window_left: int = -1,
    fixed_split_size: int = -1,
    disable_split_kv: bool = False,
    uniform_q_len: int = 0,
    head_dim_qk: int = 0,
    kv_dtype_bytes: int = 2,
    cc_major: int = 9,
    max_smem_per_block_optin: int = H100_MAX_SMEM_OPTIN,
) -> PrefillPlanModel:
    """The plan, or ValueError where FlashInfer raises (FLASHINFER_ERROR / FLASHINFER_CHECK)."""
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError("num_qo_heads should be divisible by num_kv_heads (PrefillPlanImpl)")
    gqa = num_qo_heads // num_kv_heads
    packed_qo_len_arr = []
    kv_len_arr = []
    for i in range(batch_size):
        packed = (qo_indptr_h[i + 1] - qo_indptr_h[i]) * gqa
        kv = kv_indptr_h[i + 1] - kv_indptr_h[i]
        if packed < 0 or kv < 0:
            raise ValueError("indptr must be non-decreasing")
        packed_qo_len_arr.append(packed)
        kv_len_arr.append(kv)

    cta = lambda n: fa2_determine_cta_tile_q(  # noqa: E731
        n, head_dim, head_dim_qk, kv_dtype_bytes, cc_major, max_smem_per_block_optin
    )
    min_kv_chunk_size = max(128 // page_size, 1)  # :579
    if enable_cuda_graph:  # :582
        if uniform_q_len > 0:
            packed_uniform = uniform_q_len * gqa
            if any(p != packed_uniform for p in packed_qo_len_arr):
                raise ValueError("qo_indptr does not match uniform_q_len")
            cta_tile_q = cta(packed_uniform)
            total_num_tiles_q = batch_size * ceil_div(packed_uniform, cta_tile_q)
        else:
            max_seq_len = total_num_rows - batch_size + 1  # :603 (uint64 in C++)
            if max_seq_len < 1:
                raise ValueError("total_num_rows < batch_size: the C++ wraps around here, the port does not")
            cta_tile_q = cta(max_seq_len * gqa)
            total_num_tiles_q = ceil_div(total_num_rows * gqa, cta_tile_q) + batch_size - 1
    else:
        avg = sum(packed_qo_len_arr) // batch_size  # :618
        cta_tile_q = cta(avg)
        total_num_tiles_q = sum(ceil_div(p, cta_tile_q) for p in packed_qo_len_arr)

    effective = [
        min(ceil_div(window_left + cta_tile_q, page_size) if window_left >= 0 else kv, kv)
        for kv in kv_len_arr
    ]
    split_kv = False
    if disable_split_kv:  # :637
        kv_chunk_size = INT64_MAX
    elif fixed_split_size > 0:
        kv_chunk_size = fixed_split_size
    else:
        split_kv, kv_chunk_size = prefill_binary_search_kv_chunk_size(
            enable_cuda_graph,
            max_batch_size_if_split,
            packed_qo_len_arr,
            effective,
            cta_tile_q,
            min_kv_chunk_size,
        )

    request_indices: List[int] = []
    qo_tile_indices: List[int] = []
    kv_tile_indices: List[int] = []
    merge_indptr = [0]
    o_indptr = [0]
    num_chunks_list: List[int] = []
    new_batch_size = 0
    for r in range(batch_size):
        packed = packed_qo_len_arr[r]
        num_tiles_q = ceil_div(packed, cta_tile_q)
        kv_len = max(effective[r], 1)
        num_chunks = 1 if disable_split_kv else ceil_div(kv_len, kv_chunk_size)
        if fixed_split_size > 0 and not disable_split_kv:
            split_kv = split_kv or num_chunks > 1  # :654
        for qt in range(num_tiles_q):
            for kt in range(num_chunks):
                new_batch_size += 1
                request_indices.append(r)
                qo_tile_indices.append(qt)
                kv_tile_indices.append(kt)
        qo_len = packed // gqa
        for _ in range(qo_len):
            merge_indptr.append(merge_indptr[-1] + num_chunks)
        o_indptr.append(o_indptr[-1] + qo_len * num_chunks)
        num_chunks_list.append(num_chunks)

    padded = (
        max(max_batch_size_if_split, total_num_tiles_q) if enable_cuda_graph else new_batch_size
    )  # :672-673
    if new_batch_size > padded:
        raise ValueError(
            "new batch size should not exceed padded batch size (FLASHINFER_CHECK, :674)"
        )
    if split_kv and o_indptr[-1] > ceil_div(padded * cta_tile_q, gqa):  # PrefillPlanImpl :855-861
        raise ValueError("batch_prefill partial outputs need more rows than the plan reserved (FLASHINFER_CHECK)")
    return PrefillPlanModel(
        split_kv=split_kv,
        new_batch_size=new_batch_size,
        padded_batch_size=padded,
        cta_tile_q=cta_tile_q,
        kv_chunk_size_pages=kv_chunk_size,
        page_size=page_size,
        num_chunks=tuple(num_chunks_list),
        request_indices=tuple(request_indices),
        qo_tile_indices=tuple(qo_tile_indices),
        kv_tile_indices=tuple(kv_tile_indices),
        merge_indptr=tuple(merge_indptr),
        o_indptr=tuple(o_indptr),
        total_num_rows=total_num_rows,
        enable_cuda_graph=enable_cuda_graph,
        qo_rows=qo_indptr_h[batch_size],
    )


def prefill_max_batch_size_if_split(num_sm: int, num_kv_heads: int, num_colocated_ctas: int = 0) -> int:
    """PrefillPlanImpl :788-791 (num_blocks_per_sm is hard-coded 2)."""
    max_grid_size = max(0, 2 * num_sm - num_colocated_ctas)
    return max_grid_size // num_kv_heads


# ---------------------------------------------------------------------------
# Decode (CUDA-core) planner: scheduler.cuh:74, :150-210, :349, :443
# ---------------------------------------------------------------------------
def partition_paged_kv_binary_search(
    max_grid_size: int, gdy: int, num_pages: Sequence[int], min_num_pages_per_batch: int = 1
) -> Tuple[int, int]:
    low, high = min_num_pages_per_batch, 0
    for e in num_pages:
        high = max(high, e)
    while low < high:
        mid = (low + high) // 2
        nb = sum(ceil_div(e, mid) for e in num_pages)
        if nb * gdy > max_grid_size:
            low = mid + 1
        else:
            high = mid
    nb = sum(ceil_div(max(e, 1), low) for e in num_pages)
    return low, nb


@dataclass(frozen=True)
class DecodePlanModel:
    split_kv: bool
    new_batch_size: int
    padded_batch_size: int
    kv_chunk_size_pages: int
    page_size: int
    num_chunks: Tuple[int, ...]
    request_indices: Tuple[int, ...]
    kv_tile_indices: Tuple[int, ...]
    o_indptr: Tuple[int, ...]

    @property
    def kv_chunk_size_tokens(self) -> int:
        return self.kv_chunk_size_pages * self.page_size  # DecodePlanImpl :471


def decode_plan(
    kv_indptr_h: Sequence[int],
    num_kv_heads: int,
    page_size: int,
    enable_cuda_graph: bool,
    max_grid_size: int,
) -> DecodePlanModel:
    """max_grid_size = num_blocks_per_sm * num_sm; num_blocks_per_sm comes from
    cudaOccupancyMaxActiveBlocksPerMultiprocessor of the decode kernel (:180) and
    cannot be derived on the CPU -- it is a parameter here."""
    bs = len(kv_indptr_h) - 1
    gdy = num_kv_heads
    pages = [kv_indptr_h[i + 1] - kv_indptr_h[i] for i in range(bs)]
    if bs * gdy >= max_grid_size:  # :183
        split_kv = False
        chunk = max([1] + pages)
        new_bs = bs
    else:
        chunk, new_bs = partition_paged_kv_binary_search(
            max_grid_size, gdy, pages, max(128 // page_size, 1)
        )
        split_kv = not (new_bs == bs and not enable_cuda_graph)  # :200-206
    padded = (max_grid_size // gdy if split_kv else bs) if enable_cuda_graph else new_bs
    req, kvt, o_indptr, nchunks = [], [], [0], []
    for b in range(bs):  # DecodeSplitKVIndptr :349
        n = ceil_div(max(pages[b], 1), chunk)
        nchunks.append(n)
        for t in range(n):
            req.append(b)
            kvt.append(t)
        o_indptr.append(o_indptr[-1] + n)
    return DecodePlanModel(
        split_kv, new_bs, padded, chunk, page_size, tuple(nchunks), tuple(req), tuple(kvt),
        tuple(o_indptr),
    )


# ---------------------------------------------------------------------------
# SGLang-shaped helpers
# ---------------------------------------------------------------------------
def page_indptr(lens_tokens: Sequence[int], page_size: int) -> List[int]:
    out = [0]
    for n in lens_tokens:
        out.append(out[-1] + ceil_div(n, page_size))
    return out


def plan_prefill_for_lens(
    kv_lens_tokens: Sequence[int],
    qo_len: int,
    *,
    num_qo_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    page_size: int = 1,
    num_sm: int = H100_NUM_SM,
    enable_cuda_graph: bool = True,
    fixed_split_size: int = -1,
    disable_split_kv: bool = False,
) -> PrefillPlanModel:
    """A uniform-width plan as SGLang issues it for TARGET_VERIFY / DRAFT_EXTEND
    (qo_len = tokens per request) or tensor-core draft decode (qo_len = 1):
    uniform_q_len = 0 and num_colocated_ctas = 0 on every SGLang path
    (fast_prefill_plan, plain plan(), fast_decode_plan with q_len_per_req=1).
    Under CUDA graphs total_num_rows is the captured bs*qo_len; the model takes
    the captured bucket equal to the real batch."""
    bs = len(kv_lens_tokens)
    qo_indptr = [i * qo_len for i in range(bs + 1)]
    return prefill_split_qo_kv_indptr(
        qo_indptr,
        page_indptr(kv_lens_tokens, page_size),
        total_num_rows=bs * qo_len,
        batch_size=bs,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        max_batch_size_if_split=prefill_max_batch_size_if_split(num_sm, num_kv_heads),
        enable_cuda_graph=enable_cuda_graph,
        fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv,
    )


def plan_decode_for_lens(
    kv_lens_tokens: Sequence[int],
    *,
    num_kv_heads: int = 8,
    page_size: int = 1,
    enable_cuda_graph: bool = True,
    num_sm: int = H100_NUM_SM,
    num_blocks_per_sm: int = 4,
) -> DecodePlanModel:
    return decode_plan(
        page_indptr(kv_lens_tokens, page_size),
        num_kv_heads,
        page_size,
        enable_cuda_graph,
        num_blocks_per_sm * num_sm,
    )


# ---------------------------------------------------------------------------
# One call of the FA2 prefill planner, as FlashInfer's Python side makes it
# ---------------------------------------------------------------------------
# ``_cached_module.plan`` of an fa2 prefill module (SGLang's fast_prefill_plan, FlashInfer's plan(),
# FlashInfer's fast_decode_plan with tensor cores): BatchPrefillWithKVCachePlan's 20 arguments.
PREFILL_PLAN_ARGS = 20
QO_INDPTR, KV_INDPTR, KV_LENS = 3, 4, 5


@dataclass(frozen=True)
class PlannerCall:
    """The arguments of one fa2 prefill planner call, the workspace buffers left out."""

    qo_indptr: Tuple[int, ...]
    kv_indptr: Tuple[int, ...]
    total_num_rows: int
    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    page_size: int
    enable_cuda_graph: bool
    head_dim_qk: int
    head_dim_vo: int
    causal: bool
    window_left: int
    fixed_split_size: int
    disable_split_kv: bool
    num_colocated_ctas: int
    uniform_q_len: int

    @classmethod
    def from_args(cls, args: Sequence) -> "PlannerCall":
        """ValueError for a call of another planner (FlashInfer's CUDA-core decode planner takes 15
        arguments, its fa3 prefill planner 16): only the fa2 prefill planner is ported."""
        if len(args) != PREFILL_PLAN_ARGS:
            raise ValueError(f"a planner call of {len(args)} arguments is not the fa2 prefill planner's")
        (qo, kv), rest = (_ints(args[QO_INDPTR]), _ints(args[KV_INDPTR])), args[6:]
        return cls(qo, kv, int(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]), bool(rest[5]),
                   int(rest[6]), int(rest[7]), bool(rest[8]), int(rest[9]), int(rest[10]), bool(rest[11]),
                   int(rest[12]), int(rest[13]))

    @property
    def kv_lens(self) -> Tuple[int, ...]:
        """Per row, in pages (SGLang plans FlashInfer with page size 1: tokens)."""
        kv = self.kv_indptr
        return tuple(kv[i + 1] - kv[i] for i in range(self.batch_size))

    def fixed(self) -> tuple:
        """Everything but the KV lengths."""
        return (self.qo_indptr, *(getattr(self, f) for f in self.__dataclass_fields__ if f not in ("qo_indptr",
                                                                                                   "kv_indptr")))

    def with_kv_lens(self, lens: Sequence[int]) -> "PlannerCall":
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + int(n))
        return replace(self, kv_indptr=tuple(indptr))


def _ints(t) -> Tuple[int, ...]:
    return tuple(int(x) for x in (t.tolist() if hasattr(t, "tolist") else t))


def plan_call(call: PlannerCall, device: Device = H100, kv_dtype_bytes: int = 2) -> PrefillPlanModel:
    """What FlashInfer 0.7.2's PrefillPlan computes for ``call`` on ``device`` (ValueError: it raises)."""
    return prefill_split_qo_kv_indptr(
        call.qo_indptr, call.kv_indptr, call.total_num_rows, call.batch_size, call.num_qo_heads,
        call.num_kv_heads, call.head_dim_vo, call.page_size,
        prefill_max_batch_size_if_split(device.num_sm, call.num_kv_heads, call.num_colocated_ctas),
        call.enable_cuda_graph, call.window_left, call.fixed_split_size, call.disable_split_kv, call.uniform_q_len,
        call.head_dim_qk, kv_dtype_bytes, device.cc_major, device.max_smem_optin)


class SplitSite:
    """One planner call site with its non-length arguments fixed: ``key(kv_lens)`` is what the plan
    depends on of the KV lengths (the split flag, the chunk size, each row's chunk count), or None where
    FlashInfer would refuse the plan. Two length vectors with equal keys get the same plan: every array,
    plan_info entry and refusal is a function of the key and the fixed arguments (module docstring)."""

    def __init__(self, call: PlannerCall, device: Device = H100, kv_dtype_bytes: int = 2):
        self.call = call
        # A length-free plan gives every length-independent quantity (cta_tile_q, the padded size).
        self.base = plan_call(call.with_kv_lens([0] * call.batch_size), device, kv_dtype_bytes)
        gqa = call.num_qo_heads // call.num_kv_heads
        qo = call.qo_indptr
        self.tiles_q = [ceil_div((qo[i + 1] - qo[i]) * gqa, self.base.cta_tile_q) for i in range(call.batch_size)]
        self.qo_lens = [qo[i + 1] - qo[i] for i in range(call.batch_size)]
        self.budget = prefill_max_batch_size_if_split(device.num_sm, call.num_kv_heads, call.num_colocated_ctas)
        self.min_chunk = max(128 // call.page_size, 1)
        self.window = (ceil_div(call.window_left + self.base.cta_tile_q, call.page_size)
                       if call.window_left >= 0 else None)
        self.gqa = gqa

    def key(self, kv_lens: Sequence[int]) -> Optional[tuple]:
        c = self.call
        kv = [min(self.window, n) if self.window is not None else n for n in kv_lens]
        if c.disable_split_kv:
            chunk, split = INT64_MAX, False
        elif c.fixed_split_size > 0:
            chunk, split = c.fixed_split_size, False
        else:
            max_kv = max([1, *kv])
            low, high = self.min_chunk, max_kv
            while low < high:
                mid = (low + high) // 2
                n = 0
                for t, k in zip(self.tiles_q, kv):
                    n += t * -(-max(k, 1) // mid)
                if n > self.budget:
                    low = mid + 1
                else:
                    high = mid
            chunk, split = low, c.enable_cuda_graph or low < max_kv
        counts = (1,) * len(kv) if c.disable_split_kv else tuple(-(-max(k, 1) // chunk) for k in kv)
        if c.fixed_split_size > 0 and not c.disable_split_kv:
            split = any(n > 1 for n in counts)
        new_batch_size = sum(t * n for t, n in zip(self.tiles_q, counts))
        padded = self.base.padded_batch_size if c.enable_cuda_graph else new_batch_size
        if new_batch_size > padded:
            return None
        if split and sum(q * n for q, n in zip(self.qo_lens, counts)) > ceil_div(padded * self.base.cta_tile_q,
                                                                                  self.gqa):
            return None
        return (split, chunk) + counts


# ---------------------------------------------------------------------------
# What FlashInfer returned and wrote: plan_info (PrefillPlanInfo::ToVector) and the pinned buffer
# ---------------------------------------------------------------------------
PLAN_INFO_FIELDS = ("padded_batch_size", "total_num_rows", "total_num_rows_offset", "cta_tile_q",
                    "request_indices_offset", "qo_tile_indices_offset", "kv_tile_indices_offset",
                    "merge_indptr_offset", "o_indptr_offset", "kv_chunk_size_ptr_offset", "v_offset", "s_offset",
                    "block_valid_mask_offset", "enable_cuda_graph", "split_kv")


def read_written(plan_info: Sequence[int], pinned, model: PrefillPlanModel, batch_size: int) -> dict:
    """The arrays PrefillPlanImpl wrote into the pinned buffer, read at plan_info's own offsets, as
    long as ``model`` says they are (a model that disagrees on a length shows as a mismatch).
    ``pinned``: the page-locked int workspace the call was given (bytes, a uint8 numpy array or a
    uint8 tensor)."""
    import numpy as np

    raw = np.asarray(pinned.numpy() if hasattr(pinned, "numpy") else pinned, dtype=np.uint8).reshape(-1)
    info = dict(zip(PLAN_INFO_FIELDS, (int(x) for x in plan_info)))

    def i32(offset: int, n: int) -> Tuple[int, ...]:
        return tuple(int(x) for x in raw[offset: offset + 4 * n].view(np.int32))

    n = model.new_batch_size
    out = {
        "request_indices": i32(info["request_indices_offset"], n),
        "qo_tile_indices": i32(info["qo_tile_indices_offset"], n),
        "kv_tile_indices": i32(info["kv_tile_indices_offset"], n),
        "o_indptr": i32(info["o_indptr_offset"], batch_size + 1),
        "kv_chunk_size": i32(info["kv_chunk_size_ptr_offset"], 1)[0],
    }
    if info["split_kv"]:
        out["merge_indptr"] = i32(info["merge_indptr_offset"], len(model.merge_indptr))
    if info["enable_cuda_graph"]:
        out["total_num_rows_h"] = int(raw[info["total_num_rows_offset"]: info["total_num_rows_offset"] + 4]
                                      .view(np.uint32)[0])
        mask = info["block_valid_mask_offset"]
        out["block_valid_mask"] = tuple(bool(x) for x in raw[mask: mask + info["padded_batch_size"]])
    return out


def compare(model: PrefillPlanModel, plan_info: Sequence[int], pinned, batch_size: int) -> List[str]:
    """The fields where FlashInfer's own plan (its plan_info and what it wrote into ``pinned``)
    differs from the port's ``model`` of the same call; [] when they agree."""
    import numpy as np

    info = dict(zip(PLAN_INFO_FIELDS, (int(x) for x in plan_info)))
    bad = [f"{f}: flashinfer {info[f]}, port {int(want)}" for f, want in (
        ("padded_batch_size", model.padded_batch_size), ("total_num_rows", model.total_num_rows),
        ("cta_tile_q", model.cta_tile_q), ("enable_cuda_graph", model.enable_cuda_graph),
        ("split_kv", model.split_kv)) if info[f] != int(want)]
    if bad:
        return bad  # the arrays are laid out by these: reading them would only echo the difference
    want = {"request_indices": ("request_indices_offset", model.request_indices, "i"),
            "qo_tile_indices": ("qo_tile_indices_offset", model.qo_tile_indices, "i"),
            "kv_tile_indices": ("kv_tile_indices_offset", model.kv_tile_indices, "i"),
            "o_indptr": ("o_indptr_offset", model.o_indptr, "i"),
            "kv_chunk_size": ("kv_chunk_size_ptr_offset", (model.kv_chunk_size_written,), "i")}
    if model.split_kv:
        want["merge_indptr"] = ("merge_indptr_offset", model.merge_indptr, "i")
    if model.enable_cuda_graph:
        want["total_num_rows_h"] = ("total_num_rows_offset", (model.qo_rows,), "I")
        want["block_valid_mask"] = ("block_valid_mask_offset", (1,) * model.new_batch_size
                                    + (0,) * (model.padded_batch_size - model.new_batch_size), "B")
    raw = np.asarray(pinned.numpy() if hasattr(pinned, "numpy") else pinned, dtype=np.uint8).reshape(-1)
    differ = []
    for name, (offset, values, code) in want.items():
        expect = array.array(code, values).tobytes()
        at = info[offset]
        if raw[at: at + len(expect)].tobytes() != expect:
            differ.append(name)
    if not differ:
        return []
    got = read_written(plan_info, pinned, model, batch_size)
    single = ("kv_chunk_size", "total_num_rows_h")
    return [f"{k}: flashinfer {_short(got[k])}, port {_short(want[k][1][0] if k in single else want[k][1])}"
            for k in differ]


def tuple_(x):
    return tuple(x) if isinstance(x, (tuple, list)) else x


def _short(x) -> str:
    s = str(tuple_(x))
    return s if len(s) <= 80 else s[:77] + "..."
