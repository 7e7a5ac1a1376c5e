"""Slot ``ngram_full_mask``: NGRAM's verify attention mask in one Triton launch instead of a
per-request loop of allocations, fills and pageable copies.

Stock SGLang 0.5.23, ``NGRAMWorker._prepare_for_speculative_decoding`` with ``USE_FULL_MASK``
(on, every CUDA NGRAM server, any attention backend), per decode step and per request ``i``:
``torch.ones((D, seq_lens_cpu[i]))`` (a float32 allocation and fill), ``torch.from_numpy(mask[i])
.to(device, non_blocking=True)`` (a pageable H2D of the request's ``D x D`` tree mask, which
``tree_mask.copy_`` already put on the device), ``torch.cat``, ``.to(torch.bool)``, ``flatten``;
then one ``torch.cat`` of all requests. That is about six launches per request on the host path
(``D = --speculative-num-draft-tokens``).

With the slot the same 1-D bool tensor comes from one kernel, one program per (request, query
row): columns below the request's length are True, the rest are the device tree mask's row. The
flat layout is stock's: request ``i`` starts at ``D * sum_{j<i}(seq_len_j + D)``, computed on the
device from ``batch.seq_lens`` (the lengths SGLang's verify attention and
``reconstruct_indices_from_tree_mask`` read); its size from ``seq_lens_cpu`` as stock's shapes
(without host lengths, which only ``ngram_device_draft``'s servers lack, an upper bound from the host
allocation: ``mask_size``), and no write lands past it. The values are stock's: ``torch.cat((ones, mask)).to(bool)`` is True
exactly where the tree mask is nonzero, as the device copy of the mask is. Anything else (no
CUDA tensor outside the Triton interpreter, an empty batch, no ``seq_lens_cpu``, a tree-mask
buffer not bool) runs SGLang's loop.

Opt-in: ``ngram_worker`` imports only where ``sgl_kernel`` (or CUDA) is present, so on a machine
without it the slot is refused ("target missing"), and a default slot would fail a strict
launch there. Hook target: ``NGRAMWorker._prepare_for_speculative_decoding`` (AROUND; SGLang's
method recompiled from its pinned source with the two ``USE_FULL_MASK`` blocks edited, a part of
``edit_sites.NGRAM_PREPARE_SITE``, which ``ngram_device_draft`` shares).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..slot import Slot, SlotKind, config_precheck, not_speculative
from .edit_sites import NGRAM_PREPARE, NGRAM_PREPARE_SHA, NGRAM_PREPARE_SITE
from .upstream_switches import NGRAM_PRESET

NAME = "ngram_full_mask"
PREPARE, PREPARE_SHA = NGRAM_PREPARE, NGRAM_PREPARE_SHA
BLOCK = 1024
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

ONES_EDIT = (
    "        if USE_FULL_MASK and not _is_cpu:\n"
    "            ones_masks = [\n",
    "        if USE_FULL_MASK and not _is_cpu and not _hostsync_full_mask_fits(batch, self.tree_mask):\n"
    "            ones_masks = [\n",
)
LOOP_EDIT = (
    "        if USE_FULL_MASK and not _is_cpu:\n"
    "            tree_mask = []\n",
    "        if USE_FULL_MASK and not _is_cpu and ones_masks is None:\n"
    "            tree_mask = _hostsync_full_mask(\n"
    "                tree_mask, batch.seq_lens, batch.seq_lens_cpu, self.draft_token_num,\n"
    "                _hostsync_full_mask_size(batch, self.draft_token_num, self),\n"
    "            )\n"
    "        elif USE_FULL_MASK and not _is_cpu:\n"
    "            tree_mask = []\n",
)


@triton.jit
def _full_mask_kernel(tree_ptr, seq_lens_ptr, out_ptr, total, D: tl.constexpr, BLOCK: tl.constexpr):
    req = tl.program_id(0)
    row = tl.program_id(1)
    before = req.to(tl.int64) * 0  # sum of the earlier requests' lengths
    for j in range(0, req):
        before += tl.load(seq_lens_ptr + j).to(tl.int64)
    length = tl.load(seq_lens_ptr + req).to(tl.int64)
    width = length + D
    start = D * (before + req.to(tl.int64) * D) + row * width
    tree_row = tree_ptr + (req.to(tl.int64) * D + row) * D - length
    for c0 in range(0, width, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        in_row = cols < width
        tree = tl.load(tree_row + cols, mask=in_row & (cols >= length), other=0)
        dst = start + cols
        tl.store(out_ptr + dst, (cols < length) | (tree != 0), mask=in_row & (dst < total))


def allocated_lens(batch) -> list[int] | None:
    """Each request's ``kv.kv_allocated_len``: SGLang's spec-v2 decode allocation (``eagle_prepare_for_decode``,
    before this prep) covers the verify's KV writes at ``[L_i, L_i + D)``, so it bounds ``L_i + D``."""
    lens = []
    for req in batch.reqs:
        kv = getattr(req, "kv", None)
        if kv is None or not isinstance(getattr(kv, "kv_allocated_len", None), int):
            return None
        lens.append(kv.kv_allocated_len)
    return lens


def verify_buffer_cells(worker) -> int | None:
    """Cells of the target attention backend's verify-mask buffer (triton: ``max_bs * D * (context + D)``),
    which a graph replay copies the mask into; None without one (no CUDA graphs, another backend)."""
    runner = getattr(worker, "model_runner", None)  # stand-in workers in tests have none
    mask = runner.attn_backend.verify_mask if runner is not None else None
    return mask.buffer.numel() if mask is not None else None


def mask_size(batch, num_draft: int, worker=None) -> int | None:
    """Cells of the full mask. With host lengths, stock's exact ``D * sum(L_i + D)``. Without them (a
    scheduler that publishes none: ``ngram_device_draft`` lets triton NGRAM servers skip the per-step
    seq-lens wait), an upper bound from the host allocation: ``kv_allocated_len`` covers ``L_i + D`` (the
    verify writes KV there), plus ``D`` of margin, each request capped at its ``req_to_token`` row (no
    allocation is wider). Cells past the true total are never read: the verify attention reads the mask
    by offsets from the device lengths. A bound larger than the verify buffer a graph replay copies it
    into (requests near the context length) reads the host lengths instead: one blocking read, stock's
    wait, and stock's exact size."""
    bs = len(batch.reqs)
    if batch.seq_lens_cpu is None:
        lens = allocated_lens(batch)
        if lens is None:
            return None
        row = batch.req_to_token_pool.req_to_token.shape[1]
        bound = num_draft * sum(min(n + num_draft, row) for n in lens)
        capacity = verify_buffer_cells(worker)
        if capacity is None or bound <= capacity:
            return bound
        batch.seq_lens_cpu = batch.seq_lens.cpu()
    return num_draft * (int(batch.seq_lens_cpu[:bs].sum()) + bs * num_draft)


def fits(batch, tree_mask: torch.Tensor) -> bool:
    """Whether the kernel builds this batch's mask; where not, stock's loop reads the host lengths
    before the draft prep, so a wait ``ngram_late_wait`` deferred to the draft prep is taken first, and
    lengths a scheduler did not publish are read here (one blocking read, stock's wait)."""
    seq_lens = batch.seq_lens
    ok = (len(batch.reqs) > 0 and (batch.seq_lens_cpu is not None or allocated_lens(batch) is not None)
          and tree_mask.dtype == torch.bool and isinstance(seq_lens, torch.Tensor)
          and seq_lens.device == tree_mask.device and (tree_mask.is_cuda or _INTERPRET))
    if not ok:
        from . import ngram_late_wait  # it imports this module

        ngram_late_wait.finish()
        if batch.seq_lens_cpu is None and isinstance(seq_lens, torch.Tensor):
            batch.seq_lens_cpu = seq_lens.cpu()
    return ok


def full_mask(tree_mask: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu, num_draft: int,
              total: int | None = None) -> torch.Tensor:
    """Stock's ``torch.cat([cat((ones(D, L_i), mask_i), 1).to(bool).flatten() for i])``, in a tensor of
    ``total`` cells (``mask_size``; stock's exact size from ``seq_lens_cpu`` when not given)."""
    bs = seq_lens.shape[0]
    if total is None:
        total = num_draft * (int(seq_lens_cpu[:bs].sum()) + bs * num_draft)
    out = torch.empty(total, dtype=torch.bool, device=tree_mask.device)
    _full_mask_kernel[(bs, num_draft)](tree_mask, seq_lens, out, total, D=num_draft, BLOCK=BLOCK, num_warps=4)
    return out


def _bind():
    return {"_hostsync_full_mask": full_mask, "_hostsync_full_mask_fits": fits, "_hostsync_full_mask_size": mask_size}


PREPARE_ONCE = NGRAM_PREPARE_SITE.edit(NAME, (ONES_EDIT, LOOP_EDIT), _bind)


def edited(original):
    """SGLang's verify prep with this slot's edits alone (the site's variant the installer runs)."""
    return NGRAM_PREPARE_SITE.variant(original, (NAME,))


def inert(f) -> str | None:
    return not_speculative(f, "only NGRAM builds the full verify mask", bool(f.speculative_algorithm) and f.is_ngram())


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (NGRAM USE_FULL_MASK verify mask)",
    summary="NGRAM's full verify mask in one Triton launch, not per-request fills and pageable copies",
    default=False,
    presets=(NGRAM_PRESET,),
    precheck=config_precheck(None, PREPARE_ONCE.check),
    inert=inert,
    targets=(PREPARE_ONCE.target(),),
)
