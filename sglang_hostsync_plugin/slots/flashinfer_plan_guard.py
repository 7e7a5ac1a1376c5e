"""Slot ``flashinfer_plan_guard``: FlashInfer's per-replay plans stop overwriting a
pinned buffer whose host-to-device copy has not run yet (a WAR hazard).

Every FlashInfer plan (``plan()``, SGLang's ``fast_prefill_plan``, FlashInfer's
``fast_decode_plan``) writes its scheduling metadata into the wrapper's pinned
``_pin_memory_int_workspace_buffer`` on the host, then enqueues
``cudaMemcpyAsync(int_workspace <- pinned)`` on the current stream
(``scheduler.cuh``, no synchronize). CUDA-graph wrappers are replanned every step
(the draft's decode wrappers and the draft-extend wrapper in stock SGLang 0.5.23, the
verify wrapper with ``flashinfer_verify_host_plan`` / ``flashinfer_tree_verify_plan``).
Stock SGLang is safe only because a blocking read somewhere in each step (the
verify ``plan()``'s ``.to("cpu")``) drains the stream before the next plan. Once
those reads are gone and the CPU runs ahead, step N+1's plan can rewrite the
buffer while step N's copy from it still waits in the queue, and step N's kernels
read step N+1's plan.

With the slot, each CUDA-graph wrapper plans into a ring of DEPTH pinned buffers
(the second one allocated on the wrapper's first replan, same size). After a plan
the slot records an event on the stream, behind the copy. Before a buffer is
written again, its event must have fired. With the CPU at most one step ahead it
has (``query()``), so the host never waits; otherwise it waits on that event, as
stock's blocking read would have, and the wait is counted (``ring().host_waits``).
Eager wrappers (``is_cuda_graph_enabled`` false) run ``plan()``, which reads its
indptr back with a blocking copy, so they are passed through.

Where nothing removes that read it guards nothing: at EAGLE topk 1 with a FlashInfer target, stock
SGLang's verify ``plan()`` still reads back every step, so the slot is inert there unless a selected
slot that requires it applies (``flashinfer_verify_host_plan``) or the user's own
``SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN`` turns that read off. (H100, 2026-12-06, FlashInfer topk 1
page 16: ``default`` with the guard read 0.970x stock at c1, within the ~3% two identical servers
differed by in that run; not re-measured without it.)

Hook targets: ``FlashInferIndicesUpdaterDecode.call_begin_forward`` and
``FlashInferIndicesUpdaterPrefill.call_begin_forward`` (AROUND; SGLang's bodies run
unchanged). Under any other attention backend they are never called.
"""

from __future__ import annotations

import importlib.util
import inspect
import weakref
from dataclasses import dataclass, field

import torch

from .. import switches
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, not_flashinfer
from .upstream_host_plans import FLASHINFER_PRESET as PRESET, VERIFY_HOST_PLAN_FLAG

NAME = "flashinfer_plan_guard"
FB = "sglang.srt.layers.attention.flashinfer_backend"

# Step N's copy is queued while step N+1 plans; the buffer step N+2 rewrites is N's.
DEPTH = 2


@dataclass
class PinnedRing:
    buffers: list
    events: list = field(default_factory=list)
    current: int = 0


class PlanGuard:
    """Per wrapper, a ring of pinned plan buffers, each freed by the event recorded
    behind the last copy out of it. ``new_event`` / ``new_buffer`` are injectable so
    the CPU tests can drive it without CUDA."""

    def __init__(self, depth: int = DEPTH, new_event=None, new_buffer=None, swap_first: bool = False):
        self.depth = depth
        # swap_first: a wrapper's first guarded plan already takes a new buffer (a plan made before the
        # guard saw the wrapper may still have its copy queued from the one it has, which waits on it from then).
        self.swap_first = swap_first
        self.rings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.new_event = new_event or (lambda: torch.cuda.Event())
        self.new_buffer = new_buffer or (lambda like: torch.zeros_like(like, pin_memory=True))
        self.host_waits = 0  # a buffer's last copy had not run when it was needed again
        self.allocations = 0

    def before_plan(self, wrapper) -> None:
        ring = self.rings.get(wrapper)
        if ring is None:
            ring = self.rings[wrapper] = PinnedRing([wrapper._pin_memory_int_workspace_buffer], [None])
            if not self.swap_first:
                return
            ring.events[0] = self.new_event()  # behind the copy the unguarded plans queued from it
            ring.events[0].record()
        index = (ring.current + 1) % self.depth
        if index == len(ring.buffers):
            ring.buffers.append(self.new_buffer(ring.buffers[0]))
            ring.events.append(None)
            self.allocations += 1
        event = ring.events[index]
        if event is not None and not event.query():
            self.host_waits += 1
            event.synchronize()
        ring.current = index
        wrapper._pin_memory_int_workspace_buffer = ring.buffers[index]

    def after_plan(self, wrapper) -> None:
        ring = self.rings[wrapper]
        if ring.events[ring.current] is None:
            ring.events[ring.current] = self.new_event()
        ring.events[ring.current].record()


_guard = PlanGuard()

PINNED_FIELD = "_pin_memory_int_workspace_buffer"


def precheck() -> str | None:
    """Without FlashInfer there is nothing to guard (the hooks are never reached). With
    it, every wrapper SGLang 0.5.23 plans with must stage its plan in the field the ring swaps."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    import flashinfer

    wrappers = (flashinfer.BatchPrefillWithPagedKVCacheWrapper, flashinfer.BatchPrefillWithRaggedKVCacheWrapper,
                flashinfer.BatchDecodeWithPagedKVCacheWrapper)
    # The hooks read is_cuda_graph_enabled and swap PINNED_FIELD on every replan.
    missing = [cls.__name__ for cls in wrappers
               if PINNED_FIELD not in inspect.getsource(cls.__init__) or not hasattr(cls, "is_cuda_graph_enabled")]
    if missing:
        return (f"flashinfer {flashinfer.__version__}: {', '.join(missing)} no longer set {PINNED_FIELD} "
                "(or lost is_cuda_graph_enabled); "
                "the guard does not know where this version stages its plans")
    return None


def inert(f: ServingFacts) -> str | None:
    if reason := not_flashinfer(f):
        return reason
    # Both target backends FlashInfer: the verify plans with FlashInfer's plan() whatever the attention mode.
    if f.speculative_algorithm and f.is_eagle_family() and f.topk == 1 \
            and f.attention_backends == ("flashinfer", "flashinfer") \
            and not switches.env_value(VERIFY_HOST_PLAN_FLAG, f.env):
        return ("inert because --speculative-eagle-topk is 1: SGLang's verify plan() reads back every step, "
                "so no plan outruns its copy (flashinfer_verify_host_plan, which removes that read, keeps it)")
    return None


def _guard_before(wrappers) -> tuple:
    live = tuple(w for w in wrappers if w is not None and w.is_cuda_graph_enabled)
    for w in live:
        _guard.before_plan(w)
    return live


def _guard_after(live: tuple) -> None:
    for w in live:
        _guard.after_plan(w)


def decode_begin_forward_hook(original, self, wrapper, *args, **kwargs):
    live = _guard_before((wrapper,))
    out = original(self, wrapper, *args, **kwargs)
    _guard_after(live)
    return out


def prefill_begin_forward_hook(original, self, wrapper_ragged, wrapper_paged, *args, **kwargs):
    live = _guard_before((wrapper_ragged, wrapper_paged))
    out = original(self, wrapper_ragged, wrapper_paged, *args, **kwargs)
    _guard_after(live)
    return out


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (FlashInfer pinned plan buffer WAR)",
    summary="FlashInfer CUDA-graph plans write a ring of pinned buffers, each reused only after its H2D ran",
    default=True,
    presets=(PRESET,),
    precheck=precheck,
    inert=inert,
    kept_by_dependents=True,
    targets=(
        HookTarget(
            f"{FB}.FlashInferIndicesUpdaterDecode.call_begin_forward", TargetKind.FUNCTION,
            hook=decode_begin_forward_hook,
            params=("self", "wrapper", "paged_kernel_lens", "paged_kernel_lens_sum", "kv_indptr", "kv_start_idx",
                    "spec_info", "seq_lens_cpu", "use_sliding_window_kv_pool", "fixed_split_size",
                    "disable_split_kv", "plan", "req_pool_indices"),
            source_sha="c9359382e9a29312",
        ),
        HookTarget(
            f"{FB}.FlashInferIndicesUpdaterPrefill.call_begin_forward", TargetKind.FUNCTION,
            hook=prefill_begin_forward_hook,
            params=("self", "wrapper_ragged", "wrapper_paged", "req_pool_indices", "paged_kernel_lens",
                    "paged_kernel_lens_sum", "seq_lens", "prefix_lens", "kv_start_idx", "kv_indptr", "qo_indptr",
                    "use_ragged", "spec_info", "use_sliding_window_kv_pool", "fixed_split_size",
                    "multi_item_params", "cross_attention_custom_mask", "seq_lens_cpu", "custom_kv_indices",
                    "window_left", "plan"),
            source_sha="5e12b9f71b1bfd90",
        ),
    ),
)
