"""pluggy hook specifications: how slots (built-in or third-party) are declared."""

from __future__ import annotations

import pluggy

PROJECT = "sglang_hostsync"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class SlotSpecs:
    @hookspec
    def hostsync_slots(self) -> list:
        """Return the `Slot` objects this plugin provides (see `slot.Slot`)."""
