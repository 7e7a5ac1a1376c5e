"""Slot ``flashinfer_prefill_host_indptr`` (opt-in; not run on a GPU yet): FlashInfer's plans of a prefill
(extend) batch get their indptrs from the host lengths SGLang already holds, so FlashInfer's ``plan()`` no
longer reads them back from the device.

SGLang 0.5.23's FlashInfer extend path (``FlashInferIndicesUpdaterPrefill.update_single_wrapper`` ->
``call_begin_forward``, ``spec_info`` None) builds ``qo_indptr`` and ``kv_indptr`` on the device and hands
them, with ``kv_last_page_len``, to the eager wrappers' ``begin_forward`` (``plan()``), whose first lines copy
them to the host (FlashInfer 0.7.2 ``prefill.py``: the ragged wrapper's two indptrs, the paged wrapper's
``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len``): five blocking reads per prefill batch, the
first of which waits for everything queued before it. Under overlap that stops the host at every new
request; with ``flashinfer_device_plan`` these are the only syncs a FlashInfer EAGLE server has left.

The host holds the same lengths: ``seq_lens_cpu`` and ``extend_prefix_lens_cpu`` (SGLang already sizes the
KV index list from the latter). In such a call each eager wrapper's ``begin_forward`` gets host indptrs built
as SGLang builds the device ones (``cumsum(seq_lens - prefix_lens)``; ``cumsum(prefix_lens)`` beside the
ragged wrapper, ``cumsum(seq_lens)`` without it; ones), in pinned memory where CUDA is there. FlashInfer plans
from the same values and uploads them itself (non-blocking) into the buffers its kernels read: the same plan
and the same kernel inputs.

Without the read nothing drains the stream between two plans of one eager wrapper, so its pinned plan buffer is
ringed as ``flashinfer_plan_guard`` rings the CUDA-graph wrappers' (the same ``PlanGuard``: two buffers, each
rewritten only after its copy ran; a wait there is counted). Each substituted plan is checked on the stream:
the wrapper's uploaded indptrs against SGLang's device ones, summed into a device counter whose copy is read
at the next prefill without waiting. A mismatch is logged as an error and turns the slot off (that batch
already ran on the host values: the check detects, it does not prevent).

Stock's path, always, for: a speculative batch (verify, draft extend: their plans are other slots'), a
CUDA-graph wrapper, multi-item scoring, a custom or cross-attention mask, NVFP4 custom KV indices, encoder
lengths, a batch without host lengths, and arguments that are not SGLang's own indptr buffers. Sliding-window
and cross-attention servers call other update functions, which the slot does not hook.

Counted and logged at substituted plans 1, 10, 100 and every 1000th (``hostsync: flashinfer_prefill_host_indptr
check: ...``). Hook target (AROUND): ``FlashInferIndicesUpdaterPrefill.update_single_wrapper``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, not_flashinfer
from . import flashinfer_plan_guard as guard

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "flashinfer_prefill_host_indptr"
FB = "sglang.srt.layers.attention.flashinfer_backend"
LOG_AT = (1, 10, 100)


@dataclass
class Stats:
    plans: int = 0  # begin_forward calls that got host indptrs
    stock: int = 0  # extend calls left on stock's path
    unmatched: int = 0  # a begin_forward whose arguments were not SGLang's buffers
    mismatches: int = 0  # device indptrs that differed from the host ones (read back lagged)

    def line(self, host_waits: int) -> str:
        return (f"{self.plans} prefill plans from host indptrs, {self.mismatches} mismatches, {self.stock} stock "
                f"extends, {self.unmatched} unmatched calls, {host_waits} plan-ring waits")


class Engine:
    """The slot's state. ``new_event`` and ``pin`` are injectable so the CPU tests run it without CUDA."""

    def __init__(self, new_event: Callable | None = None, pin: bool | None = None):
        self.stats = Stats()
        self.off: str | None = None
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.new_event = new_event or (lambda: torch.cuda.Event())
        self.ring = guard.PlanGuard(new_event=self.new_event, new_buffer=None if self.pin else torch.zeros_like)
        self.counter: torch.Tensor | None = None  # device: mismatching entries so far
        self.readback: tuple[torch.Tensor, object] | None = None  # (host copy of counter, event behind it)

    def host(self, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        out = torch.empty(values.numel(), dtype=like.dtype, pin_memory=self.pin)
        return out.copy_(values)

    def indptrs(self, updater, seq_lens_cpu, prefix_cpu, use_ragged: bool) -> dict:
        """SGLang's device indptrs of this call (buffer, length) and their host twins, built alike."""
        bs = len(prefix_cpu)
        seq = seq_lens_cpu[:bs].to(torch.int64)
        prefix = torch.tensor(prefix_cpu, dtype=torch.int64)
        qo = torch.zeros(bs + 1, dtype=torch.int64)
        kv = torch.zeros(bs + 1, dtype=torch.int64)
        torch.cumsum(seq - prefix, 0, out=qo[1:])
        torch.cumsum(prefix if use_ragged else seq, 0, out=kv[1:])
        ones = torch.ones(bs, dtype=torch.int64)
        return {"qo": (updater.qo_indptr[0], bs + 1, self.host(qo, updater.qo_indptr[0])),
                "kv": (updater.kv_indptr[0], bs + 1, self.host(kv, updater.kv_indptr[0])),
                "last": (updater.kv_last_page_len, bs, self.host(ones, updater.kv_last_page_len))}

    def take_readback(self) -> None:
        if self.readback is None:
            return
        value, event = self.readback
        if not event.query():
            return
        self.readback = None
        seen = int(value)
        if seen > self.stats.mismatches:
            self.stats.mismatches = seen
            self.off = f"{seen} device indptr entries differed from the host lengths"
            logger.error("hostsync: %s: %s; turned off for this process (stock's plan() reads them back again)",
                         NAME, self.off)

    def check(self, pairs) -> None:
        """Adds the mismatching entries of (SGLang's device indptr, FlashInfer's upload of the host one) pairs
        to the counter; queues its copy. It never raises into the forward: a failure turns the slot off."""
        try:
            for dev, uploaded in pairs:
                if self.counter is None:
                    self.counter = torch.zeros((), dtype=torch.int64, device=dev.device)
                self.counter += (dev != uploaded[: dev.numel()].to(dev.dtype)).sum()
                self.counter += abs(uploaded.numel() - dev.numel())  # a shorter or longer upload: not the same
        except Exception as exc:  # noqa: BLE001 (the check is advice; the forward goes on)
            self.off = f"the check failed: {type(exc).__name__}: {exc}"
            logger.error("hostsync: %s: %s; turned off for this process", NAME, self.off)
            return
        if self.readback is None:
            value = torch.empty((), dtype=torch.int64, pin_memory=self.pin)
            value.copy_(self.counter, non_blocking=True)
            event = self.new_event()
            event.record()
            self.readback = (value, event)

    def counted(self) -> None:
        self.stats.plans += 1
        if self.stats.plans in LOG_AT or self.stats.plans % 1000 == 0:
            logger.info("hostsync: %s check: %s", NAME, self.stats.line(self.ring.host_waits))


ENGINE = Engine()


def _is(arg, buffer: torch.Tensor, length: int) -> bool:
    return (isinstance(arg, torch.Tensor) and arg.shape == (length,) and arg.dtype == buffer.dtype
            and arg.data_ptr() == buffer.data_ptr())


def _ragged_plan(engine: Engine, wrapper, plan, host: dict, qo_indptr, kv_indptr, *args, **kwargs):
    (buf, n, qo) = host["qo"]
    if not (_is(qo_indptr, buf, n) and _is(kv_indptr, buf, n)):
        engine.stats.unmatched += 1
        return plan(qo_indptr, kv_indptr, *args, **kwargs)
    out = _planned(engine, wrapper, partial(plan, qo, qo, *args, **kwargs))
    engine.check(((qo_indptr, wrapper._qo_indptr_buf), (kv_indptr, wrapper._kv_indptr_buf)))
    return out


def _paged_plan(engine: Engine, wrapper, plan, host: dict, qo_indptr, paged_kv_indptr, paged_kv_indices,
                paged_kv_last_page_len, *args, **kwargs):
    want = (qo_indptr, paged_kv_indptr, paged_kv_last_page_len)
    if not all(_is(a, buf, n) for a, (buf, n, _) in zip(want, (host["qo"], host["kv"], host["last"]))):
        engine.stats.unmatched += 1
        return plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, *args, **kwargs)
    out = _planned(engine, wrapper, partial(plan, host["qo"][2], host["kv"][2], paged_kv_indices, host["last"][2],
                                            *args, **kwargs))
    engine.check(((qo_indptr, wrapper._qo_indptr_buf), (paged_kv_indptr, wrapper._paged_kv_indptr_buf),
                  (paged_kv_last_page_len, wrapper._paged_kv_last_page_len_buf)))
    return out


def _planned(engine: Engine, wrapper, run):
    engine.ring.before_plan(wrapper)
    out = run()
    engine.ring.after_plan(wrapper)
    engine.counted()
    return out


def _eligible(engine: Engine, updater, seq_lens, seq_lens_cpu, prefill_wrappers, use_ragged, encoder_lens,
              spec_info, multi_item_params, cross_attention_custom_mask, extend_prefix_lens_cpu,
              custom_kv_indices) -> bool:
    if engine.off or spec_info is not None or custom_kv_indices is not None or encoder_lens is not None:
        return False
    if cross_attention_custom_mask is not None or (multi_item_params is not None and multi_item_params.is_enabled()):
        return False
    if seq_lens_cpu is None or extend_prefix_lens_cpu is None:
        return False
    bs = len(extend_prefix_lens_cpu)
    if bs == 0 or len(seq_lens) != bs or len(seq_lens_cpu) < bs:
        return False
    wrappers = [prefill_wrappers[0]] + ([updater.prefill_wrapper_ragged] if use_ragged else [])
    return all(w is not None and not w.is_cuda_graph_enabled and "begin_forward" not in vars(w) for w in wrappers)


def prefill_update_hook(original, self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens,
                        prefill_wrappers, use_ragged, encoder_lens, spec_info, fixed_split_size=None,
                        multi_item_params=None, cross_attention_custom_mask=None, extend_prefix_lens_cpu=None,
                        custom_kv_indices=None, *, plan):
    call = partial(original, self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens,
                   prefill_wrappers, use_ragged, encoder_lens, spec_info, fixed_split_size, multi_item_params,
                   cross_attention_custom_mask, extend_prefix_lens_cpu, custom_kv_indices, plan=plan)
    engine = ENGINE
    engine.take_readback()
    if not _eligible(engine, self, seq_lens, seq_lens_cpu, prefill_wrappers, use_ragged, encoder_lens, spec_info,
                     multi_item_params, cross_attention_custom_mask, extend_prefix_lens_cpu, custom_kv_indices):
        if spec_info is None:
            engine.stats.stock += 1
        return call()
    host = engine.indptrs(self, seq_lens_cpu, extend_prefix_lens_cpu, use_ragged)
    paged = prefill_wrappers[0]
    ragged = self.prefill_wrapper_ragged if use_ragged else None
    # For this call only: an instance attribute shadows the class's begin_forward (plan).
    paged.begin_forward = partial(_paged_plan, engine, paged, paged.begin_forward, host)
    if ragged is not None:
        ragged.begin_forward = partial(_ragged_plan, engine, ragged, ragged.begin_forward, host)
    try:
        return call()
    finally:
        del paged.begin_forward
        if ragged is not None:
            del ragged.begin_forward


# What the slot relies on beyond its target (owner, attribute, source sha): call_begin_forward builds the
# extend's indptrs in SGLang's buffers and passes them to begin_forward in this order.
PINS = ((f"{FB}.FlashInferIndicesUpdaterPrefill", "call_begin_forward", "5e12b9f71b1bfd90"),)
FLASHINFER_VERSION = "0.7.2"
# Where FlashInfer 0.7.2's eager plan() keeps its uploads of the indptrs (the check reads them).
UPLOADS = {"BatchPrefillWithRaggedKVCacheWrapper": ("_qo_indptr_buf", "_kv_indptr_buf"),
           "BatchPrefillWithPagedKVCacheWrapper": ("_qo_indptr_buf", "_paged_kv_indptr_buf",
                                                   "_paged_kv_last_page_len_buf")}


def precheck() -> str | None:
    """SGLang's pinned sources; with FlashInfer installed: its version, the plan ring's fields and the upload
    buffers' names in each wrapper's plan()."""
    from importlib.util import find_spec

    from ..checks import pinned_sources

    if find_spec("flashinfer") is not None:
        import inspect
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version("flashinfer-python")
        except PackageNotFoundError:
            have = None
        if have is not None and have != FLASHINFER_VERSION:
            return f"flashinfer {have} installed; the slot reads FlashInfer {FLASHINFER_VERSION}'s plan()"
        if reason := guard.precheck():
            return reason
        import flashinfer

        for cls, fields in UPLOADS.items():
            source = inspect.getsource(getattr(flashinfer, cls).plan)
            if missing := [f for f in fields if f"self.{f} = " not in source]:
                return f"flashinfer {cls}.plan no longer sets {', '.join(missing)}"
    return pinned_sources(PINS, "what the prefill host indptr relies on")


def inert(f: ServingFacts) -> str | None:
    return not_flashinfer(f)


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (FlashInfer prefill plans from SGLang's host lengths)",
    summary="FlashInfer's prefill (extend) plans get their indptrs from SGLang's host lengths: no blocking "
            "read-back per prefill batch; not run on a GPU yet",
    default=False,
    precheck=precheck,
    inert=inert,
    targets=(
        HookTarget(f"{FB}.FlashInferIndicesUpdaterPrefill.update_single_wrapper", TargetKind.FUNCTION,
                   hook=prefill_update_hook,
                   params=("self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "prefix_lens",
                           "prefill_wrappers", "use_ragged", "encoder_lens", "spec_info", "fixed_split_size",
                           "multi_item_params", "cross_attention_custom_mask", "extend_prefix_lens_cpu",
                           "custom_kv_indices", "plan"),
                   source_sha="04fb3c4863eec4a2"),
    ),
)
