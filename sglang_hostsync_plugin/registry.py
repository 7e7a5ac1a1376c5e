"""The slot catalogue: built-in slots plus those of third-party packages.

Third-party packages declare an entry point in group ``sglang_hostsync.slots``
pointing at a module or object with a ``@hookimpl def hostsync_slots()``; they go
through the same hook spec, installer and report as the built-in slots.
"""

from __future__ import annotations

import functools

import pluggy

from .hookspecs import PROJECT, SlotSpecs
from .slot import Slot

SLOT_ENTRY_POINT_GROUP = "sglang_hostsync.slots"


class SlotRegistryError(RuntimeError):
    pass


def make_plugin_manager() -> pluggy.PluginManager:
    from . import slots as builtin

    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(SlotSpecs)
    pm.register(builtin, name="builtin")
    pm.load_setuptools_entrypoints(SLOT_ENTRY_POINT_GROUP)
    return pm


def collect(pm: pluggy.PluginManager) -> dict[str, Slot]:
    """Name -> slot, built-ins first, in declaration order."""
    catalogue: dict[str, Slot] = {}
    # pluggy calls the last registered first; reverse to keep built-ins first.
    for batch in reversed(pm.hook.hostsync_slots()):
        for slot in batch:
            if not isinstance(slot, Slot):
                raise SlotRegistryError(f"hostsync_slots returned {slot!r}, not a Slot")
            if slot.name in catalogue:
                raise SlotRegistryError(
                    f"slot {slot.name!r} is declared twice "
                    f"({catalogue[slot.name].provider} and {slot.provider})"
                )
            catalogue[slot.name] = slot
    for slot in catalogue.values():
        for dep in (*slot.requires, *slot.conflicts, *(other for other, _ in slot.unsafe_with)):
            if dep not in catalogue:
                raise SlotRegistryError(f"slot {slot.name!r} names unknown slot {dep!r}")
    return catalogue


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, Slot]:
    """The process-wide catalogue (entry points are read once per process)."""
    return collect(make_plugin_manager())
