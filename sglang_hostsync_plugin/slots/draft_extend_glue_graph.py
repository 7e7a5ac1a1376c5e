"""Slot ``draft_extend_glue_graph``: the EAGLE draft-extend graph's per-replay attention
metadata prep (triton) through SGLang's own metadata glue graph.

SGLang 0.5.23's ``EAGLEDraftExtendCudaGraphRunner.execute`` runs
``draft_extend_attn_backend.init_forward_metadata_out_graph(fb_view)`` eagerly before
every replay: with triton, ``_update_draft_extend_buffers`` (qo indptr arange, kv
lengths, the kv indptr cumsum and the kv-index gather into the graph's static
buffers), a handful of small launches whose host dispatch cost lands in each step.
SGLang captures the same kind of op soup into one small CUDA graph per replay key
(``MetadataGlueGraph``, ``SGLANG_ENABLE_METADATA_GLUE_GRAPH``), but routes only
``DecodeCudaGraphRunner`` (target verify, DSpark draft) there, never the EAGLE
draft-extend runner. This slot routes that one call through a ``MetadataGlueGraph``
of its own per backend, keyed by the batch size, under the glue's contract
(``metadata_glue_graph.py``): every device input lives at a stable address and every
Python-visible branch is constant per key. It steps aside, leaving SGLang's eager
prep, for:

- any call but a draft-extend replay (capture, the target verify, the draft decode);
- a padded replay (``bs * num_draft_tokens`` tokens or the runner pads rows);
- translated KV reads (``kv_index_translator.reads_are_translated``: the iteration's
  plan may own the read table, a per-step address), sliding-window layers or a
  sliding-window KV pool (its write ids come through the plan), dLLM;
- a glue that could not be captured (SGLang's fallback: eager for good).

Triton's prep is host-value free here: its inputs are the runner's static buffers
(``seq_lens``, ``req_pool_indices``, ``extend_seq_lens``) and the persistent
``req_to_token``, and it writes the graph's ``qo_indptr``, ``kv_indptr`` and
``cuda_graph_kv_indices``. Other backends never reach the hook (FlashInfer's
draft-extend plan is host-fed: a glue would freeze it).

``SGLANG_HOSTSYNC_GLUE_CHECK=N`` (default 0, off): every Nth glued replay the slot
snapshots those three outputs, runs SGLang's eager prep over them again and compares them
on the device (the KV indices up to the indptr's end, within SGLang's own bound of
``bs * max_context_len``). The mismatch count stays on the device and comes back through a
pinned copy read once its event has completed, so a check never waits for the GPU; the log
line says how many checks were read back. It is the real-server proof that the glue
replays what the eager prep computes.

Each batch size's first glued replays are SGLang's glue warm-ups (2, eager) and its
capture (torch's graph capture synchronizes the device and empties its caches, once per
batch size, while serving). Opt-in (not in ``default``); on the H200 its self-check found no
mismatch and it took 70-140 µs per step off the draft-extend replay
(``benchmarks/results/2026-12-01-h200-evening/glue-attribution/``). Hook target:
``TritonAttnBackend.init_forward_metadata_out_graph`` (AROUND).
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, field

import torch

from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from .upstream_switches import HOST_PRESET

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "draft_extend_glue_graph"
TRITON = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
ENV_CHECK = "SGLANG_HOSTSYNC_GLUE_CHECK"
MAX_LOGGED = 10


# What the glue contract was read from (SGLang 0.5.23) besides the target: the prep's body, the runner's
# static-buffer view and the KV gather; a change upstream refuses the slot.
PINS = (
    (TRITON, "_init_forward_metadata_out_graph", "7acaaee9a41857fe"),
    (TRITON, "_apply_cuda_graph_metadata", "49f61923ed152a6f"),
    (TRITON, "_update_draft_extend_buffers", "7e2ce776f4158812"),
    (TRITON, "_fill_kv_indptr_and_indices", "f4200d88c8c7e78c"),
    ("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner", "execute",
     "915f2539380690ee"),
    ("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator", "pack_read_stream", "376a9540c6b0d444"),
    ("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator", "read_source", "a25626819f55ccc2"),
    ("sglang.srt.model_executor.runner.metadata_glue_graph", "MetadataGlueGraph", "793568554a092295"),
)


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the glue contract")


def check_every(env=None) -> int:
    from ..config import env_count

    return env_count(ENV_CHECK, 0, env, minimum=0, hint="use 0 (off) or a positive number of glued replays")


class CheckTally:
    """The glue self-checks' mismatch count, kept on the device. It is read back through a
    pinned copy only once that copy's event has completed: counting never waits for the GPU."""

    def __init__(self):
        self.count = None  # device int64 [1]: mismatching checks so far
        self.host = None  # pinned copy of ``count``
        self.event = None  # completes when ``host`` holds the copy issued at check ``pending``
        self.pending = 0
        self.read = 0  # checks whose outcome has been read back
        self.mismatches = 0  # among those

    def add(self, differs: torch.Tensor, check: int) -> None:
        """Count one check (``differs``: a device bool) and start a readback when none is in flight."""
        if self.count is None:
            self.count = torch.zeros(1, dtype=torch.int64, device=differs.device)
        self.count += differs.to(torch.int64)
        if differs.device.type != "cuda":  # a host tensor: nothing to wait for
            self.read, self.mismatches = check, int(self.count)
            return
        self.harvest()
        if self.event is None:
            if self.host is None:
                self.host = torch.empty(1, dtype=torch.int64, pin_memory=True)
            self.host.copy_(self.count, non_blocking=True)
            self.event, self.pending = torch.cuda.Event(), check
            self.event.record()

    def harvest(self) -> None:
        if self.event is not None and self.event.query():
            self.read, self.mismatches = self.pending, int(self.host[0])
            self.event = None

    def settle(self, checks: int) -> None:
        """Read the count of all ``checks`` now, waiting for the device (tests, diagnostics)."""
        if self.count is not None:
            self.event, self.read, self.mismatches = None, checks, int(self.count)


@dataclass
class GlueRoute:
    """Per process: one SGLang ``MetadataGlueGraph`` per draft-extend backend, and counts."""

    check: int = 0
    glues: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    inside: bool = False  # the glue's own (warm-up / capture / check) call of the prep
    glued: int = 0  # replays handed to the glue (its warm-ups included)
    eager: int = 0  # draft-extend replays left to SGLang's eager prep
    checks: int = 0
    tally: CheckTally = field(default_factory=CheckTally)
    new_glue: object = None  # injectable for the CPU tests

    @property
    def mismatches(self) -> int:
        """Mismatching checks among the ``tally.read`` read back so far."""
        return self.tally.mismatches

    def usable(self, backend, contract_holds: bool):
        """``backend``'s glue for this replay, or None when the replay stays on SGLang's eager
        prep (the contract does not hold, or the glue fell back for good): counted."""
        glue = self.glue_for(backend) if contract_holds else None
        if glue is None or glue.disabled:
            self.eager += 1
            return None
        return glue

    def glue_for(self, backend):
        glue = self.glues.get(backend)
        if glue is None:
            if self.new_glue is not None:
                glue = self.new_glue(backend)
            else:
                from sglang.srt.model_executor.runner.metadata_glue_graph import MetadataGlueGraph

                glue = MetadataGlueGraph(backend.device)
            self.glues[backend] = glue
        return glue


_route = GlueRoute()


def _draft_extend_replay(backend, fb, in_capture) -> bool:
    return (not in_capture and fb.forward_mode.is_draft_extend_v2() and fb.spec_info is not None
            and fb.input_ids is not None)


def glueable(backend, fb) -> bool:
    """The glue contract for this backend and replay (see the module docstring)."""
    return (
        fb.input_ids.shape[0] == fb.batch_size * backend.num_draft_tokens
        and backend.dllm_attention is None
        and not (backend.sliding_window_size is not None and backend.sliding_window_size > 0)
        and not backend.use_sliding_window_kv_pool  # its write ids come through the iteration's plan
        and not backend.kv_index_translator.reads_are_translated
    )


def valid_prefix(kv_indices: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """A copy of ``kv_indices`` (rows of SGLang's bounded width) with every entry at or past
    the row's device-side ``ends`` zeroed: comparable without reading the end back."""
    return torch.where(torch.arange(kv_indices.shape[-1], device=kv_indices.device) < ends, kv_indices, 0)


def _outputs(backend, bs: int) -> tuple[torch.Tensor, ...]:
    kv_indptr = backend.kv_indptr[: bs + 1].clone()
    bound = min(backend.cuda_graph_kv_indices.numel(), bs * backend.max_context_len)
    return (backend.qo_indptr[: bs + 1].clone(), kv_indptr,
            valid_prefix(backend.cuda_graph_kv_indices[:bound], kv_indptr[-1]))


def run_check(r: GlueRoute, slot: str, what: str, bs: int, outputs, rerun) -> None:
    """The glue slots' eager self-check: the glued ``outputs()`` against the same after ``rerun()``
    (SGLang's eager prep over the same buffers), compared on the device; no host read waits."""
    glued = outputs()
    rerun()
    eager = outputs()
    r.checks += 1
    before = r.mismatches
    # Same shapes by construction (the batch size and SGLang's bound fix them).
    r.tally.add(torch.stack([(a != b).any() for a, b in zip(glued, eager)]).any(), r.checks)
    if r.mismatches > before and r.mismatches <= MAX_LOGGED:
        logger.warning("hostsync: %s check: %d checks, %d mismatches in the %d read back (the glued %s differs "
                       "from the eager prep; bs %d at the latest check)", slot, r.checks, r.mismatches,
                       r.tally.read, what, bs)
    elif r.checks in (1, 10, 100) or r.checks % 1000 == 0:
        logger.info("hostsync: %s check: %d checks, %d mismatches in the %d read back", slot, r.checks,
                    r.mismatches, r.tally.read)


def _check(original, backend, fb, in_capture) -> None:
    run_check(_route, NAME, "draft-extend metadata", fb.batch_size, lambda: _outputs(backend, fb.batch_size),
              lambda: original(backend, fb, in_capture))


def prep_hook(original, self, forward_batch, in_capture=False):
    r = _route
    if r.inside or not _draft_extend_replay(self, forward_batch, in_capture):
        return original(self, forward_batch, in_capture)
    glue = r.usable(self, glueable(self, forward_batch))
    if glue is None:
        return original(self, forward_batch, in_capture)
    key = (forward_batch.batch_size,)
    r.inside = True
    try:
        was_captured = glue.is_captured(key)
        glue.run(self, forward_batch, key)
        r.glued += 1
        if was_captured:
            if r.check and r.glued % r.check == 0:
                _check(original, self, forward_batch, in_capture)
        elif glue.is_captured(key):
            logger.info("hostsync: %s: draft-extend metadata prep captured for bs %d", NAME, key[0])
    finally:
        r.inside = False
    return None


def glue_inert(f: ServingFacts, runner: str) -> str | None:
    """SGLang's glue conditions for an EAGLE-family graph runner's triton prep (both glue slots)."""
    if not f.speculative_algorithm or not f.is_eagle_family():
        return not_speculative(f, f"only {runner} has this graph runner", False)
    if f.disable_cuda_graph:
        return "inert because --disable-cuda-graph is set (no draft-extend graph)"
    for on, what in ((f.two_batch_overlap, "two-batch overlap"), (f.enable_pdmux, "pdmux"), (f.enable_lora, "LoRA")):
        if on:
            return f"inert because {what} is on (SGLang's glue contract excludes it)"
    backends = [*f.attention_backends, f.draft_attention_backend]
    if None not in backends[:2] and "triton" not in backends:
        return f"inert because the attention backends are {', '.join(sorted({b for b in backends if b}))}, not triton"
    return None


def inert(f: ServingFacts) -> str | None:
    return glue_inert(f, "the EAGLE-family draft extend")


def arm_check(route: GlueRoute) -> str:
    """A glue slot's ``prepare``: read ``SGLANG_HOSTSYNC_GLUE_CHECK`` into its route."""
    route.check = check_every()
    return f"eager check every {route.check} glued replays" if route.check else ""


def prepare(facts) -> str:
    return arm_check(_route)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 MetadataGlueGraph, routed for the EAGLE draft extend",
    summary="EAGLE draft-extend graph's triton metadata prep replayed as one small CUDA graph (SGLang's glue)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(check_every, pinned_sources),
    inert=inert,
    prepare=prepare,
    targets=(
        HookTarget(
            f"{TRITON}.init_forward_metadata_out_graph", TargetKind.FUNCTION, hook=prep_hook,
            params=("self", "forward_batch", "in_capture"), source_sha="eca4f02a38884845",
        ),
    ),
)
