"""Slot ``draft_extend_fused_layout``: the EAGLE v2 draft extend takes SGLang's own one-launch
length/position layout also where the batch carries host lengths (FlashInfer), instead of two
fresh pinned tensors and H2D copies per step.

Stock SGLang 0.5.23, ``eagle_worker_common.prepare_for_draft_extend``: without ``seq_lens_cpu``
(triton and the other device-length backends) the prefix and extend lengths, the post-extend
lengths, the positions and the extend start offsets come from one Triton launch,
``prepare_draft_extend_layout``. With ``seq_lens_cpu`` (FlashInfer: ``needs_cpu_seq_lens``) the
lengths are host lists, so ``ForwardBatch.init_new`` builds two fresh pinned tensors and copies
them to the device (``forward_batch_info.py`` ~1234-1239), computes the positions from them
(``compute_position``: two allocations and a launch), and the caller adds the draft width to
``seq_lens`` (another launch). That is the per-step pinned staging item 3 names.

With the slot the fused branch runs in that case too, and the host mirrors the list branch
leaves on the forward batch are filled from ``seq_lens_cpu`` exactly as it fills them:
``extend_prefix_lens_cpu = [max(len - front, 0)]``, ``extend_seq_lens_cpu = [width] * bs``
(FlashInfer's draft-extend plan reads them); ``seq_lens_cpu`` and ``seq_lens_sum`` stay SGLang's
own lines. The device values are the same (int32 prefix / extend lengths, int64 positions,
int32 start offsets, post lengths in ``seq_lens``' dtype), on the same plan stream. Not taken
(SGLang's list branch runs): an idle batch, lengths not on CUDA (outside the Triton
interpreter), an M-RoPE model, or one whose forward builds multimodal token modalities from the
host lists.

On the H200 (2026-12-02, FlashInfer STANDALONE topk 4 page 16, ``benchmarks/results/2026-12-02-h200-c/``):
greedy ids and top-5 logprobs identical to stock; the draft extend's prep host time 379 -> 276 µs
per step at c1. Not in ``default`` (FlashInfer only); in the ``flashinfer`` preset. Hook target:
``prepare_for_draft_extend`` (AROUND; recompiled from its pinned source with two edits,
``source_edit.PinnedEdit``).
"""

from __future__ import annotations

import os

import torch

from ..slot import Slot, SlotKind, config_precheck, not_flashinfer, not_speculative
from ..source_edit import PinnedEdit
from .upstream_host_plans import FLASHINFER_PRESET

NAME = "draft_extend_fused_layout"
PREPARE = "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend"
PREPARE_SHA = "10d99587687d599e"
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

FUSED_EDIT = (
    "    fused_lengths = gpu_only and batch.seq_lens.is_cuda\n",
    "    fused_lengths = (gpu_only and batch.seq_lens.is_cuda) or _hostsync_fused_with_mirrors(\n"
    "        batch, draft_model_runner\n"
    "    )\n",
)
MIRROR_EDIT = (
    "    if not gpu_only:\n"
    "        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu + num_draft_tokens\n",
    "    if not gpu_only:\n"
    "        if fused_lengths:\n"
    "            _hostsync_mirror_lengths(\n"
    "                forward_batch, batch.seq_lens_cpu, front_offset, num_window_tokens\n"
    "            )\n"
    "        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu + num_draft_tokens\n",
)


def fused_with_mirrors(batch, draft_model_runner) -> bool:
    """Where SGLang's list branch would run and the fused one gives the same forward batch."""
    config = draft_model_runner.model_config
    seq_lens = batch.seq_lens
    return (batch.seq_lens_cpu is not None and isinstance(seq_lens, torch.Tensor)
            and (seq_lens.is_cuda or _INTERPRET) and not batch.forward_mode.is_idle()
            and not config.model_is_mrope and not config.requires_mm_token_modalities)


def mirror_lengths(forward_batch, seq_lens_cpu: torch.Tensor, front_offset: int, width: int) -> None:
    """The host mirrors ``ForwardBatch.init_new``'s list branch sets from the lists the stock
    caller builds (``prefix_lens``, ``extend_lens``)."""
    forward_batch.extend_prefix_lens_cpu = [max(int(x) - front_offset, 0) for x in seq_lens_cpu.tolist()]
    forward_batch.extend_seq_lens_cpu = [width] * len(forward_batch.extend_prefix_lens_cpu)


def _bind():
    return {"_hostsync_fused_with_mirrors": fused_with_mirrors, "_hostsync_mirror_lengths": mirror_lengths}


PREPARE_ONCE = PinnedEdit(NAME, PREPARE, (FUSED_EDIT, MIRROR_EDIT), _bind, PREPARE_SHA)


def inert(f) -> str | None:
    ok = bool(f.speculative_algorithm) and f.is_eagle_family()
    return not_speculative(f, "only the EAGLE-family v2 draft extend runs prepare_for_draft_extend", ok) or not_flashinfer(f)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE v2 draft extend with host lengths)",
    summary="the draft extend's lengths and positions in SGLang's one fused launch where FlashInfer "
            "keeps host lengths, not two pinned tensors + H2D per step",
    default=False,
    presets=(FLASHINFER_PRESET,),
    precheck=config_precheck(None, PREPARE_ONCE.check),
    inert=inert,
    targets=(PREPARE_ONCE.target(),),
)
