"""The README's slot tables and preset lists, and docs/slots.md's rows, name exactly the slots the catalogue has."""

import os
import re

from sglang_hostsync_plugin.registry import catalogue

README = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md"), encoding="utf-8").read()


def _preset(name: str) -> set[str]:
    return {n for n, s in catalogue().items() if name in s.presets}


def _env_row(var: str) -> str:
    (row,) = [line for line in README.splitlines() if line.startswith(f"| `{var}` |")]
    return row


def test_every_slot_has_a_row_in_a_readme_slot_table_and_no_row_names_another():
    rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", README, re.M)) - {"env"}
    assert rows == set(catalogue())


def test_the_readme_lists_the_eagle_host_and_ngram_host_presets_as_the_catalogue_has_them():
    row = _env_row("SGLANG_HOSTSYNC_SLOTS")
    eagle = re.search(r"`eagle_host` \(the slots that cut EAGLE host work between graphs: (.*?); measured", row)
    ngram = re.search(r"`ngram_host` \(NGRAM's host-work slots (.*?); with `default`", row)
    assert set(re.findall(r"`([a-z_0-9]+)`", eagle.group(1))) == _preset("eagle_host")
    assert set(re.findall(r"`([a-z_0-9]+)`", ngram.group(1))) == _preset("ngram_host")
    assert "`dspark_mega` (the 17 #45450 switches)" in row and len(_preset("dspark_mega")) == 17


def test_docs_slots_has_a_row_for_every_owned_and_tool_slot_and_no_other():
    from sglang_hostsync_plugin.slot import SlotKind

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "slots.md")
    rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", open(path, encoding="utf-8").read(), re.M))
    assert rows == {n for n, s in catalogue().items() if s.kind in (SlotKind.OWNED, SlotKind.TOOL)}
