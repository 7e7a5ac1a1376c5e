"""Slot ``draft_decode_glue_graph``: the EAGLE multi-step draft graph's per-replay attention
metadata prep (triton) through SGLang's own metadata glue graph.

SGLang 0.5.23's ``EAGLEDraftCudaGraphRunner.execute`` copies the batch into the runner's
static buffers and then runs ``TritonMultiStepDraftBackend.init_forward_metadata_out_graph``
eagerly before every replay: ``generate_draft_decode_kv_indices`` (every draft step's KV
indptr and indices) and ``get_num_kv_splits``, two Triton launches whose host dispatch cost
lands in each step. SGLang does not glue this runner (its comment: a FlashInfer wrapper's
plan would be corrupted, and the draft prep is cheaper than the target's); under triton the
prep is device work over the runner's buffers, ``req_to_token`` and the backend's graph
buffers. This slot routes that call through a ``MetadataGlueGraph`` of its own per backend,
keyed by the batch size, with the view's ``seq_lens``, ``req_pool_indices`` and ``positions``
pointed at the runner's static buffers (execute has just copied the batch's values there,
on the same stream), so every address the graph reads is stable. It steps aside, leaving
SGLang's eager prep, for:

- a call outside ``EAGLEDraftCudaGraphRunner.execute`` (capture, eager drafts) or for
  another backend than that runner's;
- a padded replay (``num_padding``; SGLang's glue rule);
- translated KV reads, a sliding-window rail or pool (SGLang's own extra copies run then);
- a glue that could not be captured (SGLang's fallback: eager for good).

``SGLANG_HOSTSYNC_GLUE_CHECK=N`` (shared with ``draft_extend_glue_graph``): every Nth glued
replay the slot snapshots each draft step's indptr row, its KV indices up to that row's end,
and the KV splits, runs SGLang's eager prep again and compares them on the device; the count
is read back without waiting (see ``draft_extend_glue_graph``).
Each batch size's first glued replays are the glue's 2 warm-ups and its capture (which
synchronizes the device once per batch size, while serving). Opt-in; part of ``eagle_host``.
Hook targets: ``EAGLEDraftCudaGraphRunner.execute`` (which runner is replaying) and
``TritonMultiStepDraftBackend.init_forward_metadata_out_graph`` (AROUND).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck
from . import draft_extend_glue_graph as extend_glue
from .upstream_switches import HOST_PRESET

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "draft_decode_glue_graph"
MULTI_STEP = "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend"
TRITON = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
RUNNER = "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner"

# What the glue contract was read from (SGLang 0.5.23): the prep's body and the kernels'
# wrappers, and the runner's copies before it; a change upstream refuses the slot.
PINS = (
    (MULTI_STEP, "common_template", "529c1ef818b9cebe"),
    (TRITON, "get_num_kv_splits", "b9e07504416077c9"),
    ("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator", "read_source", "a25626819f55ccc2"),
    ("sglang.srt.model_executor.runner.metadata_glue_graph", "MetadataGlueGraph", "793568554a092295"),
)


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the glue contract")


class _Leaf:
    """The multi-step backend as ``MetadataGlueGraph`` expects a backend: its prep writes
    only graph buffers (no ``forward_metadata`` to snapshot) and it has no sub-backend list."""

    attn_backend_list = None

    def __init__(self, original, backend):
        self.original, self.backend, self.forward_metadata = original, backend, None

    def init_forward_metadata_out_graph(self, fb):
        self.original(self.backend, fb, False)


@dataclass
class DraftGlueRoute(extend_glue.GlueRoute):
    """The draft-extend slot's route (one glue per backend, counts), plus the runner now replaying."""

    runner: object = None  # set for the duration of EAGLEDraftCudaGraphRunner.execute


_route = DraftGlueRoute()


def execute_hook(original, self, forward_batch):
    r = _route
    outer, r.runner = r.runner, self
    try:
        return original(self, forward_batch)
    finally:
        r.runner = outer


def glueable(backend, fb) -> bool:
    """The glue contract for this backend and replay (see the module docstring)."""
    return (
        fb.num_padding == 0
        and not backend.window_rail
        and not backend.attn_backends[0].use_sliding_window_kv_pool
        and not backend.kv_index_translator.reads_are_translated
    )


def static_view(runner, fb):
    """``fb`` with the three tensors the prep reads from the batch replaced by the runner's
    static buffers, which hold the same values (execute copied them just before)."""
    bs, buffers = fb.batch_size, runner.buffers
    return SimpleNamespace(**{**vars(fb), "seq_lens": buffers.seq_lens[:bs],
                              "req_pool_indices": buffers.req_pool_indices[:bs],
                              "positions": buffers.positions[: fb.positions.shape[0]]})


def _outputs(backend, bs: int) -> list[torch.Tensor]:
    num = bs * backend.topk
    indptr = backend.kv_indptr[: backend.speculative_num_steps, : num + 1].clone()
    bound = min(backend.cuda_graph_kv_indices.shape[1], num * backend.max_context_len)
    return [indptr, backend.attn_backends[-1].cuda_graph_num_kv_splits[:num].clone(),
            extend_glue.valid_prefix(backend.cuda_graph_kv_indices[: backend.speculative_num_steps, :bound],
                                     indptr[:, -1:])]


def _check(original, backend, fb) -> None:
    extend_glue.run_check(_route, NAME, "draft metadata", fb.batch_size, lambda: _outputs(backend, fb.batch_size),
                          lambda: original(backend, fb, False))


def prep_hook(original, self, forward_batch, in_capture=False):
    r = _route
    runner = r.runner
    if in_capture or runner is None or runner.draft_attn_backend is not self:
        return original(self, forward_batch, in_capture)
    glue = r.usable(self, glueable(self, forward_batch))
    if glue is None:
        return original(self, forward_batch, in_capture)
    key = (forward_batch.batch_size,)
    if glue.is_captured(key):  # the graph reads the runner's buffers: no view, no prep in Python
        glue.replay(key)
        r.glued += 1
        if r.check and r.glued % r.check == 0:
            _check(original, self, static_view(runner, forward_batch))
        return None
    # The glue's warm-ups and capture call SGLang's prep (``original``) on the static view.
    glue.run(_Leaf(original, self), static_view(runner, forward_batch), key)
    r.glued += 1
    if glue.is_captured(key):
        logger.info("hostsync: %s: draft metadata prep captured for bs %d", NAME, key[0])
    return None


def prepare(facts) -> str:
    return extend_glue.arm_check(_route)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 MetadataGlueGraph, routed for the EAGLE multi-step draft",
    summary="EAGLE multi-step draft graph's triton metadata prep replayed as one small CUDA graph (SGLang's glue)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(extend_glue.check_every, pinned_sources),
    inert=lambda f: extend_glue.glue_inert(f, "the EAGLE-family multi-step draft"),
    prepare=prepare,
    targets=(
        HookTarget(f"{RUNNER}.execute", TargetKind.FUNCTION, hook=execute_hook, params=("self", "forward_batch"),
                   source_sha="4664cdf3c97b8807"),
        HookTarget(f"{MULTI_STEP}.init_forward_metadata_out_graph", TargetKind.FUNCTION, hook=prep_hook,
                   params=("self", "forward_batch", "in_capture"), source_sha="9174fbd454bec4f2"),
    ),
)
