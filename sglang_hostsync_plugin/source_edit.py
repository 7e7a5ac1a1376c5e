"""Surgical edits of an upstream function, for a few lines in the middle of a long
method that no smaller hook reaches: the function is recompiled from its own
source with each snippet replaced exactly once, so everything else stays SGLang's
code. Callers pin the upstream source (``HookTarget.source_sha``): the snippets are
then known to be there.

The copy runs in the function's live module globals (later patches of module
names still reach it) and keeps the file name and line numbers in tracebacks.
Names the new text needs come in as closure variables, not as module globals.
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import inspect
import logging
import sys
import textwrap
import types


class SourceEditError(RuntimeError):
    pass


def edited_source(source: str, qualname: str, name: str, edits: tuple[tuple[str, str], ...], names,
                  expected_sha: str | None = None) -> str:
    """``def _hostsync_factory(<names>): <source with edits>; return <name>``: the text
    :func:`edit_function` compiles, raising SourceEditError where it would."""
    if expected_sha is not None:
        got = hashlib.sha256(source.encode()).hexdigest()[:16]
        if got != expected_sha:
            raise SourceEditError(f"{qualname}: source sha {got}, expected {expected_sha} "
                                  "(changed upstream, or wrapped by another hook)")
    if source.lstrip().startswith("@"):
        raise SourceEditError(f"{qualname}: decorated functions are not supported")
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise SourceEditError(f"{qualname}: expected one {old.strip().splitlines()[0]!r}, found {count}")
        source = source.replace(old, new)
    body = textwrap.indent(textwrap.dedent(source), "    ")
    return f"def _hostsync_factory({', '.join(names)}):\n{body}\n    return {name}\n"


def edit_function(func: types.FunctionType, edits: tuple[tuple[str, str], ...], names: dict,
                  expected_sha: str | None = None) -> types.FunctionType:
    """``func`` recompiled with each ``(old, new)`` of ``edits`` applied; ``old`` must
    occur exactly once. ``names``: what ``new`` refers to, bound as closure cells.
    ``expected_sha`` (``installer.source_sha`` of the pinned upstream source): the
    exact source compiled here must be that one, so a wrapper another plugin put
    around the function is refused instead of recompiled."""
    lines, first_line = inspect.getsourcelines(func)
    # As in the file: snippets carry the file's indentation. The names become closure cells.
    factory_src = edited_source("".join(lines), func.__qualname__, func.__name__, edits, names, expected_sha)
    tree = ast.parse(factory_src)
    ast.increment_lineno(tree, first_line - 2)
    flags = 0
    if func.__globals__.get("annotations") is __future__.annotations:
        flags |= __future__.annotations.compiler_flag
    code = compile(tree, func.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    module_globals = vars(sys.modules[func.__module__]) if func.__module__ in sys.modules else func.__globals__
    scratch: dict = {}
    exec(code, module_globals | {"__builtins__": module_globals.get("__builtins__")}, scratch)
    factory = types.FunctionType(scratch["_hostsync_factory"].__code__, module_globals)
    edited = factory(**names)
    edited.__qualname__ = func.__qualname__
    edited.__module__ = func.__module__
    edited.__defaults__ = func.__defaults__
    edited.__kwdefaults__ = func.__kwdefaults__
    edited.__doc__ = func.__doc__
    return edited


class PinnedEdit:
    """An AROUND hook's replacement for SGLang's function ``path``: that function recompiled with
    ``edits`` from its pinned source (``sha``), once per process, names from ``bind()`` (looked up
    then, so later patches of them are seen by the first edit). ``check`` is the slot's precheck:
    it makes the same edit before anything is hooked, so a source it does not apply to refuses
    the slot at startup. If the first call's edit fails anyway (``original`` is not SGLang's own),
    that is logged once and SGLang's function runs: nothing raises into the serving loop."""

    def __init__(self, slot: str, path: str, edits: tuple[tuple[str, str], ...], bind, sha: str,
                 site: "EditSite | None" = None):
        self.slot, self.path, self.edits, self.bind, self.sha, self.site = slot, path, edits, bind, sha, site
        self._edited = None
        self.failed = False  # the first call's edit failed: SGLang's function runs

        def hook(original, *args, **kwargs):  # one object: the installer finds it in the live chain
            return self(original)(*args, **kwargs)

        self.hook = hook

    def target(self, params: tuple[str, ...] | None = None):
        """The slot's HookTarget for ``path``: this edit's hook, its pinned source, recompiling
        SGLang's own function (``needs_upstream_original``)."""
        from .slot import HookTarget, TargetKind

        return HookTarget(self.path, TargetKind.FUNCTION, hook=self.hook, params=params, source_sha=self.sha,
                          needs_upstream_original=True, site=self.site)

    def check(self) -> str | None:
        """Why this edit does not apply to the installed SGLang (for a site's part: also together
        with every other part that applies on its own), or None."""
        own = self._check(self.edits, self.bind())
        return own or (self.site.check(self.slot) if self.site is not None else None)

    def _check(self, edits, names) -> str | None:
        from .checks import import_error, needs_gpu_runtime, read_source, resolve

        try:
            target = inspect.unwrap(resolve(self.path))
        except (ImportError, AttributeError, ValueError) as exc:
            exc = import_error(self.path) or exc  # the module that failed to import, by name
            if not needs_gpu_runtime(exc):
                return f"target missing: {self.path} ({type(exc).__name__}: {exc})"
            target = None  # a module that imports only beside sgl_kernel: its file is read instead
        try:
            if target is None:
                qualname = self.path.rsplit(".", 2)
                compile(edited_source(read_source(self.path), ".".join(qualname[1:]), qualname[-1], edits,
                                      names, expected_sha=self.sha), self.path, "exec")
            else:
                edit_function(target, edits, names, expected_sha=self.sha)
        except Exception as exc:  # noqa: BLE001 (any failure refuses the slot, before serving)
            return f"source edit of {self.path} does not apply: {type(exc).__name__}: {exc}"
        return None

    def __call__(self, original):
        fn = self._edited
        if fn is None:
            try:
                fn = edit_function(original, self.edits, self.bind(), expected_sha=self.sha)
            except Exception as exc:  # noqa: BLE001 (SGLang's own function runs instead)
                logging.getLogger("sglang.srt.plugins.hostsync").error(
                    "hostsync: %s: %s runs unedited: %s", self.slot, self.path.rsplit(".", 1)[-1], exc)
                fn, self.failed = original, True
            self._edited = fn
        return fn

    def live(self) -> bool:
        """The edited function has run in this process (not SGLang's, after a failed edit)."""
        if self.site is not None:  # the site compiles its parts' variants
            return self.site.live(self.slot)
        return self._edited is not None and not self.failed


class EditSite:
    """One SGLang function that more than one slot edits, each with its own snippets: the slots'
    targets share one AROUND hook (``installer.compose_function`` builds it with :meth:`hook`), and
    the function is recompiled once per set of active parts, so a refused slot's snippets drop out
    and the others' stay. Parts claim the function together: they never conflict with each other,
    and any other slot's hook there still conflicts with all of them."""

    def __init__(self, path: str, sha: str):
        self.path, self.sha = path, sha
        self.parts: dict[str, PinnedEdit] = {}
        self._variants: dict[tuple[str, ...], types.FunctionType] = {}
        self._failed: set[tuple[str, ...]] = set()  # variants whose edit failed: SGLang's function runs

    def edit(self, slot: str, edits: tuple[tuple[str, str], ...], bind) -> PinnedEdit:
        part = PinnedEdit(slot, self.path, edits, bind, self.sha, site=self)
        self.parts[slot] = part
        return part

    def _combined(self, slots) -> tuple[tuple, dict]:
        edits, names = (), {}
        for slot in slots:
            part = self.parts[slot]
            bound = part.bind()
            if names.keys() & bound.keys():
                raise SourceEditError(f"{self.path}: slots bind the same name twice: {sorted(names.keys() & bound.keys())}")
            edits, names = edits + part.edits, names | bound
        return edits, names

    def check(self, slot: str | None = None) -> str | None:
        """Why the edits of ``slot`` and of every part that applies on its own do not apply together
        (overlapping snippets, a name bound twice), or None. A part that no longer applies is left
        out: it refuses its own slot, not the others."""
        slots = [s for s, part in self.parts.items() if s == slot or part._check(part.edits, part.bind()) is None]
        if not slots:
            return None
        try:
            edits, names = self._combined(slots)
        except SourceEditError as exc:
            return str(exc)
        return self.parts[slots[0]]._check(edits, names)

    def variant(self, original, slots: tuple[str, ...]):
        """``original`` with the edits of ``slots``, compiled on first use; SGLang's function (and
        one error in the log) where that fails."""
        fn = self._variants.get(slots)
        if fn is None:
            try:
                edits, names = self._combined(slots)
                fn = edit_function(original, edits, names, expected_sha=self.sha)
            except Exception as exc:  # noqa: BLE001 (SGLang's own function runs instead)
                logging.getLogger("sglang.srt.plugins.hostsync").error(
                    "hostsync: %s: %s runs unedited: %s", ", ".join(slots), self.path.rsplit(".", 1)[-1], exc)
                fn = original
                self._failed.add(slots)
            self._variants[slots] = fn
        return fn

    def live(self, slot: str) -> bool:
        """A variant with ``slot``'s edits has been compiled in this process (not SGLang's function)."""
        return any(slot in key and key not in self._failed for key in self._variants)

    def hook(self, is_active) -> "types.FunctionType":
        """The one AROUND hook of the site: the variant for the parts ``is_active`` accepts now."""
        parts = tuple(sorted(self.parts))  # one variant key per set, whatever the import order

        def site_hook(original, *args, **kwargs):
            slots = tuple(s for s in parts if is_active(s))
            return (self.variant(original, slots) if slots else original)(*args, **kwargs)

        site_hook.__qualname__ = f"hostsync[{', '.join(parts)}].site_hook"
        return site_hook
