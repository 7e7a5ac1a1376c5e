"""The slot tables (docs/slots.md), the preset lists (docs/settings.md, README.md) and the settings
table name exactly the slots, presets and settings the code has."""

import os
import re

from sglang_hostsync_plugin.registry import catalogue

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGE = os.path.join(ROOT, "sglang_hostsync_plugin")
DETAIL = "## Owned and tool slots in detail\n"
ROW = re.compile(r"^\| `([a-z_0-9]+)` \|", re.M)


def _read(*path: str) -> str:
    return open(os.path.join(ROOT, *path), encoding="utf-8").read()


README = _read("README.md")
SETTINGS = _read("docs", "settings.md")
SLOTS = _read("docs", "slots.md")


def _slot_pages() -> tuple[str, str]:
    """docs/slots.md split into its one-line tables (every slot) and its detail table (owned and tool)."""
    assert SLOTS.count(DETAIL) == 1
    glance, detail = SLOTS.split(DETAIL)
    return glance, detail


def _preset(name: str) -> set[str]:
    return {n for n, s in catalogue().items() if name in s.presets}


def _env_row(var: str) -> str:
    (row,) = [line for line in SETTINGS.splitlines() if line.startswith(f"| `{var}` |")]
    return row


def _package_envs() -> set[str]:
    names: set[str] = set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                names |= set(re.findall(r"SGLANG_(?:ENABLE_)?HOSTSYNC_[A-Z_]*[A-Z]", text))
    return names


def test_every_slot_has_a_row_in_a_slot_table_and_no_row_names_another():
    glance, _ = _slot_pages()
    rows = ROW.findall(glance)
    assert len(rows) == len(set(rows))
    assert set(rows) == set(catalogue())


def test_the_settings_table_lists_the_eagle_host_and_ngram_host_presets_as_the_catalogue_has_them():
    row = _env_row("SGLANG_HOSTSYNC_SLOTS")
    eagle = re.search(r"`eagle_host` \(the slots that cut EAGLE host work between graphs: (.*?); measured", row)
    ngram = re.search(r"`ngram_host` \(NGRAM's host-work slots (.*?); with `default`", row)
    assert set(re.findall(r"`([a-z_0-9]+)`", eagle.group(1))) == _preset("eagle_host")
    assert set(re.findall(r"`([a-z_0-9]+)`", ngram.group(1))) == _preset("ngram_host")
    assert "`dspark_mega` (the 17 sglang#45450 switches)" in row and len(_preset("dspark_mega")) == 17


def test_the_readme_preset_list_names_every_preset_and_no_other():
    listed = set()
    for line in README.split("\nPresets:\n", 1)[1].split("\n\n", 1)[0].splitlines():
        if line.startswith("- "):
            listed |= set(re.findall(r"`([a-z_0-9]+)`", line.split(":", 1)[0]))
    declared = {p for s in catalogue().values() for p in s.presets}
    assert listed == declared | {"default", "all", "none", "auto"}


def test_every_selection_the_readme_recommends_parses():
    from sglang_hostsync_plugin.config import parse_slot_spec

    specs = set(re.findall(r"`((?:default|-?[a-z_0-9]+)(?:,-?[a-z_0-9]+)+)`", README))
    specs |= set(re.findall(r"SGLANG_HOSTSYNC_SLOTS=([a-z_0-9,-]+)", README))
    assert "default,flashinfer,eagle_host,-metadata_glue_graph" in specs and len(specs) >= 6
    for spec in specs:
        parse_slot_spec(spec, catalogue())  # raises on an unknown token


def test_docs_slots_has_a_detail_row_for_every_owned_and_tool_slot_and_no_other():
    from sglang_hostsync_plugin.slot import SlotKind

    _, detail = _slot_pages()
    rows = set(ROW.findall(detail))
    assert rows == {n for n, s in catalogue().items() if s.kind in (SlotKind.OWNED, SlotKind.TOOL)}


def test_the_settings_table_has_a_row_for_every_setting_the_package_reads():
    rows = set()
    for line in SETTINGS.splitlines():
        if line.startswith("| `SGLANG_"):
            rows |= set(re.findall(r"`(SGLANG_[A-Z_]+)`", line.split(" | ")[0]))
    internal = {"SGLANG_HOSTSYNC_PLAN"}  # the launcher's plan for its children, never set by a user
    assert rows == _package_envs() - internal


def test_every_hostsync_setting_the_readme_names_exists():
    named = set(re.findall(r"SGLANG_(?:ENABLE_)?HOSTSYNC_[A-Z_]*[A-Z]", README))
    assert named and named <= _package_envs()


def test_no_text_a_user_reads_cites_an_internal_issue_number():
    """Users cannot look up this project's issue numbers: name the mechanism or the upstream PR."""
    texts = {"README.md": README}
    for folder, _, files in [*os.walk(os.path.join(ROOT, "docs")), *os.walk(PACKAGE)]:
        for name in files:
            if name.endswith((".md", ".py")):
                path = os.path.join(folder, name)
                texts[os.path.relpath(path, ROOT)] = open(path, encoding="utf-8").read()
    cited = {path: re.findall(r"\b[Ii]ssues? #?\d+", text) for path, text in texts.items()}
    assert {p: c for p, c in cited.items() if c} == {}
