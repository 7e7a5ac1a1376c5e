"""Bound-vs-exact simulation over a pure-Python port of FlashInfer 0.7.2's split-KV planners (CPU only).

Question it answers: if SGLang planned FlashInfer from HOST UPPER BOUNDS of the
sequence lengths (no per-step D2H of seq_lens), would the plan -- and therefore
the bits of the attention output -- equal stock's plan over the exact lengths?

The port itself (FlashInfer 0.7.2's scheduler.cuh / utils.cuh, file:line in its docstring) lives in
the package, ``sglang_hostsync_plugin/flashinfer_split.py``, where the slot
``flashinfer_certified_plan`` uses it; its names are re-exported here. This file models the kernels'
use of a plan (what a bound plan does at run time):

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
import os
import random
import sys
from typing import Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_hostsync_plugin.flashinfer_split import (  # noqa: E402,F401 (re-exported: the tests use these names)
    H100_MAX_SMEM_OPTIN,
    H100_NUM_SM,
    INT64_MAX,
    DecodePlanModel,
    PrefillPlanModel,
    ceil_div,
    decode_plan,
    fa2_determine_cta_tile_q,
    page_indptr,
    partition_paged_kv_binary_search,
    plan_decode_for_lens,
    plan_prefill_for_lens,
    prefill_binary_search_kv_chunk_size,
    prefill_max_batch_size_if_split,
    prefill_split_qo_kv_indptr,
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
