"""Built-in slots: one module per slot (the upstream switches and built-ins, which
are data plus one check each, one module per family); this module is their pluggy
plugin."""

from __future__ import annotations

from ..hookspecs import hookimpl
from . import audit, draft_input_reuse, dspark_dp_meta, eagle_fixed_shape_tail, upstream_builtins, upstream_switches


@hookimpl
def hostsync_slots():
    return [dspark_dp_meta.SLOT, eagle_fixed_shape_tail.SLOT, draft_input_reuse.SLOT, *upstream_switches.SLOTS, *upstream_builtins.SLOTS, audit.SLOT]
