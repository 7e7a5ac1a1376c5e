"""Built-in slots: one module per slot; this module is their pluggy plugin."""

from __future__ import annotations

from ..hookspecs import hookimpl
from . import dspark_dp_meta


@hookimpl
def hostsync_slots():
    return [dspark_dp_meta.SLOT]
