"""What a slot is: its identity, its hook targets (as data) and its checks.

Slots describe themselves; `installer` applies them, `registry` collects them,
`report` prints them. Nothing in here touches SGLang.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


class SlotKind(str, enum.Enum):
    OWNED = "owned"  # the plugin's own code
    UPSTREAM_SWITCH = "upstream-switch"  # sets one of SGLang's own env switches
    UPSTREAM_BUILTIN = "upstream-builtin"  # verified only, never re-implemented
    TOOL = "tool"  # measurement, not an optimization


class Status(str, enum.Enum):
    """A slot's state, the one vocabulary of the doctor, the startup log and the JSON."""

    APPLIED = "applied"  # its hooks are registered and verified live
    WOULD_APPLY = "would apply"  # passed its checks; not installed (yet) in this process
    UPSTREAM = "upstream present"  # an upstream built-in whose contract check passed
    SKIPPED = "skipped"  # not selected, or inert for these server arguments
    FAILED = "failed"  # refused as a whole; the reason says why

    def __str__(self) -> str:
        return self.value


class TargetKind(str, enum.Enum):
    FUNCTION = "function"  # AROUND hook on a module function or method
    CLASS = "class"  # mixin composed into one REPLACE subclass per upstream class


@dataclass(frozen=True)
class HookTarget:
    """One place in SGLang a slot changes.

    FUNCTION: ``hook(original, *args, **kwargs)`` wraps ``path`` (AROUND).
    CLASS: ``mixin`` is composed with the other enabled slots' mixins for ``path``
    into one subclass installed with a class REPLACE hook (isinstance keeps working).
    ``params``: the parameter names the upstream callable must have (for a CLASS
    target: ``{method: params}`` for every method the mixin overrides).
    ``source_sha``: sha256 of the upstream source we were written against (first
    16 hex); a mismatch means the upstream code changed shape.
    """

    path: str
    kind: TargetKind
    hook: Callable | None = None
    mixin: type | None = None
    params: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    source_sha: str | dict[str, str] | None = None
    # FUNCTION: the hook recompiles ``original`` from source (``source_edit``), so it
    # must receive SGLang's own function; another plugin's hook inside ours refuses the slot.
    needs_upstream_original: bool = False
    # FUNCTION: a pass-through wrapper (calls ``original`` once with the same arguments and
    # returns its result; the audit's phase timers). It claims nothing, so it may share the
    # function with another slot's hook, which it wraps from outside.
    observer: bool = False
    # FUNCTION: the ``source_edit.EditSite`` this edit is a part of. The parts of one site share
    # the function (one hook, each slot's snippets while that slot is active).
    site: object | None = None

    def __post_init__(self):
        if self.kind is TargetKind.FUNCTION and self.hook is None:
            raise ValueError(f"function target {self.path} needs a hook")
        if self.kind is TargetKind.CLASS and self.mixin is None:
            raise ValueError(f"class target {self.path} needs a mixin")
        if self.observer and (self.kind is not TargetKind.FUNCTION or self.needs_upstream_original):
            raise ValueError(f"observer target {self.path} must be a plain function hook")
        if self.site is not None and not self.needs_upstream_original:
            raise ValueError(f"site target {self.path} must be a source edit (needs_upstream_original)")


@dataclass(frozen=True)
class ServingFacts:
    """What a slot may need to know about the server to tell whether it does
    anything: the resolved server arguments it depends on, and the environment."""

    speculative_algorithm: str | None = None
    dp_attention: bool = False
    two_batch_overlap: bool = False
    tp_size: int = 1
    pp_size: int = 1
    disaggregation_mode: str = "null"  # --disaggregation-mode: "null", "prefill" or "decode" (PD)
    # None: not resolved yet (the launcher reads the args before SGLang's resolution, which picks an
    # EAGLE-family topk the user left out, e.g. 4 for a Llama target, and the page size); never inert.
    topk: int | None = 1  # speculative_eagle_topk
    page_size: int | None = 1
    env: Mapping[str, str] = field(default_factory=dict)
    # (prefill, decode) attention backends as SGLang's attention_backends_of reads
    # them, and the draft's; None where not resolved yet.
    attention_backends: tuple[str | None, str | None] = (None, None)
    draft_attention_backend: str | None = None
    speculative_num_steps: int | None = None
    disable_cuda_graph: bool = False
    enable_lora: bool = False
    enable_pdmux: bool = False
    kv_cache_dtype: str = "auto"
    draft_window_size: int | None = None  # --speculative-draft-window-size
    # Without attention DP, an MoE setting under which SGLang still stages token counts per
    # ForwardBatch: --ep-size > 1, an MoE all-to-all backend, --moe-dense-tp-size, elastic EP.
    moe_counts: bool = False
    disable_overlap_schedule: bool = False
    speculative_adaptive: bool = False
    # --enable-return-routed-experts / --enable-return-indexer-topk: per-step capture outputs in the result.
    returns_capture_outputs: bool = False
    # Expert distribution recording (--expert-distribution-recorder-mode, or EPLB): per-forward host bookkeeping.
    expert_distribution: bool = False

    @classmethod
    def from_server_args(cls, server_args, env: Mapping[str, str]) -> "ServingFacts":
        from sglang.srt.server_args import resolving_view

        from sglang.srt.arg_groups.model_override_base import attention_backends_of

        view = resolving_view(server_args)
        return cls(
            speculative_algorithm=view.speculative_algorithm,
            # The same test ServerArgs.resolved_dict uses for attention DP; the launcher reads the args
            # before SGLang resolves the deprecated --enable-dp-attention --dp-size N into attn_dp_size N.
            dp_attention=view.attn_dp_size > 1 or (bool(view.enable_dp_attention) and int(view.dp_size or 1) > 1),
            two_batch_overlap=bool(view.enable_two_batch_overlap),
            tp_size=int(view.tp_size),
            pp_size=int(view.pp_size or 1),
            disaggregation_mode=str(view.disaggregation_mode or "null"),
            # The EAGLE-family tree width; other algorithms have none (SGLang puts NGRAM's BFS breadth there).
            topk=((None if view.speculative_eagle_topk is None else int(view.speculative_eagle_topk))
                  if _is_eagle_family(view.speculative_algorithm) else 1),
            page_size=None if view.page_size is None else int(view.page_size),
            env=dict(env),
            attention_backends=tuple(attention_backends_of(view)),
            draft_attention_backend=view.speculative_draft_attention_backend,
            speculative_num_steps=view.speculative_num_steps,
            disable_cuda_graph=bool(view.disable_cuda_graph),
            enable_lora=bool(view.enable_lora),
            enable_pdmux=bool(view.enable_pdmux),
            kv_cache_dtype=str(view.kv_cache_dtype or "auto"),
            draft_window_size=view.speculative_draft_window_size,
            moe_counts=(int(view.ep_size or 1) > 1 or (view.moe_a2a_backend or "none") != "none"
                        or view.moe_dense_tp_size is not None or view.elastic_ep_backend is not None),
            disable_overlap_schedule=bool(view.disable_overlap_schedule),
            speculative_adaptive=bool(view.speculative_adaptive),
            returns_capture_outputs=bool(view.enable_return_routed_experts or view.enable_return_indexer_topk),
            expert_distribution=view.expert_distribution_recorder_mode is not None or bool(view.enable_eplb),
        )

    def record(self) -> dict:
        """The server arguments these facts hold, JSON-ready (the environment left out: the
        plan's own inputs digest covers the plugin's settings)."""
        return json.loads(json.dumps({f: getattr(self, f) for f in self.__dataclass_fields__ if f != "env"}))

    def matches(self, record: Mapping) -> bool:
        """Whether a plan made for ``record`` was made for these server args. A value None on
        either side (e.g. an attention backend SGLang resolves after argument preparation)
        matches any."""
        def same(old, new):
            if old is None or new is None:
                return True
            if isinstance(old, list):
                return isinstance(new, list) and len(old) == len(new) and all(map(same, old, new))
            return old == new

        now = self.record()
        return set(record) == set(now) and all(same(record[k], now[k]) for k in record)

    def is_dspark(self) -> bool:
        return _algorithm(self.speculative_algorithm).is_dspark()

    def is_dflash(self) -> bool:
        return _algorithm(self.speculative_algorithm).is_dflash()

    def is_dflash_family(self) -> bool:
        return _algorithm(self.speculative_algorithm).is_dflash_family()

    def is_ngram(self) -> bool:
        return _algorithm(self.speculative_algorithm).is_ngram()

    def is_frozen_kv_mtp(self) -> bool:
        return _algorithm(self.speculative_algorithm).is_frozen_kv_mtp()

    def is_eagle_family(self) -> bool:
        """EAGLE, EAGLE3, NEXTN (parsed as EAGLE), FROZEN_KV_MTP and STANDALONE."""
        return _is_eagle_family(self.speculative_algorithm)


def _algorithm(name: str | None):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string(name)


def _is_eagle_family(name: str | None) -> bool:
    algo = _algorithm(name)
    return algo.is_eagle() or algo.is_standalone()


@dataclass(frozen=True)
class Slot:
    """A named optimization users switch on or off on its own."""

    name: str
    kind: SlotKind
    origin: str  # where the mechanism comes from, e.g. "sglang#47677"
    summary: str
    default: bool
    targets: tuple[HookTarget, ...] = ()
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    # (slot, why): slots that must not apply beside this one (selected, passing their checks,
    # not inert). Judged once the server facts are known (``plan.refuse_unsafe_pairs``): this
    # slot is then refused. Unlike ``conflicts`` the pair may be selected together.
    unsafe_with: tuple[tuple[str, str], ...] = ()
    # Returns None when the slot applies to the installed SGLang, else the reason
    # it must be refused (checked before any of its hooks is registered).
    precheck: Callable[[], str | None] | None = None
    # Slots shipped by other packages name their distribution here.
    provider: str = "sglang-hostsync-plugin"
    # UPSTREAM_SWITCH: the SGLang env flag (an ``envs`` field) the slot turns on.
    env_flag: str | None = None
    # Returns why the slot would do nothing under these facts ("inert because ..."),
    # or None. An inert slot is reported skipped and changes nothing.
    inert: Callable[[ServingFacts], str | None] | None = None
    # A guard: its inert reason does not hold where a selected slot that ``requires`` it applies
    # (that slot removes what made the guard unneeded: ``plan.inert_reasons``).
    kept_by_dependents: bool = False
    # Returns a warning when the user's environment undoes the slot, or None.
    env_warning: Callable[[Mapping[str, str]], str | None] | None = None
    # Named presets (besides default/all/none) that include this slot.
    presets: tuple[str, ...] = ()
    # The csrc/ kernels the slot will use under these facts: the launcher starts
    # building them in the background (``csrc.start_prebuild``) while the model loads.
    kernels: Callable[[ServingFacts], tuple[str, ...]] | None = None
    # What the slot does, where it applies, to ``FutureMap.resolve_seq_lens_cpu``'s per-step D2H and
    # synchronize (the doctor prints it under the backends' stock report); None: nothing.
    seq_lens_read: str | None = None
    # Runs in each scheduler process after its init, before the server reports
    # ready (loads those kernels, or starts loading them: csrc.load_in_background); returns a note for the log.
    prepare: Callable[[ServingFacts], str] | None = None


@dataclass(frozen=True)
class ConfigPrecheck:
    """A precheck that refuses the slot when ``check`` (reading the slot's own env
    settings) raises ValueError, e.g. HostsyncConfigError. It touches no SGLang code,
    so it also runs for a slot that is inert for the server (bad input stays an error).
    ``upstream`` (optional) checks SGLang code the slot relies on beyond its targets;
    it runs only where the slot is not inert."""

    check: Callable[[], object] | None  # None: the slot has no settings of its own
    upstream: Callable[[], str | None] | None = None

    def config(self) -> str | None:
        if self.check is None:
            return None
        try:
            self.check()
        except ValueError as exc:
            return f"bad configuration: {exc}"  # config.BAD_CONFIGURATION
        return None

    def __call__(self) -> str | None:
        return self.config() or (self.upstream() if self.upstream else None)


def config_precheck(check: Callable[[], object] | None, upstream: Callable[[], str | None] | None = None) -> ConfigPrecheck:
    return ConfigPrecheck(check, upstream)


# In an inert reason: the user's own environment turns on, in SGLang, what the slot is inert for
# because it is unsafe there. Logged as a warning and shown by the doctor.
ENV_UNSAFE = "unsafe in this environment: "


def inert_reason(slot: Slot, facts: ServingFacts | None) -> str | None:
    """Why ``slot`` would do nothing for these server facts, or None (no facts: None)."""
    return slot.inert(facts) if facts is not None and slot.inert is not None else None


def not_flashinfer(f: ServingFacts) -> str | None:
    """Inert reason of a slot whose hooks only FlashInfer's attention backend reaches: every
    backend (prefill, decode, draft) known and none FlashInfer."""
    from sglang.srt.server_args import DRAFT_ATTENTION_BACKEND_CHOICES

    backends = list(f.attention_backends)
    if f.draft_attention_backend:
        backends.append(f.draft_attention_backend)
    elif f.speculative_algorithm and any(b not in DRAFT_ATTENTION_BACKEND_CHOICES for b in backends):
        # An unnamed draft takes the target's backend, or FlashInfer where a draft does not
        # support it (resolve_draft_worker_attention_backend's CUDA fallback).
        backends.append("flashinfer")
    if None in backends or "flashinfer" in backends:
        return None
    return f"inert because the attention backends are {', '.join(sorted(set(backends)))}, not flashinfer"


def not_speculative(f: ServingFacts, wants: str, ok: bool) -> str | None:
    """The common inert reason of a slot for one speculative algorithm family."""
    return None if ok else f"inert because --speculative-algorithm is {f.speculative_algorithm or 'unset'}; {wants}"


def not_eagle_or_ngram(f: ServingFacts, wants: str) -> str | None:
    """``not_speculative`` for a slot of the EAGLE-family and NGRAM steps."""
    return not_speculative(f, wants, bool(f.speculative_algorithm) and (f.is_eagle_family() or f.is_ngram()))
