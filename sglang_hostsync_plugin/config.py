"""Environment switches and the ``SGLANG_HOSTSYNC_SLOTS`` grammar.

Everything the plugin reads from the environment is named here. The launcher turns
``--enable-hostsync-plugin`` into ``SGLANG_ENABLE_HOSTSYNC_PLUGIN=1`` so every
spawned SGLang process (scheduler, TP/DP workers) sees the same configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import choice
from .slot import Slot

ENV_ENABLE = "SGLANG_ENABLE_HOSTSYNC_PLUGIN"
ENV_SLOTS = "SGLANG_HOSTSYNC_SLOTS"
# 1 (default): a slot that cannot be applied stops startup. 0: it is reported and
# disabled as a whole, and the server starts without it.
ENV_STRICT = "SGLANG_HOSTSYNC_STRICT"
# 1: run on an SGLang other than the pinned one (warning + per-slot shape checks).
ENV_ALLOW_UNSUPPORTED = "SGLANG_HOSTSYNC_ALLOW_UNSUPPORTED_SGLANG"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class HostsyncConfigError(ValueError):
    """Bad plugin configuration; raised before any model is loaded."""


BAD_CONFIGURATION = "bad configuration: "  # how a slot's precheck reports its own bad env value


def env_bool(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or not raw.strip():  # empty means unset (``VAR=`` must not flip a default)
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise HostsyncConfigError(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off."
    )


def env_count(name: str, default: int, env: Mapping[str, str] | None = None, *, minimum: int = 1,
              hint: str = "use a positive number of steps") -> int:
    """An integer setting of at least ``minimum``; anything else raises with ``hint``."""
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise HostsyncConfigError(f"{name}={raw!r}: {hint}")
    return value


def plugin_enabled(env: Mapping[str, str] | None = None) -> bool:
    return env_bool(ENV_ENABLE, False, env)


def strict_mode(env: Mapping[str, str] | None = None) -> bool:
    return env_bool(ENV_STRICT, True, env)


@dataclass(frozen=True)
class Selection:
    """The resolved slot set, in catalogue order."""

    spec: str
    names: tuple[str, ...]
    # ``auto`` named: ``names`` is every slot the automatic choice may pick; the plan narrows it
    # to the pick once the server facts decide (``choice.pick``).
    auto: bool = False


def _all_without_conflicts(catalogue: Mapping[str, Slot]) -> set[str]:
    """Every slot, except the later-declared one of each conflicting pair, ``unsafe_with``
    pairs included (so ``all`` is always a valid selection; name the other one to get it
    instead)."""

    def against(slot: Slot) -> set[str]:
        return set(slot.conflicts) | {other for other, _ in slot.unsafe_with}

    chosen: list[str] = []
    for name, slot in catalogue.items():
        clash = against(slot) | {n for n in chosen if name in against(catalogue[n])}
        if not clash & set(chosen):
            chosen.append(name)
    return set(chosen)


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_slot_spec(spec: str, catalogue: Mapping[str, Slot]) -> Selection:
    """Resolve ``SGLANG_HOSTSYNC_SLOTS``.

    Comma list of presets (``default``, ``all``, ``none``, ``auto`` (``choice``), and any a slot declares,
    e.g. ``dspark_mega``) and slot names; ``-x`` removes preset or slot ``x``. The result does not depend on token order:
    everything named is added, then everything negated is removed. With no positive
    token the base is ``default`` (so ``-event_ring`` means ``default,-event_ring``).
    The variable unset, empty or blank is ``auto`` (``selected_slots``).
    A selected slot whose required slot is not selected, or two selected slots
    that conflict, is an error; nothing is enabled behind the user's back.

    Raises:
        HostsyncConfigError: an unknown token, an empty entry (``default,``, ``a,,-b``, a
            blank one between commas), a missing required slot or a conflict; the message names it.
    """
    order = list(catalogue)
    presets = {
        "default": {n for n, s in catalogue.items() if s.default},
        "all": _all_without_conflicts(catalogue),
        "none": set(),
    }
    for slot_name, slot in catalogue.items():
        for preset in slot.presets:
            presets.setdefault(preset, set()).add(slot_name)
    auto = choice.is_auto(spec)
    if auto:
        presets[choice.AUTO] = choice.row_names(catalogue, parse_slot_spec)
    valid = f"Presets: {', '.join({choice.AUTO: None, **presets})}. Slots: {', '.join(order)}."
    added: set[str] = set()
    removed: set[str] = set()
    positive = False
    # An empty (or blank) value means unset, as for every switch; an empty entry in a list is
    # an error like an unknown token (``default,`` or ``a,,-b``: a stray comma, or a name lost).
    entries = spec.split(",") if spec.strip() else []
    for index, raw in enumerate(entries, 1):
        token = raw.strip().lower()
        if not token:
            raise HostsyncConfigError(
                f"{ENV_SLOTS}={_shown(spec.strip())!r}: entry {index} of {len(entries)} is empty "
                f"(a stray comma?). Remove it; an empty {ENV_SLOTS} means 'auto'. {valid}"
            )
        negate = token.startswith("-")
        # Slot names are snake_case; accept kebab-case like SGLANG_SPEC_TP_SYNC does.
        name = (token[1:] if negate else token).strip().replace("-", "_")
        if name in presets:
            members = presets[name]
        elif name in catalogue:
            members = {name}
        else:
            raise HostsyncConfigError(f"{ENV_SLOTS}: unknown token {_shown(raw.strip())!r}. {valid}")
        if negate:
            removed |= members
        else:
            positive = True
            added |= members
    if not positive:
        added = set(presets["default"])
    chosen = added - removed
    for name in sorted(chosen, key=order.index):
        slot = catalogue[name]
        for dep in slot.requires:
            if dep not in chosen and not auto:  # auto: checked on its pick (plan.left_out)
                raise HostsyncConfigError(
                    f"{ENV_SLOTS}: slot {name!r} requires slot {dep!r}, which is not "
                    f"selected. Add {dep!r} or remove {name!r}."
                )
        for other in slot.conflicts:
            if other in chosen and not auto:  # no pick holds both (tests/test_choice.py)
                raise HostsyncConfigError(
                    f"{ENV_SLOTS}: slots {name!r} and {other!r} conflict; select one "
                    f"(add '-{name}' or '-{other}' to {spec.strip()!r})."
                )
    return Selection(spec=spec, names=tuple(n for n in order if n in chosen), auto=auto)


def selected_slots(
    catalogue: Mapping[str, Slot], env: Mapping[str, str] | None = None
) -> Selection:
    env = os.environ if env is None else env
    raw = env.get(ENV_SLOTS, "")
    # Unset, empty and blank alike are "auto" (and read so in the status line and the doctor's hints):
    # the measured set for the server's configuration class, ``default`` where none was measured.
    return parse_slot_spec(raw if raw.strip() else choice.AUTO, catalogue)
