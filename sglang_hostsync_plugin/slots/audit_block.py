"""Slot ``audit_block`` (tool, requires ``audit``): the audit's phase attribution for the
DFlash family (DFLASH, DSPARK), whose steps call none of the EAGLE v2 functions the audit's
own phases time. Its timers (``audit_phases.BLOCK_PHASES``): the worker's own glue (for DFlash
the draft prep, draft sampling head and verify input, which live in one function), the draft
block (DSpark), the verify input and metadata, DSpark's verify layout, the target verify
(DSpark), the accept, the draft KV append, the next draft input, SGLang's simulated acceptance
(``simulate``, benchmarks only) and the model runner's forward glue around the graph runner's
load and replay (draft and target).

Inert for other algorithms (nothing of it runs there). Opt-in like ``audit_fine``: each
timer is a timed call in the audit's sampled windows. The e2e benchmark adds it to the
audited arms of its DFlash and DSpark configurations, the stock-code arm included, so the
arms' phase tables compare like with like. Its phases go into the same clock, summary,
trace and e2e tables as the audit's own."""

from __future__ import annotations

from ..slot import Slot, SlotKind, not_speculative
from . import audit_phases as phases
from .audit import NAME as AUDIT

NAME = "audit_block"

SLOT = Slot(
    name=NAME,
    kind=SlotKind.TOOL,
    origin="hostsync (audit phases of the DFlash family)",
    summary="the audit's phase attribution for DFlash and DSpark steps (worker glue, draft block, verify "
            "input, verify, accept, draft KV append, next draft input, model runner forward)",
    default=False,
    requires=(AUDIT,),
    env_warning=phases.clock_off_warning,
    inert=lambda f: not_speculative(f, "its timers are on the DFlash family's (DFlash, DSpark) step functions",
                                    f.is_dflash_family()),
    targets=phases.phase_targets(phases.BLOCK_PHASES),
)
