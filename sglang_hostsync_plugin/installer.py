"""The one installer: checks, registers and verifies every slot's hook targets.

Flow per process: ``install()`` (from ``register()``, while SGLang's
``load_plugins()`` runs) shape-checks every target of every selected slot before
registering any of its hooks, then registers them with SGLang's HookRegistry.
``verify()`` (after ``load_plugins()`` applied them) checks that each one is
really in place. A slot that fails either step is marked failed and switched off
as a whole through its gate, so it is never half-applied; in strict mode the
caller stops startup.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .slot import HookTarget, Slot, SlotKind, TargetKind

logger = logging.getLogger("sglang.srt.plugins.hostsync")

APPLIED = "applied"
SKIPPED = "skipped"
FAILED = "failed"
PENDING = "pending"  # registered, not yet verified
UPSTREAM = "upstream present"  # an upstream built-in whose contract check passed


@dataclass
class SlotStatus:
    name: str
    state: str
    reason: str = ""


def source_sha(obj) -> str:
    """First 16 hex of sha256 over an object's source (its upstream fingerprint)."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def resolve(path: str):
    """Import and return the object at a dotted path (raw descriptor for methods)."""
    owner_path, attr = path.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if isinstance(owner, type) and attr in owner.__dict__:
        raw = owner.__dict__[attr]
        if isinstance(raw, (classmethod, staticmethod)):
            return raw.__func__
    return getattr(owner, attr)


def _import_error(path: str) -> ImportError | None:
    """The import error behind an unresolvable path, when a module on it fails to
    import (pkgutil reports that as a missing attribute of its parent package)."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            return None if exc.name == name else exc
        except ImportError as exc:
            return exc
    return None


def _param_names(fn) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _check_callable(path: str, fn, params, sha) -> str | None:
    if not callable(fn):
        return f"upstream shape changed: {path} is not callable"
    if params and _param_names(fn) != tuple(params):
        return (
            f"upstream shape changed: {path} takes {_param_names(fn)}, "
            f"expected {tuple(params)}"
        )
    if sha is not None:
        try:
            got = source_sha(inspect.unwrap(fn))
        except (OSError, TypeError):
            return f"upstream shape changed: no source for {path}"
        if got != sha:
            return f"upstream shape changed: {path} source sha {got}, expected {sha}"
    return None


def check_target(target: HookTarget) -> str | None:
    """None when ``target`` exists with the expected shape, else the reason."""
    try:
        obj = resolve(target.path)
    except (ImportError, AttributeError, ValueError) as exc:
        exc = _import_error(target.path) or exc
        return f"target missing: {target.path} ({type(exc).__name__}: {exc})"
    if target.kind is TargetKind.FUNCTION:
        return _check_callable(target.path, obj, target.params, target.source_sha)
    if not isinstance(obj, type):
        return f"upstream shape changed: {target.path} is not a class"
    params = dict(target.params or {})
    shas = dict(target.source_sha or {})
    for method in overridden_methods(target.mixin):
        if method not in params:
            return f"slot bug: {target.mixin.__name__}.{method} overrides without declared params"
        upstream = inspect.getattr_static(obj, method, None)
        if upstream is None:
            return f"target missing: {target.path}.{method}"
        reason = _check_callable(f"{target.path}.{method}", upstream, params[method], shas.get(method))
        if reason:
            return reason
    return None


def overridden_methods(mixin: type) -> list[str]:
    """Methods a mixin replaces on its upstream class (its non-``_hs_`` callables)."""
    return [
        name
        for name, value in vars(mixin).items()
        if callable(value) and not name.startswith("__") and not name.startswith("_hs_")
    ]


@dataclass
class InstallState:
    """What this process installed, and each slot's status."""

    statuses: dict[str, SlotStatus] = field(default_factory=dict)
    # target path -> (hook object registered, slot names behind it)
    registered: dict[str, tuple[object, tuple[str, ...]]] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    verified: bool = False

    def fail(self, name: str, reason: str) -> None:
        self.statuses[name] = SlotStatus(name, FAILED, reason)
        self.active.discard(name)

    def applied(self) -> tuple[str, ...]:
        return tuple(n for n, s in self.statuses.items() if s.state == APPLIED)

    def failed(self) -> list[SlotStatus]:
        return [s for s in self.statuses.values() if s.state == FAILED]


def _gate_function(state: InstallState, slot: str, hook: Callable) -> Callable:
    def gated(original, *args, **kwargs):
        if slot in state.active:
            return hook(original, *args, **kwargs)
        return original(*args, **kwargs)

    gated.__qualname__ = f"hostsync[{slot}].{getattr(hook, '__name__', 'hook')}"
    gated.hostsync_hook = hook
    return gated


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
    slots: Iterable[Slot],
    register: Callable[[str, object, str], None],
) -> None:
    """Register the hooks of ``slots`` (all selected) that pass their checks.

    ``register(path, hook, kind)`` is the HookRegistry call ("around" / "replace").
    """
    checked: list[Slot] = []
    for slot in slots:
        try:
            reason = slot.precheck() if slot.precheck else None
            for target in slot.targets:
                reason = reason or check_target(target)
        except Exception as exc:  # a broken check refuses its slot, not the plugin
            reason = f"check raised {type(exc).__name__}: {exc}"
        if reason:
            state.fail(slot.name, reason)
        elif slot.kind is SlotKind.UPSTREAM_BUILTIN:
            state.statuses[slot.name] = SlotStatus(slot.name, UPSTREAM)
        else:
            checked.append(slot)
    # Two slots on one function, or two mixins overriding one method: both are refused
    # before anything is registered (neither is half-applied).
    claims: dict[str, list[str]] = {}
    for slot in checked:
        for target in slot.targets:
            keys = ([f"{target.path}.{m}" for m in overridden_methods(target.mixin)]
                    if target.kind is TargetKind.CLASS else [target.path])
            for key in keys:
                claims.setdefault(key, []).append(slot.name)
    for key, owners in claims.items():
        if len(owners) > 1:
            for name in owners:
                others = ", ".join(o for o in owners if o != name)
                state.fail(name, f"conflicts with slot(s) {others}: both hook {key}; select one")
    by_class: dict[str, list[tuple[str, type]]] = {}
    functions: list[tuple[str, str, Callable]] = []
    for slot in checked:
        if state.statuses.get(slot.name, SlotStatus(slot.name, PENDING)).state == FAILED:
            continue
        state.statuses[slot.name] = SlotStatus(slot.name, PENDING)
        state.active.add(slot.name)
        for target in slot.targets:
            if target.kind is TargetKind.CLASS:
                by_class.setdefault(target.path, []).append((slot.name, target.mixin))
            else:
                functions.append((target.path, slot.name, target.hook))
    for path, slot, hook in functions:
        gated = _gate_function(state, slot, hook)
        register(path, gated, "around")
        state.registered[path] = (gated, (slot,))
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
    seen = 0
    while live is not None and seen < 64:
        if live is hook:
            return True
        for cell in getattr(live, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:
                continue
        live = getattr(live, "__wrapped__", None)
        seen += 1
    return False


def verify(state: InstallState) -> None:
    """Mark each pending slot applied if all its hooks are live, else failed."""
    missing: dict[str, list[str]] = {}
    for path, (hook, slot_names) in state.registered.items():
        if not hook_in_place(path, hook):
            for name in slot_names:
                missing.setdefault(name, []).append(path)
    for name, status in list(state.statuses.items()):
        if status.state != PENDING:
            continue
        if name in missing:
            state.fail(name, "hook not in place after load_plugins(): " + ", ".join(missing[name]))
        else:
            state.statuses[name] = SlotStatus(name, APPLIED, status.reason)
    state.verified = True


def mark_unselected(state: InstallState, catalogue: Mapping[str, Slot], selected: Iterable[str]) -> None:
    chosen = set(selected)
    for name in catalogue:
        if name not in chosen:
            state.statuses[name] = SlotStatus(name, SKIPPED, "not selected")
    # Keep catalogue order for the report.
    state.statuses = {n: state.statuses[n] for n in catalogue if n in state.statuses}
