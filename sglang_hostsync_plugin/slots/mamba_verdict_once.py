"""Slot ``mamba_verdict_once``: whether the target keeps mamba-style state is decided once per model
config, not once per verify step (host work per step).

SGLang 0.5.23 calls ``commit_mamba_states_after_verify`` after every EAGLE-family and NGRAM verify
(``run_eagle_verify``, ``NGRAMWorker``, a pipeline's non-last ranks). Its first statement asks
``mambaish_config(model_runner.model_config)`` and returns at once for a target without mamba-style
state, which is every dense model. That question walks the HF config through four family checks
(``get_text_config`` and transformers' attribute lookups): 50 µs per call on the CPU box, 80-115 µs
of the scheduler thread per step in a real STANDALONE topk 1 server on the H200 (py-spy,
2026-12-04), for an answer fixed at model load. DFlash and DSpark already ask it once, at their
init (``_need_mamba_verify_commit``).

This slot asks SGLang's own ``mambaish_config`` (as ``spec_utils`` binds it) the first time it sees
a model config and keeps the answer with that config object: for a target without mamba-style
state the commit returns None without walking the config, which is what SGLang's function returns
there, having done nothing else; a hybrid target calls SGLang's function every step, as stock.
The answer is read from the config after the server is up: ``mambaish_config`` reads only the
config's class and fixed fields (the registry part is already a ``cached_property`` in SGLang).
Hook target: ``commit_mamba_states_after_verify`` (AROUND; its callers import it by name, which
SGLang's hook registry rebinds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang.srt.speculative import spec_utils

from ..checks import pinned_sources
from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_eagle_or_ngram
from .upstream_switches import HOST_PRESET

NAME = "mamba_verdict_once"
SPEC_UTILS = "sglang.srt.speculative.spec_utils"
TARGET = f"{SPEC_UTILS}.commit_mamba_states_after_verify"
TARGET_SHA = "7e91ea9825ac3883"
# The verdict is SGLang's mambaish_config; it must stay a function of the config alone.
PINS = (("sglang.srt.configs.hybrid_arch", "mambaish_config", "ab0787bde144a2d2"),)


@dataclass
class Verdicts:
    """id(model config) -> (the config, it keeps mamba-style state); the config is held so its id
    is never reused by another object."""

    by_config: dict = field(default_factory=dict)
    skipped: int = 0  # commits answered without SGLang's function


_verdicts = Verdicts()


def keeps_mamba_state(model_config) -> bool:
    entry = _verdicts.by_config.get(id(model_config))
    if entry is None or entry[0] is not model_config:
        entry = (model_config, spec_utils.mambaish_config(model_config) is not None)
        _verdicts.by_config[id(model_config)] = entry
    return entry[1]


def commit_hook(original, *args, **kwargs):
    """``commit_mamba_states_after_verify(target_worker, batch, ...)``: None at once for a target
    without mamba-style state (SGLang's own first statement, answered once per config)."""
    worker = args[0] if args else kwargs["target_worker"]
    if keeps_mamba_state(worker.model_runner.model_config):
        return original(*args, **kwargs)
    _verdicts.skipped += 1
    return None


def inert(f) -> str | None:
    return not_eagle_or_ngram(f, "only EAGLE-family and NGRAM verify commit mamba states per step "
                                 "(DFlash and DSpark ask once at init)")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE-family / NGRAM verify: mamba state commit)",
    summary="the verify's mamba-state commit asks whether the target has mamba-style state once per "
            "model config instead of every step",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, lambda: pinned_sources(PINS, "the model-config check the slot answers once")),
    inert=inert,
    targets=(
        HookTarget(TARGET, TargetKind.FUNCTION, hook=commit_hook,
                   params=("target_worker", "batch", "accept_lens", "accept_index", "draft_token_num",
                           "prepared_step_indices"),
                   source_sha=TARGET_SHA),
    ),
)
