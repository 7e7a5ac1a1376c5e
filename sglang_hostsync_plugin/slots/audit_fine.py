"""Slot ``audit_fine`` (tool, requires ``audit``): the audit's phase attribution split
further, inside its phases: the EAGLE v2 worker's own glue, the input resolve, result relay
and D2H launch, the target forward, verify sampling, commit, logprobs and tree compaction,
and the draft extend's prep and graph runner (``audit_phases.FINE_PHASES``).

Eleven more timed functions, which about doubles the audit's timed calls per step: where
the host sets the pace that is measurable in tok/s (``benchmarks/results/2026-12-02-h200-e/``),
so the sub-phases are opt-in and the plain ``audit`` keeps the coarse ones. Its phases go
into the same clock, summary, trace and e2e tables as the audit's own."""

from __future__ import annotations

from ..slot import Slot, SlotKind
from . import audit_phases as phases
from .audit import NAME as AUDIT

NAME = "audit_fine"


SLOT = Slot(
    name=NAME,
    kind=SlotKind.TOOL,
    origin="hostsync (audit phases inside EAGLE v2's)",
    summary="the audit's phase attribution inside its phases (worker glue, target forward, verify "
            "sampling, commit, tree compaction, draft-extend prep and graph)",
    default=False,
    requires=(AUDIT,),
    env_warning=phases.clock_off_warning,
    targets=phases.phase_targets(phases.FINE_PHASES),
)
