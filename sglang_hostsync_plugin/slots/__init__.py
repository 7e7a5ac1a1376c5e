"""Built-in slots: one module per slot (the upstream switches and built-ins, which
are data plus one check each, one module per family); this module is their pluggy
plugin."""

from __future__ import annotations

from ..hookspecs import hookimpl
from . import (
    accept_lens_snapshot,
    audit,
    draft_input_reuse,
    dspark_dp_meta,
    eagle_fixed_shape_tail,
    event_ring,
    pinned_d2h_ring,
    target_dp_meta,
    upstream_builtins,
    upstream_switches,
)


@hookimpl
def hostsync_slots():
    return [
        dspark_dp_meta.SLOT,
        target_dp_meta.SLOT,
        eagle_fixed_shape_tail.SLOT,
        draft_input_reuse.SLOT,
        event_ring.SLOT,
        pinned_d2h_ring.SLOT,
        accept_lens_snapshot.SLOT,
        *upstream_switches.SLOTS, *upstream_builtins.SLOTS,
        audit.SLOT,
    ]
