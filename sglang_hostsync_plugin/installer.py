"""The one installer: registers and verifies every slot's hook targets.

Flow per process: ``install()`` (from ``register()``, while SGLang's
``load_plugins()`` runs) registers, with SGLang's HookRegistry, the hooks of the
slots the plan found applicable (``plan.resolve`` checked them on the upstream
objects). ``verify()`` (after ``load_plugins()`` applied them) checks that each one
is really in place. A slot that fails is marked failed and switched off as a whole
through its gate, so it is never half-applied; in strict mode the caller stops
startup.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from .checks import overridden_methods, resolve, source_sha
from .plan import Plan, Verdict
from .slot import Slot, Status, TargetKind

logger = logging.getLogger("sglang.srt.plugins.hostsync")


@dataclass
class InstallState:
    """What this process installed, and each slot's status (the plan's verdicts,
    then the outcome of installing them here)."""

    statuses: dict[str, Verdict] = field(default_factory=dict)
    # target path -> (hook object registered, slot names behind it)
    registered: dict[str, tuple[object, tuple[str, ...]]] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    verified: bool = False

    def set(self, name: str, status: Status, reason: str = "") -> None:
        old = self.statuses.get(name)
        self.statuses[name] = Verdict(name, old.selected if old else True, status, reason)
        if status not in (Status.APPLIED, Status.WOULD_APPLY):
            self.active.discard(name)

    def fail(self, name: str, reason: str) -> None:
        self.set(name, Status.FAILED, reason)

    def applied(self) -> tuple[str, ...]:
        return tuple(n for n, s in self.statuses.items() if s.status is Status.APPLIED)

    def failed(self) -> list[Verdict]:
        return [s for s in self.statuses.values() if s.status is Status.FAILED]


def _gate_function(state: InstallState, slot: str, hook: Callable) -> Callable:
    def gated(original, *args, **kwargs):
        if slot in state.active:
            return hook(original, *args, **kwargs)
        return original(*args, **kwargs)

    gated.__qualname__ = f"hostsync[{slot}].{getattr(hook, '__name__', 'hook')}"
    gated.hostsync_hook = hook
    return gated


def _nest(outer: Callable, inner: Callable) -> Callable:
    def nested(original, *args, **kwargs):
        return outer(lambda *a, **k: inner(original, *a, **k), *args, **kwargs)

    nested.__qualname__ = f"{outer.__qualname__}({inner.__qualname__})"
    return nested


def _exclusive(state: InstallState, claiming: list) -> Callable:
    """Claimants of one function from different ``auto`` picks (a plan made before the facts chose one,
    ``plan.claim_conflicts``): the first active one runs, alone; the pick leaves one active."""
    def exclusive(original, *args, **kwargs):
        for p in claiming:
            if p.slot in state.active:
                return p.hook(original, *args, **kwargs)
        return original(*args, **kwargs)

    exclusive.__qualname__ = "hostsync[" + "|".join(p.slot for p in claiming) + "].exclusive"
    return exclusive


class Part(NamedTuple):
    """One enabled slot's hook on a function."""

    slot: str
    hook: Callable
    observer: bool
    site: object | None = None  # the source_edit.EditSite the hook is a part of


def compose_function(state: InstallState, parts: list[tuple]) -> Callable:
    """One AROUND hook for a function from every enabled slot's ``Part``: the claiming hook (at
    most one, the parts of one edit site, or plain hooks of different ``auto`` picks run one at a
    time: the plan refuses anything else) innermost, observers around it, each behind its slot's
    gate. One registration per function, so SGLang sees no hook stacking."""
    ordered = sorted((Part(*p) for p in parts), key=lambda p: p.observer)  # stable: claiming first
    sites = {p.site for p in ordered if not p.observer and p.site is not None}
    claiming = [p for p in ordered if not p.observer]
    rest = [p for p in ordered if p.observer]
    if sites:
        (site,) = sites
        hook = site.hook(lambda slot: slot in state.active)  # each part behind its own slot's state
    elif len(claiming) > 1:
        hook = _exclusive(state, claiming)
    else:
        hook = _gate_function(state, ordered[0].slot, ordered[0].hook)
        rest = ordered[1:]
    for p in rest:
        hook = _nest(_gate_function(state, p.slot, p.hook), hook)
    return hook


def _gate_method(state: InstallState, slot: str, impl: Callable, fallback: Callable) -> Callable:
    def gated(self, *args, **kwargs):
        if slot in state.active:
            return impl(self, *args, **kwargs)
        return fallback(self, *args, **kwargs)

    gated.__name__ = impl.__name__
    gated.__qualname__ = f"hostsync[{slot}].{impl.__qualname__}"
    return gated


def compose_class(state: InstallState, base: type, parts: list[tuple[str, type]]) -> type:
    """One replacement subclass of ``base`` from every enabled slot's mixin."""
    owner: dict[str, str] = {}
    namespace: dict[str, object] = {"__module__": base.__module__, "__qualname__": base.__qualname__}
    for slot, mixin in parts:
        for method in overridden_methods(mixin):
            if method in owner:
                raise RuntimeError(
                    f"slots {owner[method]!r} and {slot!r} both override "
                    f"{base.__name__}.{method}; declare them as conflicting"
                )
            owner[method] = slot
            namespace[method] = _gate_method(
                state, slot, vars(mixin)[method], inspect.getattr_static(base, method)
            )
    bases = tuple(m for _, m in parts) + (base,)
    cls = type(f"Hostsync{base.__name__}", bases, namespace)
    cls.hostsync_slots = tuple(s for s, _ in parts)
    return cls


def install(
    state: InstallState,
    plan: Plan,
    catalogue: Mapping[str, Slot],
    register: Callable[[str, object, str], None],
) -> None:
    """Register the hooks of the selected slots the plan found applicable; every
    other slot keeps its verdict (not selected: skipped).

    ``register(path, hook, kind)`` is the HookRegistry call ("around" / "replace").
    """
    by_class: dict[str, list[tuple[str, type]]] = {}
    functions: dict[str, list[Part]] = {}
    for verdict in plan.verdicts:
        if not verdict.selected:
            state.statuses[verdict.name] = dataclasses.replace(verdict, status=Status.SKIPPED, reason="not selected")
            continue
        state.statuses[verdict.name] = verdict
        if verdict.status is not Status.WOULD_APPLY:
            continue
        state.active.add(verdict.name)
        for target in catalogue[verdict.name].targets:
            if target.kind is TargetKind.CLASS:
                by_class.setdefault(target.path, []).append((verdict.name, target.mixin))
            else:
                functions.setdefault(target.path, []).append(Part(verdict.name, target.hook, target.observer, target.site))
    for path, parts in functions.items():
        hook = compose_function(state, parts)
        register(path, hook, "around")
        state.registered[path] = (hook, tuple(p.slot for p in parts))
    for path, parts in by_class.items():
        cls = compose_class(state, resolve(path), parts)
        register(path, cls, "replace")
        state.registered[path] = (cls, tuple(s for s, _ in parts))


def hook_in_place(path: str, hook: object) -> bool:
    """True when the live object at ``path`` is, or wraps, ``hook``."""
    try:
        live = resolve(path)
    except (ImportError, AttributeError, ValueError):
        return False
    if isinstance(hook, type):
        return isinstance(live, type) and issubclass(live, hook)
    for _ in range(64):
        if live is None:
            return False
        if live is hook or any(_cell(c) is hook for c in getattr(live, "__closure__", None) or ()):
            return True
        live = getattr(live, "__wrapped__", None)
    return False


def _inner_original(path: str, hook: object):
    """What HookRegistry hands ``hook`` as ``original`` at ``path`` (the function its
    wrapper wraps), or None when the hook is not found in the live chain."""
    try:
        live = resolve(path)
    except (ImportError, AttributeError, ValueError):
        return None
    for _ in range(64):
        if live is None:
            return None
        if any(_cell(c) is hook for c in getattr(live, "__closure__", None) or ()):
            return getattr(live, "__wrapped__", None)
        live = getattr(live, "__wrapped__", None)
    return None


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def foreign_wrapper(path: str, hook: object, sha: str | None) -> str | None:
    """Why the function our hook at ``path`` receives is not SGLang's own (another
    plugin's hook sits inside ours), or None."""
    inner = _inner_original(path, hook)
    if inner is None:
        return None
    if getattr(inner, "__wrapped__", None) is not None:
        return f"another hook wraps {path} inside this slot's ({getattr(inner, '__qualname__', inner)!r})"
    try:
        got = source_sha(inner)
    except (OSError, TypeError):
        return f"the function under this slot's hook at {path} has no source"
    if sha is not None and got != sha:
        return f"the function under this slot's hook at {path} is not SGLang's (source sha {got}, expected {sha})"
    return None


def verify(state: InstallState, catalogue: Mapping[str, Slot] | None = None) -> None:
    """Mark each pending slot applied if all its hooks are live (and, for a hook that
    recompiles its original, that original is SGLang's own), else failed."""
    problems: dict[str, list[str]] = {}
    for path, (hook, slot_names) in state.registered.items():
        if not hook_in_place(path, hook):
            for name in slot_names:
                problems.setdefault(name, []).append(f"hook not in place after load_plugins(): {path}")
    for name in list(state.statuses):
        slot = catalogue.get(name) if catalogue else None
        for target in slot.targets if slot and name in state.active else ():
            if target.needs_upstream_original and target.path in state.registered:
                why = foreign_wrapper(target.path, state.registered[target.path][0], target.source_sha)
                if why:
                    problems.setdefault(name, []).append(why + "; its source edit is refused")
    for name, status in list(state.statuses.items()):
        if status.status is not Status.WOULD_APPLY or name not in state.active:
            continue
        if name in problems:
            state.fail(name, "; ".join(problems[name]))
        else:
            state.set(name, Status.APPLIED, status.reason)
    state.verified = True
