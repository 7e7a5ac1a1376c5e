"""Slot ``triton_replay_launch``: the plugin's own Triton wrappers launch through SGLang's
signature-cached replay (``replay_launches``) instead of Triton's JIT dispatch.

Each owned slot that replaces an op soup with one Triton launch pays Triton's per-call JIT
dispatch (argument binding, specialization key, cache lookup) on the host: on the H200 host
``greedy_row_argmax``'s launch took 58-83 µs against 26-40 µs for the ``torch.argmax`` it
replaces. SGLang 0.5.23 ships the remedy for its own small kernels:
``sglang.kernels.ops.diffusion.common.fast_launch.replay_launches`` runs a wrapper normally the
first time it sees an operand signature (shapes, strides, dtypes, devices, 16-byte alignment,
scalars), records its Triton launches, and later relaunches the recorded compiled kernels on
the new tensors: the same kernels, grids and arguments, so results are bit-identical. What it
cannot replay (a wrapper that runs other aten ops, reads tensor values, launches on
temporaries) keeps the normal path for that signature; under ``TRITON_INTERPRET`` nothing is
recorded.

The wrappers (``greedy_row_argmax.row_argmax``, ``fused_tree_compact.compact_plain`` / ``compact_hidden``,
``fused_draft_page_locs``' launch, ``fused_relay_stash.stash_rows``, ``eagle_fixed_shape_tail``'s
Triton implementation) are declared with ``replayed``; while this slot is applied each goes
through SGLang's ``replay_launches``, otherwise it is called directly. ``SGLANG_DIFFUSION_TRITON_FAST_LAUNCH=0``
(SGLang's kill switch) turns the replay off and is reported as undoing the slot. No SGLang
function is hooked; ``prepare`` switches the wrappers in each scheduler process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..slot import Slot, SlotKind, config_precheck, not_eagle_or_ngram
from .upstream_switches import HOST_PRESET

NAME = "triton_replay_launch"
FAST_LAUNCH = "sglang.kernels.ops.diffusion.common.fast_launch"
ENV_OFF = "SGLANG_DIFFUSION_TRITON_FAST_LAUNCH"
# The replay contract read from SGLang 0.5.23: what is recorded, keyed and relaunched.
PINS = (
    (FAST_LAUNCH, "replay_launches", "9e81d629a939f7fd"),
    (FAST_LAUNCH, "_signature", "b16673096fc6b35c"),
    (FAST_LAUNCH, "_record", "3f97c69dcbf7be2e"),
    (FAST_LAUNCH, "_plan", "e9be14c46dd69936"),
    (FAST_LAUNCH, "_Plan", "ebddb5775845b71b"),
)


@dataclass
class Wrappers:
    """Every ``replayed`` wrapper of the plugin, and whether this process replays them."""

    on: bool = False
    fns: list = field(default_factory=list)  # (wrapper, plain function)
    replays: dict = field(default_factory=dict)  # plain function -> SGLang's replay_launches(fn)


_wrappers = Wrappers()


def replayed(fn: Callable) -> Callable:
    """Declare ``fn`` (Triton launches over its tensor inputs and the ``torch.empty*`` outputs it
    returns) a wrapper this slot may replay."""
    w = _wrappers

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if w.on:
            return w.replays[fn](*args, **kwargs)
        return fn(*args, **kwargs)

    w.fns.append((wrapper, fn))
    return wrapper


_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_PROMOTED = {(a, b): torch.promote_types(a, b) for a in _INTEGERS for b in _INTEGERS}


def promote(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """``torch.promote_types(a, b)``; for integer dtypes from a table, without the aten op it dispatches
    (SGLang's recording refuses a wrapper that runs one; per call it is also the cheaper lookup)."""
    out = _PROMOTED.get((a, b))
    return torch.promote_types(a, b) if out is None else out


def switch_on() -> int:
    """Route every declared wrapper through SGLang's ``replay_launches``; returns their number."""
    from sglang.kernels.ops.diffusion.common.fast_launch import replay_launches

    w = _wrappers
    for _, fn in w.fns:
        if fn not in w.replays:
            w.replays[fn] = replay_launches(fn)
    w.on = True
    return len(w.fns)


def switch_off() -> None:
    _wrappers.on = False


def pinned_sources() -> str | None:
    from ..checks import pinned_sources as check_pins

    return check_pins(PINS, "the replay contract")


def inert(f) -> str | None:
    return not_eagle_or_ngram(f, "the plugin's Triton kernels run only in EAGLE-family and NGRAM steps")


def env_warning(env: Mapping[str, str]) -> str | None:
    raw = (env.get(ENV_OFF) or "").strip().lower()
    if raw in {"0", "false", "off", "no"}:
        return f"{ENV_OFF}={raw} turns SGLang's replay_launches off: the plugin's Triton wrappers launch through the JIT"
    return None


def prepare(facts) -> str:
    return f"{switch_on()} Triton wrappers replay their launches per operand signature"


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 replay_launches (fast_launch), applied to the plugin's Triton wrappers",
    summary="the plugin's Triton wrappers relaunch recorded compiled kernels per operand signature (no JIT dispatch)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, pinned_sources),
    inert=inert,
    env_warning=env_warning,
    prepare=prepare,
)
