"""Status tables: the startup log block and the doctor's rows."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from .installer import InstallState, check_target
from .slot import ServingFacts, Slot, SlotKind

WOULD_APPLY = "would apply"
UPSTREAM_PRESENT = "upstream present"
TARGET_MISSING = "target missing"
REFUSED = "refused"
INERT = "skipped"  # an upstream switch that would do nothing for these server args


@dataclass(frozen=True)
class DoctorRow:
    name: str
    kind: str
    origin: str
    default: bool
    status: str
    reason: str


def doctor_row(slot: Slot, facts: ServingFacts | None = None) -> DoctorRow:
    """The slot against the installed SGLang; with ``facts`` (server args given to
    the doctor), an upstream switch that would do nothing is reported inert."""
    reason = slot.precheck() if slot.precheck else None
    for target in slot.targets:
        reason = reason or check_target(target)
    if reason is None:
        status = UPSTREAM_PRESENT if slot.kind is SlotKind.UPSTREAM_BUILTIN else WOULD_APPLY
        if slot.kind is SlotKind.UPSTREAM_SWITCH:
            inert = slot.inert(facts) if (facts is not None and slot.inert) else None
            status, reason = (INERT, inert) if inert else (status, f"sets {slot.env_flag}=1")
        warning = slot.env_warning(os.environ) if slot.env_warning else None
        if warning:
            reason = f"undone: {warning}"
    elif reason.startswith("target missing"):
        status = TARGET_MISSING
    else:
        status = REFUSED
    return DoctorRow(slot.name, slot.kind.value, slot.origin, slot.default, status, reason or "")


def doctor_rows(catalogue: Mapping[str, Slot], facts: ServingFacts | None = None) -> list[DoctorRow]:
    return [doctor_row(slot, facts) for slot in catalogue.values()]


def rows_ok(rows: list[DoctorRow]) -> bool:
    return all(r.status in (WOULD_APPLY, UPSTREAM_PRESENT, INERT) for r in rows)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_doctor(rows: list[DoctorRow], header: str) -> str:
    body = format_table(
        ["slot", "kind", "origin", "default", "status", "reason"],
        [[r.name, r.kind, r.origin, "yes" if r.default else "no", r.status, r.reason] for r in rows],
    )
    return f"{header}\n{body}"


def doctor_json(rows: list[DoctorRow], **extra) -> str:
    return json.dumps({**extra, "slots": [asdict(r) for r in rows]}, indent=2)


def format_status_block(state: InstallState, header: str) -> str:
    """One line per slot: applied / skipped (reason) / failed (reason)."""
    lines = [header]
    for status in state.statuses.values():
        suffix = f" ({status.reason})" if status.reason else ""
        lines.append(f"  {status.name:<28} {status.state}{suffix}")
    return "\n".join(lines)
