"""Status tables: the startup log block and the doctor's rows, both from verdicts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .plan import Plan, Verdict
from .slot import Slot


def doctor_rows(plan: Plan, catalogue: Mapping[str, Slot]) -> list[dict]:
    return [
        {"name": v.name, "kind": catalogue[v.name].kind.value, "origin": catalogue[v.name].origin,
         "default": catalogue[v.name].default, "selected": v.selected, "status": v.status.value, "reason": v.reason}
        for v in plan.verdicts
    ]


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_doctor(rows: list[dict], header: str) -> str:
    body = format_table(
        ["slot", "kind", "origin", "default", "selected", "status", "reason"],
        [[r["name"], r["kind"], r["origin"], "yes" if r["default"] else "no", "yes" if r["selected"] else "no",
          r["status"], r["reason"]] for r in rows],
    )
    return f"{header}\n{body}"


def doctor_json(rows: list[dict], **extra) -> str:
    return json.dumps({**extra, "slots": rows}, indent=2)


def format_status_block(statuses: Iterable[Verdict], header: str) -> str:
    """One line per slot: applied / skipped (reason) / failed (reason)."""
    lines = [header]
    for status in statuses:
        suffix = f" ({status.reason})" if status.reason else ""
        lines.append(f"  {status.name:<28} {status.status.value}{suffix}")
    return "\n".join(lines)
