"""Slot ``draft_extend_topk_graph``: the EAGLE v2 draft extend's top-k at topk > 1 replayed from a
CUDA graph (host time per step).

After the draft-extend graph, SGLang 0.5.23's ``EagleDraftWorker._draft_extend_for_decode`` takes the
next step's draft proposals eagerly: ``probs = renorm_draft_probs(logits, ...)`` (a softmax over the
vocabulary) and ``fast_topk(probs, topk, dim=-1)`` (``torch.topk``, a radix select of several
launches). In a py-spy of the 8B-shaped server at topk 4 these two lines were the largest of the
plugin's step, about 2.5% + 0.6% of the scheduler's busy samples (~250 µs per step;
``benchmarks/results/2026-12-03-h200-c/pyspy-t4/``).

With the draft-extend graph the logits are a view of that graph's static output, so their address
and layout repeat. This slot captures SGLang's own two calls once per such view into a small CUDA
graph (a private pool shared by all of them) and replays it; the results are cloned, so every call
returns fresh tensors as stock's do. The same kernels run on the same inputs: bit-identical to
stock, tie order included. The first call for a view runs stock's code eagerly (its result is that
step's) and then captures, on a side stream, without a sync. Stock's code runs for an eager draft
extend (its logits are a fresh gather), an empty batch, rejection sampling (another branch), a CPU
tensor, a call inside another capture, every call after a failed capture (logged once) and beyond
``MAX_GRAPHS`` views. Hook target: ``_draft_extend_for_decode`` (an edit site shared with
``greedy_row_argmax``, which edits its topk-1 branch).
"""

from __future__ import annotations

import logging

import torch

from ..slot import Slot, SlotKind, config_precheck, not_speculative
from .edit_sites import DRAFT_EXTEND_SITE
from .upstream_switches import HOST_PRESET

NAME = "draft_extend_topk_graph"
MAX_GRAPHS = 64  # views (batch sizes x buckets) per process; a bound on the pool, never reached at low concurrency
logger = logging.getLogger("sglang.srt.plugins.hostsync")

EDIT = (
    "            probs = renorm_draft_probs(\n"
    "                draft_logits_output.next_token_logits,\n"
    "                batch.sampling_info,\n"
    "                get_spec().speculative_use_rejection_sampling,\n"
    "            )\n"
    "            ret_topk_p, ret_topk_index = fast_topk(probs, self.topk, dim=-1)\n",
    "            ret_topk_p, ret_topk_index = _hostsync_draft_topk(\n"
    "                draft_logits_output.next_token_logits,\n"
    "                batch.sampling_info,\n"
    "                get_spec().speculative_use_rejection_sampling,\n"
    "                self.topk,\n"
    "                can_run_decode_cuda_graph,\n"
    "            )\n",
)


def stock_topk(logits, sampling_info, use_rejection_sampling: bool, topk: int):
    """The two lines the edit replaces, through the worker module's names (as the original
    function looks them up)."""
    from sglang.srt.speculative import eagle_worker_v2 as worker

    probs = worker.renorm_draft_probs(logits, sampling_info, use_rejection_sampling)
    return worker.fast_topk(probs, topk, dim=-1)


def _fits(logits: torch.Tensor) -> bool:
    return (logits.is_cuda and logits.dim() == 2 and logits.shape[0] > 0 and not logits.requires_grad
            and not torch.cuda.is_current_stream_capturing())


class TopkGraphs:
    """Per logits view (address, shape, strides, dtype, device) and topk: a CUDA graph of
    ``stock_topk`` and its static outputs. A failed capture switches the graphs off for the process
    (as SGLang's ``MetadataGlueGraph`` does); ``replays`` counts the steps a graph served."""

    def __init__(self, limit: int = MAX_GRAPHS):
        self.limit = limit
        self.entries: dict[tuple, tuple] = {}
        self.disabled = False
        self.replays = 0
        self._stream = None
        self._pool = None

    def __call__(self, logits, sampling_info, topk: int):
        """This step's ``(topk_p, topk_index)``, or None where stock's code must run."""
        if self.disabled or not _fits(logits):
            return None
        key = (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype, logits.device, topk)
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.limit:
                return None
            out = stock_topk(logits, sampling_info, False, topk)  # this step's result; warms the kernels
            entry = self.capture(logits, topk)
            if entry is None:
                self.disabled = True
            else:
                self.entries[key] = entry
            return out
        graph, topk_p, topk_index = entry
        graph.replay()
        self.replays += 1
        return topk_p.clone(), topk_index.clone()

    def capture(self, logits, topk: int):
        """``(graph, topk_p, topk_index)``: ``stock_topk`` captured (not run) on a side stream into
        the shared private pool; None, logged, where the capture fails."""
        try:
            if self._stream is None:
                self._stream = torch.cuda.Stream(logits.device)
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # Not ``torch.cuda.graph``: its __enter__ synchronizes the device and empties the cache.
            with torch.cuda.stream(self._stream):
                # thread_local: other threads' CUDA calls are not this capture's business.
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    topk_p, topk_index = stock_topk(logits, None, False, topk)
                finally:
                    graph.capture_end()
            return graph, topk_p, topk_index
        except Exception as exc:  # noqa: BLE001 (stock's code runs from now on)
            logger.error("hostsync: %s: capture for logits %s failed, stock's top-k runs from now on: %s: %s",
                         NAME, tuple(logits.shape), type(exc).__name__, exc)
            return None


GRAPHS = TopkGraphs()


def draft_topk(logits, sampling_info, use_rejection_sampling: bool, topk: int, static_logits: bool):
    """``fast_topk(renorm_draft_probs(logits, ...), topk, dim=-1)``: replayed from a graph where
    ``logits`` is the draft-extend graph's output (``static_logits``), else stock's code."""
    if static_logits and not use_rejection_sampling:
        out = GRAPHS(logits, sampling_info, topk)
        if out is not None:
            return out
    return stock_topk(logits, sampling_info, use_rejection_sampling, topk)


def _bind():
    return {"_hostsync_draft_topk": draft_topk}


DRAFT_EXTEND_ONCE = DRAFT_EXTEND_SITE.edit(NAME, (EDIT,), _bind)


def inert(f) -> str | None:
    if not (f.speculative_algorithm and f.is_eagle_family()):
        return not_speculative(f, "only the EAGLE family's v2 draft extend takes this top-k", False)
    if f.topk == 1:
        return "inert because --speculative-eagle-topk is 1: the draft extend takes the argmax branch"
    if f.disable_cuda_graph:
        return "inert because of --disable-cuda-graph: the draft extend's logits are a fresh tensor each step"
    return None


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE v2 draft extend's top-k at topk > 1)",
    summary="the draft extend's softmax + top-k over the vocabulary replayed from a CUDA graph",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, DRAFT_EXTEND_ONCE.check),
    inert=inert,
    targets=(DRAFT_EXTEND_ONCE.target(),),
)
