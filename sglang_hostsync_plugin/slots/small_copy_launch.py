"""Slot ``small_copy_launch``: SGLang's ``try_small_copy`` with its checks and its Triton launch
worked out once per operand signature.

Every CUDA-graph replay of SGLang 0.5.23 copies the step's inputs into the graph's static buffers
through ``_grouped_foreach_copy_``, which first tries ``try_small_copy`` (kernels/ops/memory/
small_copy.py): up to 8192 elements per pair, all pairs in one Triton launch. That function pays,
on every call, a Python check of each (dst, src) pair (dtype, device, shape, strides, grad, neg
bit, the address ranges of every pair against every other) and Triton's JIT dispatch over tuples
of tensors. In a real EAGLE v2 server (STANDALONE topk 4, H200, py-spy) it took about 370 µs of
host time per step over its 4-6 calls, more than half of it the checks.

Everything it decides except the address overlaps is fixed by the pairs' dtypes, devices,
shapes, strides, grad and neg flags and 16-byte alignments (what Triton specializes the kernel
on). This slot keys on exactly that. For a new key it runs the same checks once (restated from
the pinned source) and, at the first call that passes them, calls SGLang's own ``try_small_copy``
while capturing its launch (kernel, grid, arguments). Later calls of the key compare the address
ranges (from the cached extents; an address tuple that passed before, up to ``MAX_CLEAR`` per key,
is not compared again: the verdict depends on nothing else) and launch the captured compiled kernel
on the new tensors: the same kernel, grid and arguments, so the copies are bit-identical, and
the result (True, or False for ``_grouped_foreach_copy_`` to fall back) is stock's.

It calls SGLang's function for anything else: a non-tensor operand, a key whose capture saw no
single launch, a compiled kernel whose fields it cannot read, or a result other than stock's
prediction (logged once), a launch hook installed
(a profiler such as proton; SGLang's ``fast_launch`` makes the same exception), and new keys past
``MAX_PLANS``. Another current device captures the key again.
Hook target: ``try_small_copy`` (AROUND; ``_grouped_foreach_copy_`` and the buffer registry
import it at call time).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch
from sglang.kernels.ops.diffusion.common.fast_launch import _launch_hooked
from sglang.kernels.ops.memory import small_copy
from triton.runtime import driver

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck
from .upstream_switches import HOST_PRESET

NAME = "small_copy_launch"
SMALL_COPY = "sglang.kernels.ops.memory.small_copy"
TARGET = f"{SMALL_COPY}.try_small_copy"
TARGET_SHA = "385ba53a1b7596fc"
FAST_LAUNCH = "sglang.kernels.ops.diffusion.common.fast_launch"
# The kernel whose launch is replayed, and SGLang's launch-hook test the replay defers to.
PINS = (
    (SMALL_COPY, "_small_copy_kernel", "de2e97f397b6c394"),
    (FAST_LAUNCH, "_launch_hooked", "9649f4e58b9fe580"),
)
# try_small_copy's own constants (pinned with its source).
MAX_NUMEL = 8192
SUPPORTED = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_CAST = (torch.int32, torch.int64)
MAX_PLANS = 4096  # operand signatures kept; later new ones call SGLang's function
MAX_CLEAR = 64  # address tuples remembered as checked per signature; later ones are checked per call
_ON_DEVICE = ("cuda",)  # stock copies CUDA tensors only (the CPU tests widen this)


def _current_device() -> int:
    return torch.accelerator.current_device_index()


def _stream(device: int):
    return driver.active.get_current_stream(device)


@dataclass
class Plan:
    """One operand signature that passes the checks: per pair the byte extents of dst and src and
    whether a dst may alias its own src, and the captured launch."""

    extents: tuple  # ((dst bytes, src bytes), ...)
    alias_ok: tuple  # same stride and dtype: stock allows dst_i and src_i at the same address
    largest: int
    device: int | None = None
    launch: tuple | None = None  # (run, function, metadata, grid, constant values)
    stock: bool = False  # the capture disagreed: this key always calls SGLang's function
    # Address tuples (dsts, then srcs) whose checks passed: the verdict depends on nothing else, and
    # the runners' static buffers and the allocator's reused blocks make most steps repeat one.
    clear: set = field(default_factory=set)


REJECT = object()  # the checks fail for every call of this key: stock returns False


@dataclass
class State:
    plans: dict
    hits: int = 0
    captures: int = 0
    warned: bool = False


logger = logging.getLogger("sglang.srt.plugins.hostsync")
_state = State(plans={})
_capture_lock = threading.Lock()


def addresses(tensors) -> tuple:
    return tuple([t.data_ptr() for t in tensors])


def key_of(dsts, srcs, dptrs: tuple | None = None, sptrs: tuple | None = None) -> tuple:
    """Everything try_small_copy's checks and the kernel's specialization read, but the addresses
    (only their 16-byte alignment); ``dptrs`` / ``sptrs``: the tensors' addresses, if read already."""
    dptrs = addresses(dsts) if dptrs is None else dptrs
    sptrs = addresses(srcs) if sptrs is None else sptrs
    return tuple(
        (d.dtype, s.dtype, d.device, s.device, d.shape, s.shape, d.stride(), s.stride(), d.requires_grad,
         s.requires_grad, d.is_neg(), s.is_neg(), dp % 16 == 0, sp % 16 == 0)
        for d, s, dp, sp in zip(dsts, srcs, dptrs, sptrs)
    )


def _extent(shape, stride, element_size: int, n: int) -> int:
    return (sum((d - 1) * s for d, s in zip(shape, stride)) + 1) * element_size if n else 0


def plan_of(key: tuple):
    """try_small_copy's checks that do not read addresses, restated: ``REJECT`` or a ``Plan``."""
    device = key[0][2]
    if device.type not in _ON_DEVICE:
        return REJECT
    extents, alias_ok, sizes = [], [], []
    for ddt, sdt, ddev, sdev, dshape, sshape, dstride, sstride, dgrad, sgrad, dneg, sneg, _, _ in key:
        if (ddt not in SUPPORTED or sdt not in SUPPORTED or ddev != device or sdev != device or dshape != sshape
                or len(dshape) not in (1, 2) or dshape.numel() > MAX_NUMEL or dgrad or sgrad or sneg or dneg):
            return REJECT
        if ddt != sdt and not (ddt in _INT_CAST and sdt in _INT_CAST):
            return REJECT
        n = dshape.numel()
        c = max(dshape[-1], 1)
        ds = dstride if len(dshape) == 2 else (0, dstride[0])
        if ds[1] <= 0 or (len(dshape) == 2 and ds[0] < c * ds[1]):
            return REJECT
        sizes.append(n)
        extents.append((_extent(dshape, dstride, ddt.itemsize, n), _extent(sshape, sstride, sdt.itemsize, n)))
        alias_ok.append(dstride == sstride and ddt == sdt)
    return Plan(extents=tuple(extents), alias_ok=tuple(alias_ok), largest=max(sizes))


def overlaps(plan: Plan, dptrs: tuple, sptrs: tuple) -> bool:
    """try_small_copy's address checks, restated on the pairs' addresses: a dst overlapping any src
    (but its own at the same address with the same layout) or an earlier dst."""
    dr = [(p, p + e) for p, (e, _) in zip(dptrs, plan.extents)]
    sr = [(p, p + e) for p, (_, e) in zip(sptrs, plan.extents)]
    for i, (first, last) in enumerate(dr):
        for j, (other_first, other_last) in enumerate(sr):
            if first < other_last and other_first < last:
                if i != j or first != other_first or not plan.alias_ok[i]:
                    return True
        for other_first, other_last in dr[:i]:
            if first < other_last and other_first < last:
                return True
    return False


def _capture(original, plan: Plan, dsts, srcs) -> bool:
    """SGLang's try_small_copy, its Triton launch recorded into ``plan``."""
    kernel = small_copy._small_copy_kernel
    if not _capture_lock.acquire(blocking=False):
        return original(dsts, srcs)
    launches, thread, jit_run = [], threading.get_ident(), kernel.run

    def run(*args, grid, warmup, **kwargs):
        compiled = jit_run(*args, grid=grid, warmup=warmup, **kwargs)
        if not warmup and threading.get_ident() == thread:
            launches.append((compiled, grid, args, kwargs))
        return compiled

    kernel.run = run  # this kernel object only, for this call
    try:
        result = original(dsts, srcs)
    finally:
        del kernel.run
        _capture_lock.release()
    _state.captures += 1
    try:
        plan.launch = _launch_of(kernel, launches, plan) if result is True else None
    except (AttributeError, TypeError, IndexError):  # Triton's compiled-kernel API moved (as SGLang's replay guards)
        plan.launch = None
    plan.stock = result is not True or (plan.largest > 0 and plan.launch is None)
    if plan.stock and not _state.warned:
        _state.warned = True
        logger.warning("hostsync: %s: a copy signature keeps SGLang's try_small_copy (it returned %s, %d launches "
                       "captured)", NAME, result, len(launches))
    plan.device = _current_device()
    return result


def _launch_of(kernel, launches: list, plan: Plan):
    if plan.largest == 0:
        return None if launches else ()
    if len(launches) != 1:
        return None
    compiled, grid, args, kwargs = launches[0]
    names = kernel.arg_names
    values = list(args) + [kwargs[n] if n in kwargs else kernel.params[i].default
                           for i, n in enumerate(names[len(args):], start=len(args))]
    # The launcher takes every parameter, constexprs included (Triton >= 3.3), as SGLang's replay checks.
    if len(compiled.src.signature) != len(values) or names[:2] != ["sources", "destinations"]:
        return None
    grid = tuple(grid) + (1,) * (3 - len(grid))
    return compiled.run, compiled.function, compiled.packed_metadata, grid, tuple(values[2:])


def small_copy_hook(original, dsts, srcs):
    """``try_small_copy(dsts, srcs)``: the same result and copies, the checks and launch cached."""
    if len(dsts) < 2 or len(dsts) != len(srcs):
        return False
    try:
        dptrs, sptrs = addresses(dsts), addresses(srcs)
        key = key_of(dsts, srcs, dptrs, sptrs)
    except (AttributeError, TypeError):  # not tensors: SGLang's function says what it says
        return original(dsts, srcs)
    plan = _state.plans.get(key)
    if plan is None:
        if len(_state.plans) >= MAX_PLANS:
            return original(dsts, srcs)
        plan = _state.plans[key] = plan_of(key)
    if plan is REJECT:
        return False
    if plan.stock:
        return original(dsts, srcs)
    ptrs = dptrs + sptrs
    if ptrs not in plan.clear:
        if overlaps(plan, dptrs, sptrs):
            return False
        if len(plan.clear) < MAX_CLEAR:
            plan.clear.add(ptrs)
    if plan.launch is None or plan.device != _current_device():
        return _capture(original, plan, dsts, srcs)
    if plan.launch:
        if _launch_hooked():
            return original(dsts, srcs)
        run, function, metadata, grid, constants = plan.launch
        run(*grid, _stream(plan.device), function, metadata, None, None, None,
            tuple(srcs), tuple(dsts), *constants)
    _state.hits += 1
    return True


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the kernel launch the slot replays")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (CUDA-graph input copies of every graph runner)",
    summary="try_small_copy's checks and Triton launch worked out once per operand signature, then replayed",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, pinned_sources),
    targets=(
        HookTarget(TARGET, TargetKind.FUNCTION, hook=small_copy_hook, params=("dsts", "srcs"),
                   source_sha=TARGET_SHA),
    ),
)
