"""Verification of a slot against the installed SGLang, before anything is hooked:
its own precheck, every target's existence and shape (parameters, pinned source),
hook-target claims that two selected slots cannot share, and slots whose required
slot cannot apply."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import os
import pkgutil
from collections.abc import Iterable, Mapping

from .slot import HookTarget, Slot, TargetKind


def source_sha(obj) -> str:
    """First 16 hex of sha256 over an object's source (its upstream fingerprint)."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def resolve(path: str):
    """Import and return the object at a dotted path (raw function for class/static methods)."""
    owner_path, attr = path.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if isinstance(owner, type) and attr in owner.__dict__:
        raw = owner.__dict__[attr]
        if isinstance(raw, (classmethod, staticmethod)):
            return raw.__func__
    return getattr(owner, attr)


# Modules of SGLang that import these at their top (CUDA kernels) do not import on a CPU
# machine; their targets are checked from the module's file there instead.
GPU_RUNTIME_MODULES = ("sgl_kernel",)


def needs_gpu_runtime(exc: BaseException) -> bool:
    return isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in GPU_RUNTIME_MODULES


def read_source(path: str) -> str:
    """What ``inspect.getsource`` gives for the function or method at ``path``, read from its
    module's file without importing the module."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        spec = importlib.util.find_spec(".".join(parts[:i]))  # imports the parents only
        if spec is None:
            raise ModuleNotFoundError(f"no module {'.'.join(parts[:i])}")
        if spec.submodule_search_locations is None:
            break
    else:
        raise ModuleNotFoundError(f"no module on {path}")
    with open(spec.origin, encoding="utf-8") as f:
        text = f.read()
    node = ast.parse(text)
    for name in parts[i:]:
        found = [n for n in node.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name]
        if not found:
            raise AttributeError(f"{path}: no {name}")
        node = found[-1]  # the last definition wins, as at import
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return "".join(text.splitlines(keepends=True)[start - 1:node.end_lineno])


def pinned_sources(pins, what: str) -> str | None:
    """None when every ``(owner, attr, sha)`` in ``pins`` (upstream code a slot relies on beyond
    its hook targets) still has that source, else the reason to refuse the slot."""
    from triton.runtime import KernelInterface

    for owner, attr, sha in pins:
        try:
            obj = inspect.unwrap(resolve(f"{owner}.{attr}"))
            got = source_sha(obj.fn if isinstance(obj, KernelInterface) else obj)  # a @triton.jit kernel
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            return f"target missing: {owner}.{attr} ({type(exc).__name__}: {exc})"
        if got != sha:
            return f"upstream shape changed: {owner}.{attr} source sha {got}, expected {sha} ({what})"
    return None


def import_error(path: str) -> ImportError | None:
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


def file_pins(pins, what: str = "") -> str | None:
    """None when every ``(path, sha)`` in ``pins`` still has that source as its module's file has it
    (read without importing the module; ``sha`` None: only that it exists), else the reason to refuse."""
    for path, sha in pins:
        try:
            source = read_source(path)
        except (ImportError, AttributeError, OSError, SyntaxError) as exc:
            return f"target missing: {path} ({type(exc).__name__}: {exc})"
        got = hashlib.sha256(source.encode()).hexdigest()[:16]
        if sha is not None and got != sha:
            return f"upstream shape changed: {path} source sha {got}, expected {sha}" + (f" ({what})" if what else "")
    return None


def package_file_pins(pins, what: str = "") -> str | None:
    """``file_pins`` for non-Python files shipped in a package (``"sglang/kernels/.../x.cuh"``): None when
    each still hashes to its ``sha`` (the whole file; None: only that it exists), read without importing
    the package, from whichever of its locations holds it."""
    for rel, sha in pins:
        top, _, inner = rel.partition("/")
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            return f"target missing: {rel} (no package {top})"
        found = [p for p in (os.path.join(d, inner) for d in spec.submodule_search_locations) if os.path.isfile(p)]
        if not found:
            return f"target missing: {rel} (not in {', '.join(spec.submodule_search_locations)})"
        with open(found[0], "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()[:16]
        if sha is not None and got != sha:
            return f"upstream shape changed: {rel} sha {got}, expected {sha}" + (f" ({what})" if what else "")
    return None


def _check_file_source(target: HookTarget) -> str | None:
    """A function target whose module needs a GPU runtime absent here: its pinned source, as
    its module's file has it (its parameters are checked where it imports)."""
    return file_pins([(target.path, target.source_sha)])


def overridden_methods(mixin: type) -> list[str]:
    """Methods a mixin replaces on its upstream class (its non-``_hs_`` callables)."""
    return [
        name
        for name, value in vars(mixin).items()
        if callable(value) and not name.startswith("__") and not name.startswith("_hs_")
    ]


def check_target(target: HookTarget) -> str | None:
    """None when ``target`` exists with the expected shape, else the reason."""
    try:
        obj = resolve(target.path)
    except (ImportError, AttributeError, ValueError) as exc:
        exc = import_error(target.path) or exc
        if target.kind is TargetKind.FUNCTION and needs_gpu_runtime(exc):
            return _check_file_source(target)
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


def check_slot(slot: Slot) -> str | None:
    """None when the slot can be applied to the installed SGLang, else why not.
    A check that raises refuses its own slot, never the plugin."""
    try:
        reason = slot.precheck() if slot.precheck else None
        for target in slot.targets:
            reason = reason or check_target(target)
    except Exception as exc:  # noqa: BLE001
        reason = f"check raised {type(exc).__name__}: {exc}"
    return reason


def claim_conflicts(slots: Iterable[Slot]) -> dict[str, str]:
    """Slot name -> reason, for every slot that hooks a function (or overrides a
    method) another of ``slots`` also hooks: each of them is refused. Observer targets
    claim nothing; the parts of one edit site (``source_edit.EditSite``) claim it together."""
    claims: dict[str, list[tuple[str, object]]] = {}
    for slot in slots:
        for target in (t for t in slot.targets if not t.observer):
            keys = ([f"{target.path}.{m}" for m in overridden_methods(target.mixin)]
                    if target.kind is TargetKind.CLASS else [target.path])
            for key in keys:
                claims.setdefault(key, []).append((slot.name, slot.name if target.site is None else id(target.site)))
    refused: dict[str, str] = {}
    for key, claimants in claims.items():
        owners = [name for name, _ in claimants]
        if len({claim for _, claim in claimants}) > 1:
            for name in owners:
                others = ", ".join(o for o in owners if o != name)
                refused.setdefault(name, f"conflicts with slot(s) {others}: both hook {key}; select one")
    return refused


CANNOT_APPLY = ", which cannot apply: "  # a dependent's reason: the required slot's reason follows


def refused_dependents(catalogue: Mapping[str, Slot], reasons: dict[str, str | None]) -> dict[str, str]:
    """Slot name -> reason, for every slot not refused yet whose required slot (directly
    or through another) is refused: it must not apply without what it relies on."""
    refused: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, slot in catalogue.items():
            if reasons.get(name) or name in refused:
                continue
            dep = next((d for d in slot.requires if reasons.get(d) or d in refused), None)
            if dep is not None:
                refused[name] = f"requires slot {dep!r}{CANNOT_APPLY}{reasons.get(dep) or refused[dep]}"
                changed = True
    return refused
