"""Which attention backend makes FutureMap do its per-step seq_lens D2H.

``FutureMap.resolve_seq_lens_cpu`` does a pinned D2H plus a stream synchronize
every step when ``decide_needs_cpu_seq_lens`` (SGLang's own function, called here
with stand-ins) is true for the backends the spec-v2 loop runs. Each backend's
answer is its class's declared ``needs_cpu_seq_lens`` (missing: True, as SGLang
reads it). The classes come from SGLang's backend registry; a class whose module
cannot be imported here (it needs a GPU package) is read from its source.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import textwrap
import types
from dataclasses import asdict, dataclass, field

FLAG = "needs_cpu_seq_lens"


@dataclass
class BackendClass:
    name: str
    module: str
    needs_cpu_seq_lens: bool
    how: str  # "imported" or "read from source (...)"
    per_instance: bool  # the class also assigns the flag in code (e.g. __init__)


@dataclass
class BackendRole:
    role: str  # "target", "target (hybrid prefill/decode)", "draft"
    backend: str
    classes: list[BackendClass] = field(default_factory=list)
    needs_cpu_seq_lens: bool = True


@dataclass
class SeqLensReport:
    speculative_algorithm: str | None
    two_batch_overlap: bool
    roles: list[BackendRole]
    d2h_per_step: bool
    forced_by: list[str]  # class names, or the reason SGLang forces it
    overlap: bool = True  # False: the scheduler never calls resolve_seq_lens_cpu (run_batch, under enable_overlap)

    def as_dict(self) -> dict:
        return asdict(self)


def _factory_imports(backend: str) -> list[tuple[str, str]]:
    """(module, name) pairs the registry's factory for ``backend`` imports."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if backend not in ATTENTION_BACKENDS:
        raise KeyError(
            f"unknown attention backend {backend!r}; SGLang 0.5.23 registers: "
            + ", ".join(sorted(ATTENTION_BACKENDS))
        )
    tree = ast.parse(textwrap.dedent(inspect.getsource(ATTENTION_BACKENDS[backend])))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    ]


def _class_node(module: str, name: str) -> tuple[ast.Module, ast.ClassDef | None]:
    spec = importlib.util.find_spec(module)
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return tree, node
    return tree, None


def _assigns_flag(node: ast.ClassDef) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == FLAG and isinstance(n.ctx, ast.Store)
        for n in ast.walk(node)
    )


def _declared_in_source(module: str, name: str, depth: int = 0) -> bool | None:
    """The class-level flag from source, following bases; None if not a class."""
    tree, node = _class_node(module, name)
    if node is None:
        return None
    for stmt in node.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == FLAG for t in targets) and isinstance(stmt.value, ast.Constant):
            return bool(stmt.value.value)
    imported = {
        alias.asname or alias.name: (n.module, alias.name)
        for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
        for alias in n.names
    }
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if base_name is None or depth > 8:
            continue
        where = (module, base_name) if base_name not in imported else imported[base_name]
        value = _declared_in_source(*where, depth=depth + 1)
        if value is not None:
            return value
    return True  # AttentionBackend's default, and SGLang's getattr default


def backend_classes(backend: str) -> list[BackendClass]:
    found = []
    for module, name in _factory_imports(backend):
        try:
            obj = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            value = _declared_in_source(module, name)
            if value is None:
                continue
            how = f"read from source ({type(exc).__name__}: {exc.name or exc})"
            per_instance = _assigns_flag(_class_node(module, name)[1])
        else:
            if not isinstance(obj, type):
                continue
            value = bool(getattr(obj, FLAG, True))
            how = "imported"
            per_instance = _assigns_flag(_class_node(module, name)[1] or ast.ClassDef(name=name, body=[]))
        found.append(BackendClass(name, module, value, how, per_instance))
    return found


def _stand_in(flag: bool):
    return types.SimpleNamespace(needs_cpu_seq_lens=flag)


def seq_lens_report(
    *,
    attention_backend: str | None,
    speculative_algorithm: str | None,
    prefill_attention_backend: str | None = None,
    decode_attention_backend: str | None = None,
    draft_attention_backend: str | None = None,
    speculative_attention_mode: str = "prefill",
    two_batch_overlap: bool = False,
    overlap: bool = True,
) -> SeqLensReport:
    """Name the backend classes that make the spec-v2 loop do the per-step seq_lens
    D2H, using SGLang's decide_needs_cpu_seq_lens and HybridAttnBackend."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens
    from sglang.srt.runtime_context import get_context

    prefill = prefill_attention_backend or attention_backend
    decode = decode_attention_backend or attention_backend
    if prefill is None or decode is None:
        raise ValueError("name the attention backend (--attention-backend, or both --prefill- and --decode-attention-backend)")
    roles: list[BackendRole] = []

    def role(label: str, backend: str) -> BackendRole:
        classes = backend_classes(backend)
        # A backend whose classes disagree (e.g. MLA vs not) counts as needing it.
        return BackendRole(label, backend, classes, any(c.needs_cpu_seq_lens for c in classes) or not classes)

    with get_context().override_server_args(
        speculative_algorithm=speculative_algorithm,
        enable_two_batch_overlap=two_batch_overlap,
        speculative_attention_mode=speculative_attention_mode,
    ):
        if prefill != decode:
            p, d = role("prefill", prefill), role("decode", decode)
            runner = types.SimpleNamespace(
                kv_cache_dtype=None, token_to_kv_pool=None, req_to_token_pool=None,
                kv_index_translator=None, model_config=types.SimpleNamespace(context_len=1),
            )
            hybrid = HybridAttnBackend(runner, _stand_in(p.needs_cpu_seq_lens), _stand_in(d.needs_cpu_seq_lens))
            target = BackendRole("target (hybrid)", f"{prefill}/{decode}", p.classes + d.classes, hybrid.needs_cpu_seq_lens)
            # Only the sub-backends the hybrid counts are to blame.
            counted = d.classes + (p.classes if speculative_attention_mode == "prefill" else [])
        else:
            target = role("target", decode)
            counted = target.classes
        roles.append(target)
        blame = [c for c in counted if c.needs_cpu_seq_lens]
        if speculative_algorithm is not None:
            draft = role("draft", draft_attention_backend or decode)
            roles.append(draft)
            blame += [c for c in draft.classes if c.needs_cpu_seq_lens and c not in blame]
        needs = decide_needs_cpu_seq_lens([_stand_in(r.needs_cpu_seq_lens) for r in roles])
        all_off = not decide_needs_cpu_seq_lens([_stand_in(False)])
    if needs and all_off:
        forced_by = [c.name for c in blame]
    elif needs:
        forced_by = ["two-batch overlap" if two_batch_overlap else f"--speculative-algorithm {speculative_algorithm}"]
    else:
        forced_by = []
    if not overlap:
        return SeqLensReport(speculative_algorithm, two_batch_overlap, roles, False, [], overlap=False)
    return SeqLensReport(speculative_algorithm, two_batch_overlap, roles, needs, forced_by)


def format_report(rep: SeqLensReport, slots: dict[str, str] | None = None) -> str:
    """The stock report; ``slots`` (name -> ``Slot.seq_lens_read``): what the applying slots change in it."""
    lines = ["FutureMap.resolve_seq_lens_cpu (per-step seq_lens D2H + synchronize):"]
    for r in rep.roles:
        parts = [
            f"{c.name}={c.needs_cpu_seq_lens}"
            + (" [also set per instance]" if c.per_instance else "")
            + ("" if c.how == "imported" else f" [{c.how}]")
            for c in r.classes
        ] or ["no backend class found"]
        lines.append(f"  {r.role:<16} {r.backend:<22} needs_cpu_seq_lens={r.needs_cpu_seq_lens}: {', '.join(parts)}")
    if rep.d2h_per_step:
        lines.append(f"  per-step D2H: YES, forced by {', '.join(rep.forced_by)}")
        if slots:
            lines.append("  with the selected slots (above is stock SGLang's):")
            lines += [f"    {name}: {what}" for name, what in slots.items()]
    elif not rep.overlap:
        lines.append("  per-step D2H: none here: without overlap SGLang does not call it (that loop waits for each "
                     "step's results anyway)")
    else:
        lines.append("  per-step D2H: none (no backend in the spec loop needs host seq_lens)")
    return "\n".join(lines)
