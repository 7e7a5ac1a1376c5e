"""How an upstream-switch slot turns on SGLang's own env flag.

The flag is set in the launcher (``prepare_server_args``) before any process is
spawned, and again in every SGLang process where the plugin is active (the
launcher's ``_set_envs_and_config``, which an embedded Engine calls too, and
``Scheduler.__init__`` in scheduler/TP processes) before the worker constructors
read it. A user's explicit contrary value is an error that
names both; it is never overridden. A slot that would do nothing under the
server's arguments is reported "inert because ..." and sets nothing. A launcher that resolves
a second plan (a second Engine) first unsets the flags its earlier plan turned on (``clear_own``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from .config import HostsyncConfigError
from .slot import Slot, SlotKind


def env_field(name: str):
    """SGLang's declaration of env flag ``name`` (an ``EnvField``), or None."""
    from sglang.srt.environ import Envs

    return vars(Envs).get(name)


def env_value(name: str, env: Mapping[str, str]):
    """What SGLang's ``envs.<name>.get()`` would return under ``env``."""
    field = env_field(name)
    raw = env.get(name)
    if raw is None:
        return field.default() if callable(field.default) else field.default
    return field.parse(raw)


def flag_precheck(name: str) -> str | None:
    """The flag exists in the installed SGLang as a boolean that defaults to off."""
    from sglang.srt.environ import EnvBool

    field = env_field(name)
    if field is None:
        return f"target missing: envs.{name} is not declared in sglang.srt.environ"
    if not isinstance(field, EnvBool):
        return f"upstream shape changed: envs.{name} is a {type(field).__name__}, not an EnvBool"
    if field.default is not False:
        return f"upstream shape changed: envs.{name} now defaults to {field.default!r}"
    return None


def switch_slots(slots: Iterable[Slot]) -> list[Slot]:
    return [s for s in slots if s.kind is SlotKind.UPSTREAM_SWITCH]


def check_contrary_env(slots: Iterable[Slot], env: Mapping[str, str]) -> None:
    """Raise when the user's environment sets a selected switch's flag against it."""
    problems = []
    for slot in switch_slots(slots):
        raw = env.get(slot.env_flag)
        if raw is None:
            continue
        try:
            on = env_field(slot.env_flag).parse(raw)
        except ValueError:
            on = None
        if on is not True:
            problems.append(
                f"{slot.env_flag}={raw!r} is set in the environment while slot "
                f"{slot.name!r} (which sets {slot.env_flag}=1) is selected"
            )
    if problems:
        raise HostsyncConfigError(
            "; ".join(problems) + ". Unset the variable or deselect the slot "
            "(SGLANG_HOSTSYNC_SLOTS=...,-name)."
        )


_set_here: set[str] = set()  # flags this process turned on that the user had not set to "1"


def apply(slots: Iterable[Slot]) -> list[str]:
    """Set the flag of every switch slot in ``slots`` (the plan's applicable ones,
    inert ones already skipped); returns the flags set."""
    flags = []
    for slot in switch_slots(slots):
        if os.environ.get(slot.env_flag) != "1":
            _set_here.add(slot.env_flag)
        os.environ[slot.env_flag] = "1"
        flags.append(slot.env_flag)
    return flags


def user_env() -> dict[str, str]:
    """This environment without the flags this process turned on itself."""
    return {k: v for k, v in os.environ.items() if k not in _set_here}


def clear_own() -> list[str]:
    """Unset the flags an earlier plan of this process turned on (a launcher that starts a
    second Engine resolves its plan again: a switch inert for those args must be off)."""
    cleared = sorted(f for f in _set_here if os.environ.get(f) == "1")
    for flag in cleared:
        del os.environ[flag]
    _set_here.clear()
    return cleared
