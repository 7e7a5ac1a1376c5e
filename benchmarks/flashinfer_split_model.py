"""Pure-Python model of FlashInfer 0.7.2's FA2 split-KV planner (CPU only).

Question it answers: if SGLang planned FlashInfer from HOST UPPER BOUNDS of the
sequence lengths (no per-step D2H of seq_lens), would the plan -- and therefore
the bits of the attention output -- equal stock's plan over the exact lengths?

Ported from FlashInfer 0.7.2 (wheel flashinfer_python-0.7.2, _build_meta
__git_commit__ d84335d8c54e0c8f9f7e22faa15c7e34a58abf94):

  include/flashinfer/attention/scheduler.cuh
    PartitionPagedKVCacheBinarySearchMinNumPagePerBatch   :74
    PrefillBinarySearchKVChunkSize                        :101-130
    BatchDecodeWithPagedKVCacheWorkEstimationDispatched   :150-210
    DecodeSplitKVIndptr                                   :349-364
    DecodePlanImpl (padded_batch_size)                    :443-445
    PrefillSplitQOKVIndptr                                :545-683
    PrefillPlanImpl (max_batch_size_if_split)             :784-791
  include/flashinfer/utils.cuh  FA2DetermineCtaTileQ      :411-488

and of the kernels' use of the plan (what a bound plan does at run time):

  prefill.cuh BatchPrefillWithPagedKVCacheDevice :3808-3833 (chunk bounds from
      the DEVICE kv_len), :4293-4294 (partial-output row stride
      num_kv_chunks = ceil_div(kv_len, kv_chunk_size), DEVICE kv_len)
  decode.cuh BatchDecodeWithPagedKVCacheDevice :432-438 (chunk_start is not
      clamped to kv_len -> uint32 underflow for a tile past the real length)

Everything here is a model: nothing ran on a GPU. See docs/flashinfer-bound-plan.md.

Run:  python benchmarks/flashinfer_split_model.py [--trials N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

INT64_MAX = (1 << 63) - 1

# H100 SXM defaults (the numbers the planner reads from the device).
H100_NUM_SM = 132
H100_MAX_SMEM_OPTIN = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KiB)


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

    @property
    def kv_chunk_size_tokens(self) -> int:
        # scheduler.cuh:679. With disable_split_kv this is INT64_MAX*page_size in
        # C++ (overflow for page_size > 1) and is then truncated to IdType when
        # stored; the kernel ignores it because split_kv is false.
        return self.kv_chunk_size_pages * self.page_size


# ---------------------------------------------------------------------------
# scheduler.cuh:545 PrefillSplitQOKVIndptr  (+ PrefillPlanImpl:784-791)
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
            max_seq_len = total_num_rows - batch_size + 1  # :603
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
# Run-time behaviour of a plan built from host lengths H over real lengths R
# ---------------------------------------------------------------------------
def real_partition(real_len: int, plan) -> Tuple[int, ...]:
    """Boundaries of the non-empty KV chunks the kernel reduces for one request
    (the kernel bounds every chunk by the DEVICE kv_len). One chunk covering
    [0, real_len) is the same computation whether split_kv is on or off."""
    if not plan.split_kv:
        return (0, real_len)
    c = plan.kv_chunk_size_tokens
    m = ceil_div(max(real_len, 1), c)
    return tuple(min(k * c, real_len) for k in range(m)) + (real_len,)


def kernel_num_chunks(real_len: int, plan) -> int:
    """prefill.cuh:4293: the partial-output row stride the kernel uses."""
    if not plan.split_kv:
        return 1
    return ceil_div(max(real_len, 1), plan.kv_chunk_size_tokens)


IDENTICAL = "identical"  # same plan vectors -> same bits
EQUAL_BITS = "equal_bits"  # different plan, same real-chunk partition (inferred bit-equal)
REORDERED = "reordered"  # correct, but real KV chunked differently -> reduction reordered
INCORRECT = "incorrect"  # plan/kernel layout mismatch or out-of-range tile
REFUSED = "refused"  # the planner itself raises (FLASHINFER_CHECK new_batch_size <= padded)


def classify(
    exact_plan,
    bound_plan,
    real_lens_tokens: Sequence[int],
    qo_len: int,
    kernel: str = "prefill",
) -> str:
    """kernel: 'prefill' (FA2 batch-prefill kernel: verify, draft extend,
    tensor-core decode) or 'decode' (CUDA-core batch-decode kernel)."""
    # correctness of running bound_plan over the real lengths
    if bound_plan.split_kv:
        c = bound_plan.kv_chunk_size_tokens
        for r, n_plan in zip(real_lens_tokens, bound_plan.num_chunks):
            m = kernel_num_chunks(r, bound_plan)
            if kernel == "prefill":
                # rows of one request are laid out with stride n_plan by the plan
                # (merge_indptr/o_indptr) but written with stride m by the kernel.
                if qo_len > 1 and n_plan != m:
                    return INCORRECT
            else:
                # decode.cuh:435-438: chunk_start = t*c is not clamped; a tile with
                # t*c > kv_len underflows chunk_size (uint32).
                for t in range(m, n_plan):
                    if t * c > r:
                        return INCORRECT
    if exact_plan == bound_plan:
        return IDENTICAL
    if all(real_partition(r, exact_plan) == real_partition(r, bound_plan) for r in real_lens_tokens):
        return EQUAL_BITS
    return REORDERED


def round_up(x: int, m: int) -> int:
    return ceil_div(x, m) * m


def _simulate(
    rng: random.Random,
    trials: int,
    *,
    site: str,
    cuda_graph: bool,
    plan_page: int,
    round_page: int,
    extra_max: int,
    accept_window: int,
    num_kv_heads: int = 8,
    num_qo_heads: int = 32,
    fixed_split_size: int = -1,
    disable_split_kv: bool = False,
    batch_size: Optional[int] = None,
):
    counts = {IDENTICAL: 0, EQUAL_BITS: 0, REORDERED: 0, INCORRECT: 0, REFUSED: 0}
    certified = 0
    certified_chunk = 0
    safe = 0
    for _ in range(trials):
        bs = batch_size if batch_size else rng.randint(1, 16)
        if site == "verify":  # verify / draft extend: uniform tokens-per-request 2..8
            qo = rng.randint(2, 8)
        else:
            qo = 1
        window = qo if site == "verify" else accept_window
        # real kv lengths seen by the kernel (verify window included)
        committed = [rng.randint(1, 8000) for _ in range(bs)]
        accept = [rng.randint(1, window) for _ in range(bs)]
        real = [c + a for c, a in zip(committed, accept)]
        bound = [round_up(r + rng.randint(0, extra_max), round_page) for r in real]
        lo = [c + 1 for c in committed]
        hi = [c + window for c in committed]
        if site == "decode_cuda_core":
            mk = lambda lens: plan_decode_for_lens(  # noqa: E731
                lens, num_kv_heads=num_kv_heads, page_size=plan_page, enable_cuda_graph=cuda_graph
            )
            kernel = "decode"
        else:
            mk = lambda lens: plan_prefill_for_lens(  # noqa: E731
                lens,
                qo,
                num_qo_heads=num_qo_heads,
                num_kv_heads=num_kv_heads,
                page_size=plan_page,
                enable_cuda_graph=cuda_graph,
                fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv,
            )
            kernel = "prefill"
        try:
            exact_plan = mk(real)
            bound_plan = mk(bound)
        except ValueError:
            counts[REFUSED] += 1  # the planner itself refuses (FLASHINFER_CHECK, :674)
            continue
        counts[classify(exact_plan, bound_plan, real, qo, kernel)] += 1
        try:
            plan_hi = mk(hi)
            plan_lo = mk(lo)
            if plan_lo == plan_hi:
                certified += 1
            # Same split flag and chunk at both ends pins stock's chunk for every real length
            # in the window; with one query row (tensor-core decode) extra planned tiles are
            # empty, so plan(hi) then has stock's real chunking (bit-equal, inferred).
            if (plan_lo.split_kv, plan_lo.kv_chunk_size_pages) == (
                plan_hi.split_kv,
                plan_hi.kv_chunk_size_pages,
            ):
                certified_chunk += 1
            # plan(hi) run over ANY real length in [lo, hi]: the kernel's chunk count is
            # monotone in the real length, so checking the shortest one suffices.
            if classify(plan_hi, plan_hi, lo, qo, kernel) != INCORRECT:
                safe += 1
        except ValueError:
            pass
    return counts, certified, certified_chunk, safe


def step_certified(committed: Sequence[int], *, steps: int = 3, topk: int = 1, num_kv_heads: int = 8,
                   page_size: int = 1, enable_cuda_graph: bool = True) -> bool:
    """Whether one EAGLE chain step (topk 1, ntpr = steps + 1) can skip the sync: the
    verify plan (qo ntpr, kv = seq + ntpr), the draft-extend plan (same shape on a draft
    with the same heads -> same plan) and the steps-1 tensor-core draft-decode plans
    (qo 1, kv = seq + i + 1) all certified over seq in [committed+1, committed+ntpr]."""
    ntpr = steps * topk + 1 if topk > 1 else steps + 1
    lo = [c + 1 for c in committed]
    hi = [c + ntpr for c in committed]
    kw = dict(num_kv_heads=num_kv_heads, page_size=page_size, enable_cuda_graph=enable_cuda_graph)
    shift = lambda xs, d: [x + d for x in xs]  # noqa: E731
    if plan_prefill_for_lens(shift(lo, ntpr), ntpr, **kw) != plan_prefill_for_lens(shift(hi, ntpr), ntpr, **kw):
        return False
    for i in range(steps - 1):
        a = plan_prefill_for_lens(shift(lo, i + 1), 1, **kw)
        b = plan_prefill_for_lens(shift(hi, i + 1), 1, **kw)
        if (a.split_kv, a.kv_chunk_size_pages) != (b.split_kv, b.kv_chunk_size_pages):
            return False
    return True


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-kv-heads", type=int, default=8)
    ap.add_argument("--bs", type=int, default=None, help="fix the batch size (default: random 1-16)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)

    print(
        "FlashInfer 0.7.2 split model (CPU port of scheduler.cuh); H100: 132 SMs; "
        f"{32}/{args.num_kv_heads} q/kv heads, head_dim 128, bf16; "
        f"{args.trials} random batches per row (bs {args.bs or '1-16'}, committed len 1-8000)."
    )
    print(
        "naive bound = round_up(real + U[0,extra], round_page). Window: real = committed + accept, "
        "host knows committed, accept in [1, W] (W = qo for verify, 4 for decode), lo/hi = committed+1/+W."
    )
    print(
        "columns (naive bound): identical plan | different plan, same real chunking (bit-equal, "
        "inferred) | reordered reduction | incorrect;  (window): cert = plan(lo) == plan(hi), i.e. "
        "stock's plan known without a sync | certc = same split flag and chunk size at lo and hi | "
        "safe = plan(hi) correct for every real length in the window"
    )
    sites = [
        ("verify", "verify/draft-extend (prefill planner, qo 2-8)"),
        ("decode_tc", "draft decode, tensor cores (prefill planner, qo 1)"),
        ("decode_cuda_core", "draft decode, CUDA cores (decode planner, qo 1, 4 blk/SM assumed)"),
    ]
    combos = [(1, 1), (1, 16), (16, 16)]  # (plan page, bound rounding page)
    for site, title in sites:
        print(f"\n== {title}")
        print(f"{'cg':>3} {'plan_pg':>7} {'round':>5} {'extra':>5} | "
              f"{'ident':>6} {'eqbits':>6} {'reord':>6} {'incorr':>6} | {'cert':>6} {'certc':>6} {'safe':>6}")
        for cg in (True, False):
            for plan_page, round_page in combos:
                for extra in (8, 64):
                    counts, cert, certc, safe = _simulate(
                        rng,
                        args.trials,
                        site=site,
                        cuda_graph=cg,
                        plan_page=plan_page,
                        round_page=round_page,
                        extra_max=extra,
                        accept_window=4,
                        num_kv_heads=args.num_kv_heads,
                        batch_size=args.bs,
                    )
                    n = args.trials
                    pct = lambda k: 100.0 * counts[k] / n  # noqa: E731
                    print(
                        f"{'on' if cg else 'off':>3} {plan_page:>7} {round_page:>5} {extra:>5} | "
                        f"{pct(IDENTICAL):6.1f} {pct(EQUAL_BITS):6.1f} {pct(REORDERED):6.1f} "
                        f"{pct(INCORRECT):6.1f} | {100.0 * cert / n:6.1f} {100.0 * certc / n:6.1f} "
                        f"{100.0 * safe / n:6.1f}"
                    )
                    if counts[REFUSED]:
                        print(f"    ({pct(REFUSED):.1f}% refused by the planner)")

    print("\n== whole EAGLE step certified (verify + draft extend + 2 TC draft-decode plans; "
          "steps 3, topk 1, ntpr 4, CG, page-1 planner)")
    for bs in (1, 2, 4, 8, 16):
        ok = sum(
            step_certified([rng.randint(1, 8000) for _ in range(bs)], num_kv_heads=args.num_kv_heads)
            for _ in range(args.trials)
        )
        print(f"bs {bs:>2}: {100.0 * ok / args.trials:5.1f}% of steps need no sync")

    print("\n== alternatives for verify/draft-extend (CG on, plan page 1, round 1, extra 8)")
    for label, kw in (
        ("disable_split_kv=True (both plans)", dict(disable_split_kv=True)),
        ("fixed_split_size=1024 (both plans)", dict(fixed_split_size=1024)),
    ):
        counts, cert, certc, safe = _simulate(
            rng, args.trials, site="verify", cuda_graph=True, plan_page=1, round_page=1,
            extra_max=8, accept_window=4, num_kv_heads=args.num_kv_heads, **kw,
        )
        n = args.trials
        print(
            f"{label:<38} ident {100.0 * counts[IDENTICAL] / n:5.1f}  eqbits "
            f"{100.0 * counts[EQUAL_BITS] / n:5.1f}  reord {100.0 * counts[REORDERED] / n:5.1f}  "
            f"incorr {100.0 * counts[INCORRECT] / n:5.1f}  refused {100.0 * counts[REFUSED] / n:5.1f}  "
            f"cert {100.0 * cert / n:5.1f}  "
            f"safe {100.0 * safe / n:5.1f}"
        )


if __name__ == "__main__":
    main()
