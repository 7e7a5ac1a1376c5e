"""Slot ``audit_ngram`` (tool, requires ``audit``): the audit's phase attribution for NGRAM,
whose step drafts on the host. Besides the phases it shares with the EAGLE v2 step (decode
prep, the target graph's load and replay, SGLang's simulated acceptance; with ``audit_fine``
the target forward and the verify's sampling), its timers (``audit_phases.NGRAM_PHASES``): the
worker's own glue, the verify input (the tree and mask uploads, the KV slots), the host draft
(the request tails and the corpus lookup), the wait for the corpus's background insert, the
lookup itself, the accepted tokens' KV move and the corpus update.

Inert for other algorithms. A slot of its own, apart from ``audit_block``: ``ngram_worker``
imports ``sgl_kernel`` at import, so its targets are checked from the file where that is
missing (as the NGRAM slots' are). The e2e benchmark adds it to the audited arms of its NGRAM
configuration, the stock-code arm included."""

from __future__ import annotations

from ..slot import Slot, SlotKind, not_speculative
from . import audit_phases as phases
from .audit import NAME as AUDIT

NAME = "audit_ngram"

SLOT = Slot(
    name=NAME,
    kind=SlotKind.TOOL,
    origin="hostsync (audit phases of NGRAM)",
    summary="the audit's phase attribution for NGRAM steps (worker glue, verify input, host draft, "
            "corpus wait and lookup, KV move, corpus update)",
    default=False,
    requires=(AUDIT,),
    env_warning=phases.clock_off_warning,
    inert=lambda f: not_speculative(f, "its timers are on NGRAM's step functions", f.is_ngram()),
    targets=phases.phase_targets(phases.NGRAM_PHASES),
)
