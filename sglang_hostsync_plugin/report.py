"""Status tables: the startup log block and the doctor's rows, both from verdicts."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Mapping

from .plan import Plan, Verdict
from .slot import Slot


def doctor_rows(plan: Plan, catalogue: Mapping[str, Slot], not_picked: set[str] = frozenset()) -> list[dict]:
    """``picked``: False for a slot of ``auto``'s union that its pick leaves out."""
    return [
        {"name": v.name, "kind": catalogue[v.name].kind.value, "origin": catalogue[v.name].origin,
         "default": catalogue[v.name].default, "selected": v.selected, "status": v.status.value, "reason": v.reason,
         "picked": v.name not in not_picked}
        for v in plan.verdicts
    ]


def _selected(row: dict) -> str:
    """``no (auto)``: named by ``auto``'s union of rows but not by its pick for these server arguments."""
    if not row["selected"]:
        return "no"
    return "yes" if row.get("picked", True) else "no (auto)"


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


# The doctor's default output fits a terminal this wide; ``--wide`` prints every column, nothing wrapped.
DOCTOR_WIDTH = 120
# The reason column is wrapped to at least this width, even if the table then runs past DOCTOR_WIDTH
# (a third-party slot with a very long name).
MIN_REASON_WIDTH = 30


def fit(text: str, width: int | None, indent: str = "  ") -> str:
    """Each line of ``text`` wrapped to ``width`` columns (``None``: as it is), later lines of a
    wrapped line indented by its own indent plus ``indent``; a word longer than a line stays whole (a
    value such as the pick's ``SGLANG_HOSTSYNC_SLOTS=...`` is pasted back as printed)."""
    if width is None:
        return text
    out = []
    for line in text.splitlines() or [""]:
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.lstrip(), width, initial_indent=lead, subsequent_indent=lead + indent,
                             break_on_hyphens=False, break_long_words=False) if line.strip() else [line]
    return "\n".join(out)


def format_fitted_table(headers: list[str], rows: list[list[str]], width: int) -> str:
    """``format_table`` with its last column wrapped so that every line fits ``width`` columns
    (continuation lines leave the other columns blank)."""
    fixed = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers[:-1])]
    indent = sum(w + 2 for w in fixed)
    last = max(width - indent, MIN_REASON_WIDTH)
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, [*fixed, 0])).rstrip()  # noqa: E731
    longest = max([len(headers[-1]), *(len(r[-1]) for r in rows)])
    out = [line(headers), line([*("-" * w for w in fixed), "-" * min(last, longest)])]
    for row in rows:
        pieces = textwrap.wrap(row[-1], last, break_on_hyphens=False) or [""]
        out.append(line([*row[:-1], pieces[0]]))
        out += [" " * indent + piece for piece in pieces[1:]]
    return "\n".join(out)


def format_doctor(rows: list[dict], header: str, width: int | None = DOCTOR_WIDTH) -> str:
    """The doctor's table: slot, selected, status and the reason wrapped to ``width`` columns; with
    ``width`` None (``--wide``) also kind, origin and default, one line per slot."""
    if width is None:
        body = format_table(
            ["slot", "kind", "origin", "default", "selected", "status", "reason"],
            [[r["name"], r["kind"], r["origin"], "yes" if r["default"] else "no", _selected(r),
              r["status"], r["reason"]] for r in rows],
        )
        return f"{header}\n{body}"
    body = format_fitted_table(
        ["slot", "selected", "status", "reason"],
        [[r["name"], _selected(r), r["status"], r["reason"]] for r in rows],
        width,
    )
    return f"{fit(header, width)}\n{body}"


def doctor_json(rows: list[dict], **extra) -> str:
    return json.dumps({**extra, "slots": rows}, indent=2)


def format_status_block(statuses: Iterable[Verdict], header: str) -> str:
    """One line per slot: applied / skipped (reason) / failed (reason)."""
    lines = [header]
    for status in statuses:
        suffix = f" ({status.reason})" if status.reason else ""
        lines.append(f"  {status.name:<28} {status.status.value}{suffix}")
    return "\n".join(lines)
