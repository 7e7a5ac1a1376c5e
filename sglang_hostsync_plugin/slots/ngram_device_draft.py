"""Slot ``ngram_device_draft`` (opt-in): NGRAM's draft proposed on the device, from
each request's own token history, inside the step. What goes is the host work after step N-1 (the
accepted-token reads, ``batch_get``, the two H2D copies, ``batch_put``) and, on triton, the per-step
wait for step N-1 itself (``resolve_seq_lens_cpu``, below); FlashInfer keeps that wait.

Stock SGLang 0.5.23 (``speculative/ngram_worker.py``), every NGRAM decode step: the host drafts
(``NGRAMWorker._prepare_draft_tokens``: each request's last ``max_trie_depth`` tokens, with step
N-1's accepted tokens read back from the device, looked up in the cross-request C++ trie
``NgramCorpus.batch_get``), copies the tree (``draft_tokens``, ``tree_mask``) to the device, and
after the verify inserts the tails into the trie (``_update_ngram_corpus``). Under overlap the
draft of step N needs step N-1's accepted tokens, so the host waits for step N-1 before it can
launch step N. See ``docs/ngram-device-draft.md``.

Here the device keeps a token history per request pool row (``history[req_pool_idx, pos]``,
int32, as many rows as ``req_to_token``, its width plus ``D + 1``). The prompt
(``Req.get_fill_ids()``: prompt, output after a retraction, radix-matched prefix included) is
written at every extend forward (one pinned H2D, one launch); each step's accepted tokens are
appended on the device right after the step (``accept_tokens[b, j]`` at
``new_seq_lens[b] - accept_lens[b] + 1 + j``). A decode row's history is then valid on
``[0, seq_lens[b]]``; ``history[seq_lens[b]]`` is the root token stock puts first in each
request's tree.

The draft (:func:`draft_chain`: a match kernel over (request, history chunk), then a chain kernel per
request): prompt-lookup matching of the
last ``n`` history tokens, ``MIN_N <= n <= max_trie_depth`` (SGLang's trie matches suffixes of
depth 1 to ``max_trie_depth``; 0.5.23 has no separate match-window settings), against every
earlier position of the same history. Longest ``n`` wins; among equally long matches the most
recent one (vLLM's CPU proposer's rule; its GPU proposer takes the earliest). Its continuation,
clipped at the history's end and at ``D - 1`` tokens, becomes a chain in exactly the layout SGLang
builds from its trie for a chain-shaped result (C++ ``fillResult``: the root first, the chain,
then padding nodes of token 0, each a child of the root) together with what SGLang's
``reconstruct_indices_from_tree_mask`` derives from it (positions, retrieve index, next token,
next sibling), written straight into the worker's preallocated verify buffers. The verify keeps
``D`` tokens per request, so its batch shape is stock's; the target decides every token.

The cross-request trie is dropped for device-drafted batches (no lookup, no insert): a lookup
needs step N-1's tokens on the host. Acceptance may therefore drop against stock (no cross-request
matches). Grammar batches (their vocabulary mask is built from the host tree), sampled batches (not
``is_all_greedy``: ``eagle_sample``'s tree sampling depends on the draft, so they could not match
stock), batches with a multimodal request (``get_fill_ids()`` holds image pad values, ids past the
vocabulary, which a chain could copy into the verify input ids; stock drafts from
``origin_input_ids_unpadded``), rows whose prompt this process has not written since the row was
last allocated (``ReqToTokenPool.req_generation``; a PD-disaggregation decode server, a reused row),
servers with an external SAM corpus, and CPU tensors outside the Triton interpreter run SGLang's
host path unchanged. Greedy outputs are identical to stock up to verify numerics; the e2e token
comparison is the gate, and it has not run.

The per-step host wait: under overlap stock blocks in ``FutureMap.resolve_seq_lens_cpu``
(``Scheduler.run_batch``), the point where its accepted-token ``.cpu()`` also ends up waiting,
because NGRAM forces ``needs_cpu_seq_lens`` (``decide_needs_cpu_seq_lens``) only to size the full
verify mask from ``seq_lens_cpu``. With this slot ``ngram_full_mask`` sizes it without them (an upper
bound from the host allocation, ``ngram_full_mask.mask_size``), so the hook on
``decide_needs_cpu_seq_lens`` lets the attention backends answer: triton publishes no host lengths
and the step no longer waits for step N-1 on the host; FlashInfer (its plans read them), other backends,
two-batch overlap, pipeline parallelism and forward-pass metrics keep the wait, and there the saving is only the host work after it. A batch left to SGLang's
host draft then reads step N-1's tokens back itself (stock's blocking ``.cpu()``). In real servers (H100,
2026-12-07, ``benchmarks/results/2026-12-07-h100-b/``): outputs identical, 0 syncs per step, 1.49x stock's
tok/s/user at c1 on a copying workload.

In the catalogue after the upstream switches (``slots.OWNED_LATE``), in no preset. It requires
``ngram_full_mask``: both edit ``_prepare_for_speculative_decoding`` as parts of one
``edit_sites.NGRAM_PREPARE_SITE``, and the full mask is that slot's kernel over the device tree. It
conflicts with ``ngram_late_wait``. Hook targets: ``_prepare_for_speculative_decoding``
(AROUND, the site's variant with both parts' snippets), ``forward_batch_generation`` (AROUND:
prompt write before, accepted-token append after), ``_update_ngram_corpus`` (AROUND: skipped
after a device draft) and ``overlap_utils.decide_needs_cpu_seq_lens`` (AROUND, scheduler init).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import triton
import triton.language as tl

from ..checks import file_pins, package_file_pins
from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .edit_sites import NGRAM_PREPARE_SITE
from . import ngram_full_mask

NAME = "ngram_device_draft"
logger = logging.getLogger("sglang.srt.plugins.hostsync")
NGRAM_WORKER = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
PREPARE = f"{NGRAM_WORKER}._prepare_for_speculative_decoding"
PREPARE_SHA = ngram_full_mask.PREPARE_SHA
FORWARD = f"{NGRAM_WORKER}.forward_batch_generation"
FORWARD_SHA = "62a0fa9f388804a7"
UPDATE = f"{NGRAM_WORKER}._update_ngram_corpus"
UPDATE_SHA = "cce66c7d693fa47d"
DECIDE = "sglang.srt.managers.overlap_utils.decide_needs_cpu_seq_lens"
DECIDE_SHA = "7dc8e698341bcb8c"  # its rule is restated in decide_hook: pin it
# SGLang code whose layout the chain restates: the trie result's tree (fillResult, C++, read in
# tests/test_ngram_device_draft.py against a real corpus) and the verify indices derived from it.
RECONSTRUCT = ("sglang.kernels.ops.speculative.reconstruct_tree._reconstruct_tree_mask_kernel", "6815dc66e045b46d")
# What CUDA runs instead of that Triton kernel (XPU only): reconstructIndicesFromTreeMask, JIT-built from this file.
RECONSTRUCT_CUDA = ("sglang/kernels/jit/include/sgl_kernel/speculative/ngram.cuh", "1fc0eea1eed7b9e0")

MIN_N = 1  # a one-token match still drafts: the verify checks D tokens per request whatever the draft
BLOCK = 512  # history positions per scan step
CHUNK = 8 * BLOCK  # history positions per match program: a long history is scanned by many at once
KEY_SHIFT = 40  # best-match key: (length << KEY_SHIFT) | end position; positions stay below 2**40
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# --- kernels --------------------------------------------------------------------------------------

@triton.jit
def _match_kernel(history, hist_stride, hist_width, rows, seq_lens, best,
                  MIN_N: tl.constexpr, MAX_N: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                  SHIFT: tl.constexpr):
    """Program (b, c): the best match ending in chunk c of request b's history, into ``best[b]``
    (atomic max of ``(length << SHIFT) | end``: longest, then latest, as one scan from the end finds)."""
    b = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1).to(tl.int64) * CHUNK
    row = tl.load(rows + b).to(tl.int64)
    seq_len = tl.load(seq_lens + b).to(tl.int64)
    hist = history + row * hist_stride
    length = tl.minimum(seq_len + 1, hist_width)  # valid history; its last token is the root
    last = length - 1
    lanes = tl.arange(0, BLOCK)
    # Candidate ends p in [lo, min(lo + CHUNK, last)), scanned from the chunk's end backwards; a match
    # of MAX_N tokens ends the chunk's scan (nothing earlier in it beats it).
    local = tl.full((), -1, tl.int64)
    hi = tl.minimum(lo + CHUNK, last)
    while (hi > lo) & ((local >> SHIFT) < MAX_N):
        p = hi - BLOCK + lanes
        alive = p >= lo
        m = tl.zeros((BLOCK,), tl.int64)
        for k in tl.static_range(MAX_N):
            want = tl.load(hist + (last - k), mask=last - k >= 0, other=-2)
            alive = alive & (p - k >= 0)
            got = tl.load(hist + (p - k), mask=alive, other=-1)
            alive = alive & (got == want)
            m += alive.to(tl.int64)
        key = tl.where((m >= MIN_N) & (p >= lo), (m << SHIFT) | p, -1)
        local = tl.maximum(local, tl.max(key, axis=0))
        hi -= BLOCK
    if local >= 0:
        tl.atomic_max(best + b, local)


@triton.jit
def _draft_chain_kernel(history, hist_stride, hist_width, rows, seq_lens, best_keys,
                        tokens, tree_mask, positions, retrieve_index, next_token, next_sibling,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, SHIFT: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(rows + b).to(tl.int64)
    seq_len = tl.load(seq_lens + b).to(tl.int64)
    hist = history + row * hist_stride
    length = tl.minimum(seq_len + 1, hist_width)
    last = length - 1
    best = tl.load(best_keys + b)
    tl.store(best_keys + b, tl.full((), -1, tl.int64))  # reset for the next step's match

    found = best >= 0
    start = (best & ((1 << SHIFT) - 1)) + 1  # the continuation's first position
    chain = tl.where(found, tl.minimum(D - 1, length - start), 0)

    i = tl.arange(0, BLOCK_D)
    out = i < D
    follow = tl.load(hist + start + i - 1, mask=out & (i >= 1) & (i <= chain), other=0)
    root = tl.load(hist + last)
    base = b * D
    tl.store(tokens + base + i, tl.where(i == 0, root, follow).to(tl.int64), mask=out)
    # SGLang's derivation from the mask: depth = ancestors (chain node i: i; padding: 1).
    tl.store(positions + base + i, seq_len + tl.where(i <= chain, i, 1).to(tl.int64), mask=out)
    tl.store(retrieve_index + base + i, (base + i).to(tl.int64), mask=out)
    first_child = tl.where(i == 0, tl.where(D > 1, 1, -1), tl.where(i < chain, i + 1, -1))
    tl.store(next_token + base + i, first_child.to(tl.int64), mask=out)
    # The root's children: node 1 and the padding nodes chain+1..D-1 (all of 1..D-1 without a chain).
    root_child = (i >= 1) & ((i == 1) | (i > chain))
    after = tl.where((i == 1) & (chain >= 1), chain + 1, i + 1)
    tl.store(next_sibling + base + i, tl.where(root_child & (after < D), after, -1).to(tl.int64), mask=out)
    # Tree mask (D x D): a chain row attends the root and the chain up to itself; a padding row
    # the root and itself.
    r = i[:, None]
    q = i[None, :]
    cell = tl.where(r <= chain, q <= r, (q == 0) | (q == r))
    tl.store(tree_mask + b * D * D + r * D + q, cell, mask=(r < D) & (q < D))


@triton.jit
def _append_kernel(history, hist_stride, hist_width, rows, accept_tokens, accept_lens, new_seq_lens,
                   D: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(rows + b).to(tl.int64)
    n = tl.load(accept_lens + b).to(tl.int64)
    end = tl.load(new_seq_lens + b).to(tl.int64)  # the position of the last accepted token
    j = tl.arange(0, BLOCK_D)
    pos = end - n + 1 + j
    keep = (j < n) & (j < D) & (pos >= 0) & (pos < hist_width)
    tok = tl.load(accept_tokens + b * D + j, mask=keep, other=0)
    tl.store(history + row * hist_stride + pos, tok.to(tl.int32), mask=keep)


@triton.jit
def _write_rows_kernel(history, hist_stride, hist_width, rows, flat, offsets, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(rows + b).to(tl.int64)
    lo = tl.load(offsets + b)
    n = tl.minimum(tl.load(offsets + b + 1) - lo, hist_width)
    for c0 in range(0, n, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        keep = cols < n
        tok = tl.load(flat + lo + cols, mask=keep, other=0)
        tl.store(history + row * hist_stride + cols, tok.to(tl.int32), mask=keep)


def _block_d(num_draft: int) -> int:
    return max(2, triton.next_power_of_2(num_draft))


def draft_chain(history: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
                tree_mask: torch.Tensor, positions: torch.Tensor, retrieve_index: torch.Tensor,
                next_token: torch.Tensor, next_sibling: torch.Tensor, num_draft: int, max_n: int,
                min_n: int = MIN_N, best: torch.Tensor | None = None) -> None:
    """Each request's chain draft, in place, in the layout of SGLang's NGRAM verify buffers:
    ``tokens`` (``bs * D``), ``tree_mask`` (``bs * D * D`` bool), ``positions`` (``bs * D``),
    ``retrieve_index`` / ``next_token`` / ``next_sibling`` (``bs x D``, contiguous). Two launches: the
    match, one program per (request, ``CHUNK`` of the history width), then the chain per request.

    Args:
        history: ``[rows, width]`` int32; row ``rows[b]`` holds request ``b``'s tokens on
            ``[0, seq_lens[b]]``.
        rows: ``[bs]`` the requests' pool rows (``batch.req_pool_indices``).
        seq_lens: ``[bs]`` the verified lengths (``batch.seq_lens``): the root token is at ``seq_lens[b]``.
        num_draft: ``D``, tokens per request (``--speculative-num-draft-tokens``).
        max_n, min_n: the n-gram lengths tried, longest first.
        best: ``[>= bs]`` int64 all -1 (left so), the match keys; None: a new one.
    """
    bs = rows.shape[0]
    if bs == 0:
        return
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    if best is None:
        best = torch.full((bs,), -1, dtype=torch.int64, device=history.device)
    width = history.shape[1]
    _match_kernel[(bs, triton.cdiv(width, CHUNK))](
        history, history.stride(0), width, rows, seq_lens, best,
        MIN_N=min_n, MAX_N=max_n, BLOCK=BLOCK, CHUNK=CHUNK, SHIFT=KEY_SHIFT, num_warps=4)
    _draft_chain_kernel[(bs,)](
        history, history.stride(0), width, rows, seq_lens, best,
        tokens, tree_mask, positions, retrieve_index, next_token, next_sibling,
        D=num_draft, BLOCK_D=_block_d(num_draft), SHIFT=KEY_SHIFT, num_warps=4)


def append_accepted(history: torch.Tensor, rows: torch.Tensor, accept_tokens: torch.Tensor,
                    accept_lens: torch.Tensor, new_seq_lens: torch.Tensor, num_draft: int) -> None:
    """A step's accepted tokens into the history: ``accept_tokens[b, j]`` (``bs * D``, flat) for
    ``j < accept_lens[b]`` at ``new_seq_lens[b] - accept_lens[b] + 1 + j``. After a prefill
    (``accept_lens`` 1, ``new_seq_lens`` the prompt length) that is the first output token."""
    bs = rows.shape[0]
    if bs == 0:
        return
    _append_kernel[(bs,)](history, history.stride(0), history.shape[1], rows, accept_tokens, accept_lens,
                          new_seq_lens, D=num_draft, BLOCK_D=_block_d(num_draft), num_warps=1)


def write_rows(history: torch.Tensor, rows: torch.Tensor, flat: torch.Tensor, offsets: torch.Tensor) -> None:
    """``flat[offsets[b]:offsets[b + 1]]`` into ``history[rows[b], 0:...]`` (device tensors)."""
    bs = rows.shape[0]
    if bs == 0:
        return
    _write_rows_kernel[(bs,)](history, history.stride(0), history.shape[1], rows, flat, offsets,
                              BLOCK=1024, num_warps=4)


# --- the worker's device history ------------------------------------------------------------------

@dataclass
class History:
    """One NGRAM worker's device token history and what the host knows about it."""

    tokens: torch.Tensor  # [req pool rows, width] int32
    ready: np.ndarray  # per row: its prompt was written by this process for the row's current owner
    generation: np.ndarray  # per row: the pool's req_generation when the prompt was written
    max_n: int
    best: torch.Tensor | None = None  # [rows] int64, -1 between steps: the match keys (draft_chain's ``best``)
    drafted: int = 0  # decode steps drafted on the device
    prompts: int = 0  # extend forwards whose prompts were written
    stock: dict = field(default_factory=dict)  # reason -> decode steps left to SGLang's host path


HISTORY = "_hostsync_ngram_history"  # the worker attribute holding its History


def history(worker) -> History | None:
    return getattr(worker, HISTORY, None)


NO_HISTORY = "_hostsync_ngram_no_history"  # the worker attribute saying why it has none
HISTORY_SHARE = 0.05  # of the device memory free at the first forward; a larger history is not made


def _free_bytes(device) -> int | None:
    device = torch.device(device)
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def history_of(worker) -> History | None:
    """The worker's history, allocated at its first forward: ``req_to_token``'s rows, its width plus
    ``D + 1``, int32 (48 rows x 128k positions is 25 MB), outside ``--mem-fraction-static``, so it is
    logged, and not made where it would take more than ``HISTORY_SHARE`` of the free device memory
    (the server then keeps SGLang's host draft, and says so once). None then."""
    found = history(worker)
    if found is None and NO_HISTORY not in vars(worker):
        rows, width = worker.req_to_token_pool.req_to_token.shape
        shape = (rows, width + worker.draft_token_num + 1)
        mib = shape[0] * shape[1] * 4 / 2**20
        free = _free_bytes(worker.device)
        if free is not None and mib * 2**20 > HISTORY_SHARE * free:
            why = (f"its device token history ({shape[0]} x {shape[1]} int32, {mib:.0f} MiB, outside "
                   f"--mem-fraction-static) would take over {HISTORY_SHARE:.0%} of the {free / 2**30:.1f} GiB free")
            setattr(worker, NO_HISTORY, why)
            logger.warning("hostsync: ngram_device_draft: %s; SGLang's host draft stays on", why)
            return None
        tokens = torch.zeros(shape, dtype=torch.int32, device=worker.device)
        found = History(tokens, np.zeros(rows, dtype=bool), np.full(rows, -1, dtype=np.int64),
                        max(MIN_N, worker.max_trie_depth),
                        best=torch.full((rows,), -1, dtype=torch.int64, device=worker.device))
        setattr(worker, HISTORY, found)
        logger.info("hostsync: ngram_device_draft: device token history %d x %d int32, %.1f MiB outside "
                    "--mem-fraction-static", shape[0], shape[1], mib)
    return found


def write_prompts(hist: History, batch, pool=None) -> None:
    """An extend batch's token ids by position (``Req.get_fill_ids()``: everything SGLang puts
    into the KV cache for the request, its radix-matched prefix included) into its rows."""
    from sglang.srt.utils.common import flatten_arrays_to_pinned_cpu, is_pin_memory_available

    reqs = batch.reqs
    ids = [r.get_fill_ids() for r in reqs]
    pin = is_pin_memory_available(hist.tokens.device)
    flat = flatten_arrays_to_pinned_cpu(ids, pin)
    offsets = torch.tensor(np.concatenate(([0], np.cumsum([len(a) for a in ids]))), dtype=torch.int64)
    if pin:
        offsets = offsets.pin_memory()
    device = hist.tokens.device
    write_rows(hist.tokens, batch.req_pool_indices, flat.to(device, non_blocking=True),
               offsets.to(device, non_blocking=True))
    index = [r.kv.req_pool_idx for r in reqs]  # SGLang 0.5.23 keeps the row on Req.kv (ReqKvInfo)
    hist.ready[index] = True
    hist.generation[index] = _generations(pool, index)
    hist.prompts += 1


def _generations(pool, index) -> np.ndarray:
    """The pool's allocation generation of rows ``index`` (bumped at every allocation of a row;
    monotonic across ``clear``)."""
    gen = getattr(pool, "req_generation", None)
    if gen is None:
        return np.full(len(index), -2, dtype=np.int64)  # a pool without generations: no reuse check
    return gen[torch.as_tensor(np.asarray(index, dtype=np.int64))].numpy()


def clear_stale(hist: History, pool, index) -> None:
    """Clears the ready flag of rows in ``index`` freed and allocated again (to another request, or
    after the pool was cleared) since their prompt was written: a reused row is not drafted from its
    previous owner's history."""
    index = np.asarray(index, dtype=np.int64)
    stale = index[hist.generation[index] != _generations(pool, index)]
    hist.ready[stale] = False


# --- the step -------------------------------------------------------------------------------------

def stock_reason(worker, batch) -> str | None:
    """Why this decode batch keeps SGLang's host draft, or None (drafted on the device)."""
    hist = history(worker)
    if hist is None:
        return "no device history"
    if batch.has_grammar:
        return "grammar"
    if not batch.sampling_info.is_all_greedy:
        return "sampling"  # eagle_sample's tree sampling depends on the draft
    if any(r.multimodal_inputs is not None for r in batch.reqs):
        return "multimodal"  # the history holds image pad values, past the vocabulary
    if not (worker.tree_mask.is_cuda or _INTERPRET) or worker.tree_mask.dtype != torch.bool:
        return "not a CUDA bool tree mask"
    if batch.seq_lens_cpu is None and ngram_full_mask.allocated_lens(batch) is None:
        return "no host seq lens"  # nor the allocation bound that sizes the full mask without them
    if getattr(worker.ngram_corpus, "_corpus_token_counts", None):
        return "external corpus"
    index = batch.req_pool_indices_cpu
    if index is not None:
        clear_stale(hist, worker.req_to_token_pool, index)
    if index is None or not hist.ready[np.asarray(index)].all():
        return "prompt not written"
    return None


def draft_fits(worker, batch) -> bool:
    reason = stock_reason(worker, batch) if len(batch.reqs) else "empty"
    if reason is not None:
        hist = history(worker)
        if hist is not None:
            hist.stock[reason] = n = hist.stock.get(reason, 0) + 1
            if n == 1:
                logger.info("hostsync: %s: a decode batch keeps SGLang's host draft (%s); %s", NAME, reason,
                            drafted_line(hist))
    return reason is None


def drafted_line(hist: History) -> str:
    """The counts the server log reports (the e2e and the GPU tests read them there)."""
    stock = ", ".join(f"{why} {n}" for why, n in sorted(hist.stock.items())) or "none"
    return f"{hist.drafted} decode steps drafted on the device; SGLang's host draft: {stock}"


def draft(worker, batch, draft_tokens, tree_mask, positions, retrieve_index, next_token, next_sibling) -> None:
    hist = history(worker)
    draft_chain(hist.tokens, batch.req_pool_indices, batch.seq_lens, draft_tokens, tree_mask, positions,
                retrieve_index, next_token, next_sibling, worker.draft_token_num, hist.max_n, best=hist.best)
    worker._hostsync_device_drafted = True  # this step's corpus update is skipped
    hist.drafted += 1
    if hist.drafted in (1, 100) or hist.drafted % 10000 == 0:
        logger.info("hostsync: %s: %s", NAME, drafted_line(hist))


def _skip(*args) -> None:
    """Stands in for ``reconstruct_indices_from_tree_mask_func``: the draft wrote its outputs."""


# ``_prepare_for_speculative_decoding`` (SGLang 0.5.23), this slot's part of the site it shares with
# ngram_full_mask (required): the draft in place of the host lookup and its two copies where the full
# mask is built on the device (``ones_masks`` None), or no full mask is used; no tree reconstruction.
# ngram_full_mask's part then builds the full mask from the device tree the draft wrote.
DRAFT_EDIT = (
    "        req_drafts, mask = self._prepare_draft_tokens(batch)\n"
    "        tree_mask.copy_(torch.from_numpy(mask), non_blocking=True)\n"
    "        draft_tokens.copy_(torch.from_numpy(req_drafts), non_blocking=True)\n",
    "        _hostsync_dev = ones_masks is None and _hostsync_draft_fits(self, batch)\n"
    "        if _hostsync_dev:\n"
    "            req_drafts = mask = None\n"
    "            _hostsync_draft(self, batch, draft_tokens, tree_mask, positions, retrieve_index,\n"
    "                            retrieve_next_token, retrieve_next_sibling)\n"
    "        else:\n"
    "            req_drafts, mask = self._prepare_draft_tokens(batch)\n"
    "            tree_mask.copy_(torch.from_numpy(mask), non_blocking=True)\n"
    "            draft_tokens.copy_(torch.from_numpy(req_drafts), non_blocking=True)\n",
)
RECONSTRUCT_EDIT = (
    "        reconstruct_indices_from_tree_mask_func(\n",
    "        (_hostsync_skip if _hostsync_dev else reconstruct_indices_from_tree_mask_func)(\n",
)


def _bind():
    return {"_hostsync_draft_fits": draft_fits, "_hostsync_draft": draft, "_hostsync_skip": _skip}


PREPARE_ONCE = NGRAM_PREPARE_SITE.edit(NAME, (DRAFT_EDIT, RECONSTRUCT_EDIT), _bind)
# The function this slot serves: both parts' edits (tests; the installer composes the same variant).
WITH_FULL_MASK = tuple(sorted((NAME, ngram_full_mask.NAME)))


def edited(original):
    """SGLang's verify prep with this slot's and ngram_full_mask's edits (the site's variant)."""
    return NGRAM_PREPARE_SITE.variant(original, WITH_FULL_MASK)


def forward_hook(original, self, batch, *args, **kwargs):
    """Around ``NGRAMWorker.forward_batch_generation``: an extend batch's prompts into the history
    before the step; after it, the step's accepted tokens (the next draft input's, on the device)."""
    if not (torch.device(self.device).type == "cuda" or _INTERPRET):
        return original(self, batch, *args, **kwargs)  # Triton cannot launch here: SGLang's host path
    hist = history_of(self)
    if hist is None:  # too large to make: every batch keeps SGLang's host draft ("no device history")
        return original(self, batch, *args, **kwargs)
    if len(batch.reqs) and batch.forward_mode.is_extend():
        write_prompts(hist, batch, self.req_to_token_pool)
    result = original(self, batch, *args, **kwargs)
    nxt = result.next_draft_input
    if len(batch.reqs) and nxt is not None and nxt.accept_tokens is not None:
        append_accepted(hist.tokens, batch.req_pool_indices, nxt.accept_tokens, nxt.accept_lens, nxt.new_seq_lens,
                        self.draft_token_num)
    return result


def update_hook(original, self, batch):
    """Around ``NGRAMWorker._update_ngram_corpus``: nothing after a device draft (the trie is
    neither read nor fed for those steps; its inputs were never read back)."""
    if self.__dict__.pop("_hostsync_device_drafted", False):
        return None
    return original(self, batch)


def decide_hook(original, attn_backends):
    """Around ``overlap_utils.decide_needs_cpu_seq_lens`` (scheduler init): SGLang forces the host
    lengths for NGRAM only to size its full mask (``USE_FULL_MASK``), which ``ngram_full_mask`` sizes
    from the host allocation when they are absent. Where every attention backend is triton (it reads
    the mask by offsets from the device lengths and declares it needs no host lengths), none are
    published: no per-step seq-lens wait, the overlap step runs ahead. Everything else keeps SGLang's
    answer: other backends, two-batch overlap, pipeline parallelism (its relay needs them) and
    forward-pass metrics (SGLang's per-request metrics read them for NGRAM batches)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.managers import overlap_utils
    from sglang.srt.runtime_context import get_observability, get_parallel

    needs = original(attn_backends)
    backends = [b for b in attn_backends if b is not None]
    if (not needs or overlap_utils.get_exec().overlap.enable_two_batch_overlap or get_parallel().pp_size > 1
            or get_observability().enable_forward_pass_metrics or not backends):
        return needs
    if all(isinstance(b, TritonAttnBackend) and not b.needs_cpu_seq_lens for b in backends):
        return False
    return needs


def check_pins() -> str | None:
    """The edit applies to the installed SGLang, and SGLang's derivation of the verify indices
    from a tree mask (what the chain restates) is the one the chain was written against. Read from
    the files: ``ngram_worker`` and ``reconstruct_tree`` import only beside ``sgl_kernel`` on a CPU box."""
    return (PREPARE_ONCE.check() or file_pins([RECONSTRUCT], "the chain layout restates it")
            or package_file_pins([RECONSTRUCT_CUDA], "the chain layout restates it"))


# Why each conflict: a reason per slot (the Slot takes only the names).
CONFLICTS = {
    "ngram_late_wait": "late_wait defers step N-1's wait into _prepare_draft_tokens, which the device path "
                       "skips; the full mask would then be sized from seq_lens_cpu not yet filled",
}


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (NGRAM draft on the device; vLLM's GPU n-gram proposer, vllm#29184)",
    summary="NGRAM's draft as a prompt-lookup chain proposed on the device from a device token history, "
            "inside the step: no trie lookup, accepted-token reads or draft copies, and on triton no per-step "
            "seq-lens wait (FlashInfer keeps it); acceptance differs from the trie's, so greedy ids match stock's only up "
            "to verify numerics (2 of 25 requests differed on a random model, near-ties likely)",
    default=False,
    seq_lens_read=("gone where every attention backend is triton (ngram_full_mask sizes the verify mask without "
                   "host lengths), except under two-batch overlap, pipeline parallelism or forward-pass metrics; "
                   "FlashInfer and other backends keep it"),
    requires=(ngram_full_mask.NAME,),  # its part of the site builds the full mask from the device tree
    conflicts=tuple(CONFLICTS),
    precheck=config_precheck(None, check_pins),
    inert=lambda f: not_speculative(f, "only NGRAM drafts from a token history", bool(f.speculative_algorithm)
                                    and f.is_ngram()),
    targets=(
        PREPARE_ONCE.target(),
        HookTarget(FORWARD, TargetKind.FUNCTION, hook=forward_hook,
                   params=("self", "batch", "on_publish", "pp_proxy_tensors"), source_sha=FORWARD_SHA),
        HookTarget(UPDATE, TargetKind.FUNCTION, hook=update_hook, params=("self", "batch"), source_sha=UPDATE_SHA),
        HookTarget(DECIDE, TargetKind.FUNCTION, hook=decide_hook, params=("attn_backends",), source_sha=DECIDE_SHA),
    ),
)
