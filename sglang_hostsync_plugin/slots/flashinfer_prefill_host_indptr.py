"""Slot ``flashinfer_prefill_host_indptr`` (opt-in; GPU test passed 2026-12-08 with prefill CUDA graphs off, not yet
run with them on): FlashInfer's plans of a prefill (extend) batch get their indptrs from the host lengths SGLang
already holds, so FlashInfer's ``plan()`` no longer reads them back from the device.

SGLang 0.5.23's FlashInfer extend path (``FlashInferAttnBackend.init_forward_metadata``'s extend branch ->
``update_single_wrapper`` -> ``call_begin_forward``, ``spec_info`` None; the eager draft extend takes it too)
builds ``qo_indptr`` and ``kv_indptr`` on the device and hands them, with ``kv_last_page_len``, to the eager
wrappers' ``begin_forward`` (``plan()``), whose first lines copy them to the host (FlashInfer 0.7.2
``prefill.py``: the ragged wrapper's two indptrs, the paged wrapper's ``qo_indptr``, ``paged_kv_indptr`` and
``paged_kv_last_page_len``): five blocking reads per prefill batch, the first of which waits for everything
queued before it. Under overlap that stops the host at every new request; with ``flashinfer_device_plan``
these are the only syncs a FlashInfer EAGLE server has left.

The host holds the same lengths: the batch's ``seq_lens_cpu`` and ``extend_prefix_lens_cpu`` (SGLang sizes the
KV index list from the latter, and builds the device ones from the same lists). In such a call each eager
wrapper's ``begin_forward`` gets host indptrs built as SGLang builds the device ones
(``cumsum(seq_lens - prefix_lens)``; ``cumsum(prefix_lens)`` when SGLang planned the ragged wrapper first,
``cumsum(seq_lens)`` without it; ones), pinned where CUDA is there. FlashInfer plans from the same values; its
copies of them are then swapped back for SGLang's own device tensors, which stock's ``plan()`` keeps and the
kernels read at run: the same plan and the same kernel inputs, at the same addresses. Only wrappers whose
backend's ``run()`` reads those buffers at launch (fa2, fa3; an ``auto`` wrapper after its first plan, which
stays stock's) are covered.

Without the read nothing drains the stream between two plans of one eager wrapper, so from the slot's first
call on, every plan of the wrapper (covered or not) goes through a ring of its pinned plan buffer:
``flashinfer_plan_guard``'s ``PlanGuard``, taking a new buffer at once (a stock plan's copy may still be
queued from the old one); a wait for an earlier copy is counted. Each covered plan is checked on the stream:
FlashInfer's uploads against SGLang's device indptrs, the count copied to the host and read at a later call
without waiting. A mismatch is logged as an error and turns the slot off (that batch already ran on the host
values: the check detects, it does not prevent).

Stock's values, always, for: a decode, idle or verify batch (other wrappers), a call during a CUDA-graph capture,
a CUDA-graph wrapper, sliding-window or cross-attention dispatch, multi-item scoring, a custom or cross-attention
mask, NVFP4 dequant indices, encoder lengths, a batch without host lengths or whose host and device batch sizes
differ, and ``begin_forward`` arguments that are not SGLang's own indptr buffers.

Counted and logged at covered plans 1, 10, 100 and every 1000th (``hostsync: flashinfer_prefill_host_indptr
check: ...``). Hook target (AROUND): ``FlashInferAttnBackend.init_forward_metadata``. The eager wrappers'
``begin_forward`` is an instance attribute from the slot's first covered call on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import flashinfer_split as fs
from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, not_flashinfer
from . import flashinfer_plan_guard as guard

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "flashinfer_prefill_host_indptr"
FB = "sglang.srt.layers.attention.flashinfer_backend"
LOG_AT = (1, 10, 100)


@dataclass
class Stats:
    extends: int = 0  # extend batches covered
    plans: int = 0  # begin_forward calls that got host indptrs
    stock: int = 0  # extend batches left to stock
    unmatched: int = 0  # a covered batch's begin_forward whose arguments were not SGLang's buffers
    mismatches: int = 0  # device indptr entries that differed from the host ones (read back later)

    def line(self, host_waits: int) -> str:
        return (f"{self.plans} prefill plans from host indptrs ({self.extends} batches), {self.mismatches} "
                f"mismatches, {self.stock} stock extends, {self.unmatched} unmatched calls, {host_waits} "
                "plan-ring waits")


@dataclass
class Call:
    """One covered ``init_forward_metadata``: SGLang's buffers and the host twins of what it writes in them."""

    backend: object
    bs: int
    seq: torch.Tensor  # the host lengths (int64)
    prefix: torch.Tensor
    qo: torch.Tensor
    last: torch.Tensor
    ragged_planned: bool = False


class Engine:
    """The slot's state. ``new_event``, ``pin`` and ``capturing`` are injectable so the CPU tests run it without
    CUDA."""

    def __init__(self, new_event: Callable | None = None, pin: bool | None = None,
                 capturing: Callable[[], bool] | None = None):
        self.stats = Stats()
        self.off: str | None = None
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.capturing = capturing or (torch.cuda.is_current_stream_capturing if self.pin else (lambda: False))
        self.new_event = new_event or (lambda: torch.cuda.Event())
        self.ring = guard.PlanGuard(new_event=self.new_event, new_buffer=None if self.pin else torch.zeros_like,
                                    swap_first=True)
        self.call: Call | None = None
        self.pending: list = []  # (host copy of a check's count, event behind it)

    def host(self, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(values.numel(), dtype=like.dtype, pin_memory=self.pin).copy_(values)

    def begin(self, backend, seq_lens_cpu, prefix_cpu) -> Call:
        updater = backend.indices_updater_prefill
        bs = len(prefix_cpu)
        seq, prefix = seq_lens_cpu.to(torch.int64), torch.tensor(prefix_cpu, dtype=torch.int64)
        return Call(backend, bs, seq, prefix, self.indptr(seq - prefix, updater.qo_indptr[0]),
                    self.host(torch.ones(bs, dtype=torch.int64), updater.kv_last_page_len))

    def indptr(self, lens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(lens.numel() + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=out[1:])
        return self.host(out, like)

    def turn_off(self, why: str) -> None:
        self.off = why
        logger.error("hostsync: %s: %s; turned off for this process (stock's plan() reads the indptrs back "
                     "again)", NAME, why)

    def take_readback(self) -> None:
        while self.pending and self.pending[0][1].query():
            value, _ = self.pending.pop(0)
            if seen := int(value):
                self.stats.mismatches += seen
                self.turn_off(f"{self.stats.mismatches} device indptr entries differed from the host lengths")

    def check(self, pairs) -> None:
        """Counts the entries where (SGLang's device indptr, FlashInfer's upload of the host one) differ, on the
        stream, and queues the count's copy to the host. It never raises into the forward: a failure turns the
        slot off."""
        try:
            bad = None
            for dev, uploaded in pairs:
                if uploaded.shape != dev.shape:
                    raise ValueError(f"FlashInfer uploaded {tuple(uploaded.shape)} for {tuple(dev.shape)}")
                n = (dev != uploaded).sum()
                bad = n if bad is None else bad + n
            value = torch.empty((), dtype=torch.int64, pin_memory=self.pin)
            value.copy_(bad, non_blocking=True)
            event = self.new_event()
            event.record()
            self.pending.append((value, event))
        except Exception as exc:  # noqa: BLE001 (the check is advice; the forward goes on)
            self.turn_off(f"the check failed: {type(exc).__name__}: {exc}")

    def counted(self) -> None:
        self.stats.plans += 1
        if self.stats.plans in LOG_AT or self.stats.plans % 1000 == 0:
            logger.info("hostsync: %s check: %s", NAME, self.stats.line(self.ring.host_waits))


ENGINE = Engine()


# FlashInfer backends whose run() reads the wrapper's indptr buffers when it launches (an "auto" wrapper's first
# plan resolves its backend: it stays stock's); others (cutlass, cudnn, cute-dsl) keep what they planned from.
RUN_READS_BUFFERS = ("fa2", "fa3")


def _is(arg, buffer: torch.Tensor, length: int) -> bool:
    return (isinstance(arg, torch.Tensor) and arg.shape == (length,) and arg.dtype == buffer.dtype
            and arg.data_ptr() == buffer.data_ptr())


class EagerPlan:
    """An eager prefill wrapper's ``begin_forward`` from the slot's first covered call on: every plan goes
    through the pinned-buffer ring; in a covered call SGLang's device indptrs are swapped for the host ones."""

    __slots__ = ("engine", "wrapper", "plan", "ragged")

    def __init__(self, engine: Engine, wrapper, ragged: bool):
        self.engine, self.wrapper, self.ragged = engine, wrapper, ragged
        self.plan = wrapper.begin_forward  # FlashInfer's bound plan()

    def __call__(self, *args, **kwargs):
        engine, call, w = self.engine, self.engine.call, self.wrapper
        host = None
        if call is not None:
            try:
                sglangs = (self._ragged if self.ragged else self._paged)(call, args, kwargs)
                if self.ragged and sglangs is not None:
                    call.ragged_planned = True  # covered or not: the paged side now holds the prefix alone
                if not engine.off and w._backend in RUN_READS_BUFFERS:
                    host = sglangs
            except Exception as exc:  # noqa: BLE001 (never into the forward: this plan and the rest go stock's)
                engine.turn_off(f"deciding a plan raised {type(exc).__name__}: {exc}")
        engine.ring.before_plan(w)
        out = self.plan(*(host or args), **kwargs)
        engine.ring.after_plan(w)
        if host is not None:
            engine.counted()
            if self.ragged:
                uploads = (w._qo_indptr_buf, w._kv_indptr_buf)
                engine.check(zip((args[0], args[1]), uploads))
                # Stock's plan() keeps SGLang's own tensors (the kernels read them at run): so do we.
                w._o_indptr_buf = args[0] if w._o_indptr_buf is uploads[0] else w._o_indptr_buf
                w._v_indptr_buf = args[1] if w._v_indptr_buf is uploads[1] else w._v_indptr_buf
                w._qo_indptr_buf, w._kv_indptr_buf = args[0], args[1]
            else:
                engine.check(zip((args[0], args[1], args[3]),
                                 (w._qo_indptr_buf, w._paged_kv_indptr_buf, w._paged_kv_last_page_len_buf)))
                w._qo_indptr_buf, w._paged_kv_indptr_buf, w._paged_kv_last_page_len_buf = args[0], args[1], args[3]
        elif call is not None:
            engine.stats.unmatched += 1
        return out

    def _ragged(self, call: Call, args, kwargs):
        """The host arguments where these are SGLang's (its extend's ragged plan), else None."""
        buf = call.backend.indices_updater_prefill.qo_indptr[0]
        if len(args) < 2 or not (_is(args[0], buf, call.bs + 1) and _is(args[1], buf, call.bs + 1)):
            return None
        return (call.qo, call.qo, *args[2:])

    def _paged(self, call: Call, args, kwargs):
        u = call.backend.indices_updater_prefill
        if len(args) < 4 or call.backend.dq_page_table is not None or kwargs.get("custom_mask") is not None \
                or kwargs.get("prefix_len_ptr") is not None:
            return None
        if not (_is(args[0], u.qo_indptr[0], call.bs + 1) and _is(args[1], u.kv_indptr[0], call.bs + 1)
                and _is(args[3], u.kv_last_page_len, call.bs)):
            return None
        # call_begin_forward plans the ragged wrapper first, and only where the paged side holds the prefix alone.
        kv = self.engine.indptr(call.prefix if call.ragged_planned else call.seq, u.kv_indptr[0])
        return (call.qo, kv, args[2], call.last, *args[4:])


def _eager_wrappers(engine: Engine, backend) -> tuple | None:
    """The backend's eager prefill wrappers with the slot's ``begin_forward`` installed; None where one has a
    ``begin_forward`` of someone else's or is a CUDA-graph wrapper."""
    out = []
    for w, ragged in ((backend.prefill_wrapper_ragged, True), (backend.prefill_wrappers_paged[0], False)):
        if w is None:
            continue
        mine = vars(w).get("begin_forward")
        if w.is_cuda_graph_enabled or (mine is not None and not isinstance(mine, EagerPlan)):
            return None
        if mine is None:
            w.begin_forward = EagerPlan(engine, w, ragged)
        out.append(w)
    return tuple(out)


def _covered(engine: Engine, backend, batch) -> bool:
    mode = batch.forward_mode
    if engine.off or mode.is_decode_or_idle() or mode.is_target_verify():
        return False
    if backend.num_wrappers != 1 or backend.enable_mis or batch.encoder_lens is not None \
            or batch.cross_attention_custom_mask is not None:
        return False
    seq, prefix = batch.seq_lens_cpu, batch.extend_prefix_lens_cpu
    if seq is None or prefix is None:
        return False
    bs = len(prefix)
    return bs > 0 and len(seq) == bs and batch.seq_lens.shape == (bs,)


def init_metadata_hook(original, self, forward_batch):
    engine = ENGINE
    mode = forward_batch.forward_mode
    # A capture (SGLang's prefill graphs' warm-up paths) gets stock's call: no event query, no pinned copy in it.
    if mode.is_decode_or_idle() or mode.is_target_verify() or engine.capturing():
        return original(self, forward_batch)
    engine.take_readback()
    try:
        if _covered(engine, self, forward_batch) and _eager_wrappers(engine, self):
            engine.call = engine.begin(self, forward_batch.seq_lens_cpu, forward_batch.extend_prefix_lens_cpu)
    except Exception as exc:  # noqa: BLE001 (an upstream field gone, a pinned allocation: the batch is stock's)
        engine.turn_off(f"preparing the host indptrs raised {type(exc).__name__}: {exc}")
    if engine.call is None:
        engine.stats.stock += 1
        return original(self, forward_batch)
    engine.stats.extends += 1
    try:
        return original(self, forward_batch)
    finally:
        engine.call = None


# What the slot relies on beyond its target (owner, attribute, source sha): the extend branch's updater builds
# the indptrs in SGLang's buffers and passes them to begin_forward in this order.
PINS = ((f"{FB}.FlashInferIndicesUpdaterPrefill", "update_single_wrapper", "04fb3c4863eec4a2"),
        (f"{FB}.FlashInferIndicesUpdaterPrefill", "call_begin_forward", "5e12b9f71b1bfd90"))
# Where FlashInfer 0.7.2's eager plan() keeps its uploads of the indptrs (the check reads them).
UPLOADS = {"BatchPrefillWithRaggedKVCacheWrapper": ("_qo_indptr_buf", "_kv_indptr_buf"),
           "BatchPrefillWithPagedKVCacheWrapper": ("_qo_indptr_buf", "_paged_kv_indptr_buf",
                                                   "_paged_kv_last_page_len_buf")}


def precheck() -> str | None:
    """SGLang's pinned sources; with FlashInfer installed: its version, the plan ring's fields and the upload
    buffers' names in each wrapper's plan()."""
    from importlib.util import find_spec

    from ..checks import pinned_sources

    if have := fs.other_flashinfer():
        return f"flashinfer {have} installed; the slot reads FlashInfer {fs.FLASHINFER_VERSION}'s plan()"
    if find_spec("flashinfer") is not None:
        import inspect

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
            "read-back per prefill batch; its GPU test has not passed yet",
    default=False,
    precheck=precheck,
    inert=inert,
    targets=(
        HookTarget(f"{FB}.FlashInferAttnBackend.init_forward_metadata", TargetKind.FUNCTION,
                   hook=init_metadata_hook, params=("self", "forward_batch"), source_sha="b2f820ab062b8f90"),
    ),
)
