"""SGLANG_HOSTSYNC_SLOTS grammar, env switches and the version guard (pure)."""

import pytest

from sglang_hostsync_plugin import config, registry, version
from sglang_hostsync_plugin.config import HostsyncConfigError, parse_slot_spec
from sglang_hostsync_plugin.slot import Slot, SlotKind


def _slot(name, default=True, requires=(), conflicts=()):
    return Slot(name=name, kind=SlotKind.OWNED, origin="test", summary="", default=default,
                requires=requires, conflicts=conflicts)


CAT = {s.name: s for s in [
    _slot("a"), _slot("b"), _slot("c", default=False), _slot("d", default=False, requires=("c",)),
    _slot("e", default=False, conflicts=("a",)),
]}


@pytest.mark.parametrize("spec, expected", [
    ("", ("a", "b")),
    ("default", ("a", "b")),
    ("all,-e", ("a", "b", "c", "d")),
    ("none", ()),
    ("c", ("c",)),
    ("-a", ("b",)),                       # negation alone starts from default
    ("default,-a", ("b",)),
    ("-a,default", ("b",)),               # order-independent
    ("b,a", ("a", "b")),                  # catalogue order, not token order
    ("none,c,d", ("c", "d")),
    ("default,c,d", ("a", "b", "c", "d")),
    (" A , b ", ("a", "b")),              # case and spaces
    ("   ", ("a", "b")),                  # blank is empty: default
    ("all,-all", ()),
    ("all,-default,-e", ("c", "d")),
])
def test_grammar(spec, expected):
    assert parse_slot_spec(spec, CAT).names == expected


def test_unknown_token_names_it_and_lists_valid_slots():
    with pytest.raises(HostsyncConfigError) as exc:
        parse_slot_spec("default,bogus", CAT)
    msg = str(exc.value)
    assert "'bogus'" in msg and "Slots: a, b, c, d, e" in msg and "default, all, none" in msg
    with pytest.raises(HostsyncConfigError, match="'-nope'"):
        parse_slot_spec("-nope", CAT)


@pytest.mark.parametrize("spec, entry", [
    ("default,", "entry 2 of 2"),
    (",", "entry 1 of 2"),
    ("default,,-a", "entry 2 of 3"),
    (" , ", "entry 1 of 2"),
    (",default", "entry 1 of 2"),
    ("-a, ,c", "entry 2 of 3"),
])
def test_empty_entry_is_an_error_that_names_it(spec, entry):
    with pytest.raises(HostsyncConfigError) as exc:
        parse_slot_spec(spec, CAT)
    msg = str(exc.value)
    assert msg.startswith(f"SGLANG_HOSTSYNC_SLOTS={spec.strip()!r}: {entry} is empty"), msg
    assert "Slots: a, b, c, d, e" in msg and "default, all, none" in msg


@pytest.mark.parametrize("env", [{}, {config.ENV_SLOTS: ""}, {config.ENV_SLOTS: "   "}])
def test_unset_empty_or_blank_env_is_auto(env):
    from sglang_hostsync_plugin import choice, registry

    real = registry.catalogue()  # auto's rows name the real slots
    selection = config.selected_slots(real, env)
    assert selection.spec == "auto" and selection.auto
    assert set(selection.names) == choice.row_names(real, parse_slot_spec) > set(parse_slot_spec("default", real).names)


def test_empty_entry_error_is_truncated():
    with pytest.raises(HostsyncConfigError) as exc:
        parse_slot_spec("a," * 50_000, CAT)
    assert len(str(exc.value)) < 300 and "entry 50001 of 50001" in str(exc.value)


def test_missing_dependency_names_both():
    with pytest.raises(HostsyncConfigError, match="slot 'd' requires slot 'c'"):
        parse_slot_spec("d", CAT)
    with pytest.raises(HostsyncConfigError, match="'d' requires slot 'c'"):
        parse_slot_spec("all,-c,-e", CAT)


def test_conflict_names_both():
    with pytest.raises(HostsyncConfigError, match="'a' and 'e' conflict|'e' and 'a' conflict"):
        parse_slot_spec("a,e", CAT)


def test_conflict_says_how_to_resolve_it():
    with pytest.raises(HostsyncConfigError, match=r"add '-(a|e)' or '-(e|a)' to 'a,e'"):
        parse_slot_spec("a,e", CAT)


def test_flashinfer_and_eagle_host_presets_need_the_glue_graph_removed():
    # Both presets together always select the two conflicting switches (README, eagle_host).
    cat = registry.catalogue()
    with pytest.raises(HostsyncConfigError, match="'-metadata_glue_graph' or '-flashinfer_verify_host_plan'"):
        parse_slot_spec("default,flashinfer,eagle_host", cat)
    names = parse_slot_spec("default,flashinfer,eagle_host,-metadata_glue_graph", cat).names
    assert "flashinfer_verify_host_plan" in names and "metadata_glue_graph" not in names


def test_ngram_host_preset_is_the_ngram_host_slots_and_needs_the_default_readback():
    cat = registry.catalogue()
    members = {n for n, s in cat.items() if "ngram_host" in s.presets}
    assert members == {"ngram_full_mask", "ngram_late_wait"}
    names = parse_slot_spec("default,eagle_host,ngram_host", cat).names
    assert {"ngram_accept_readback", "ngram_full_mask", "ngram_late_wait"} <= set(names)
    assert set(parse_slot_spec("default,ngram_host,-ngram_late_wait", cat).names) == (
        set(parse_slot_spec("default", cat).names) | {"ngram_full_mask"})
    # ngram_late_wait requires ngram_accept_readback (a default slot): nothing is added behind the user's back.
    with pytest.raises(HostsyncConfigError, match="'ngram_late_wait' requires slot 'ngram_accept_readback'"):
        parse_slot_spec("ngram_host", cat)


def test_real_catalogue_default_and_kebab_case():
    cat = registry.catalogue()
    assert "dspark_dp_meta" in cat
    assert parse_slot_spec("dspark-dp-meta", cat).names == ("dspark_dp_meta",)
    assert parse_slot_spec("default", cat).names == tuple(n for n, s in cat.items() if s.default)


@pytest.mark.parametrize("raw, value", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("no", False)])
def test_env_bool(raw, value):
    assert config.plugin_enabled({config.ENV_ENABLE: raw}) is value


def test_env_bool_rejects_garbage():
    with pytest.raises(HostsyncConfigError, match="SGLANG_ENABLE_HOSTSYNC_PLUGIN='maybe'"):
        config.plugin_enabled({config.ENV_ENABLE: "maybe"})
    assert config.plugin_enabled({}) is False
    assert config.strict_mode({}) is True


def test_version_guard():
    assert version.check_sglang_version("0.5.23", env={}) is None
    with pytest.raises(HostsyncConfigError) as exc:
        version.check_sglang_version("0.5.22", env={})
    assert "sglang==0.5.23" in str(exc.value) and "sglang 0.5.22 is installed" in str(exc.value)
    warning = version.check_sglang_version("0.5.22", env={config.ENV_ALLOW_UNSUPPORTED: "1"})
    assert "0.5.22" in warning and "0.5.23" in warning
    with pytest.raises(HostsyncConfigError, match="no sglang is installed"):
        version.check_sglang_version(None, env={config.ENV_ALLOW_UNSUPPORTED: "1"})


def test_missing_sglang_message_does_not_suggest_the_override():
    with pytest.raises(HostsyncConfigError) as exc:
        version.check_sglang_version(None, env={})
    assert "no sglang is installed" in str(exc.value) and config.ENV_ALLOW_UNSUPPORTED not in str(exc.value)


def test_unknown_token_is_truncated_in_the_error():
    cat = {"a": _slot("a")}
    with pytest.raises(HostsyncConfigError) as exc:
        parse_slot_spec("x" * 100_000, cat)
    assert len(str(exc.value)) < 300 and "xxx..." in str(exc.value)


def test_sdist_ships_no_partial_test_suite(tmp_path):
    import subprocess
    import sys
    import tarfile

    from helpers import REPO

    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (archive,) = tmp_path.glob("*.tar.gz")
    names = tarfile.open(archive).getnames()
    assert not [n for n in names if "/tests/" in n or "/benchmarks/" in n], names
    assert any(n.endswith("csrc/eagle_tail.cu") for n in names)
    assert any(n.endswith("sglang_hostsync_plugin/e2e/run.py") for n in names)
    # The license and the package metadata a registry page shows.
    (license_file,) = [n for n in names if n.count("/") == 1 and n.endswith("/LICENSE")]
    with tarfile.open(archive) as tar:
        assert b"Apache License\n                           Version 2.0" in tar.extractfile(license_file).read()
        (pkg_info,) = [n for n in names if n.count("/") == 1 and n.endswith("/PKG-INFO")]
        meta = tar.extractfile(pkg_info).read().decode()
    assert "\nLicense: Apache-2.0\n" in meta and "Description-Content-Type: text/markdown" in meta, meta[:2000]
    assert "\n# sglang-hostsync-plugin\n" in meta  # README as the long description


def test_all_is_a_valid_selection_even_with_conflicting_slots():
    from sglang_hostsync_plugin import registry

    cat = registry.catalogue()
    names = parse_slot_spec("all", cat).names
    # The glue graph is declared after the owned flashinfer_tree_verify_plan it must not run
    # beside (unsafe_with), so "all" leaves it out; then its conflict partner fits.
    assert "metadata_glue_graph" not in names and "flashinfer_verify_host_plan" in names
    # eagle_step_graph is declared after the glue slots it must not run beside: "all" leaves it out too.
    assert "flashinfer_tree_verify_plan" in names and "draft_extend_glue_graph" in names
    # Of the slots declared after the switches (slots.OWNED_LATE), the NGRAM device draft conflicts with the
    # late wait and dspark_step_graph must not run beside DSpark's epilogue and KV-commit switches: both left out.
    assert set(cat) - set(names) == {"metadata_glue_graph", "eagle_step_graph", "ngram_device_draft", "dspark_step_graph"}
    # The other side of the conflict is still selectable by name, alone.
    swapped = parse_slot_spec("all,-flashinfer_verify_host_plan,metadata_glue_graph", cat).names
    assert "metadata_glue_graph" in swapped and "flashinfer_verify_host_plan" not in swapped
    with pytest.raises(HostsyncConfigError, match="conflict"):
        parse_slot_spec("all,metadata_glue_graph", cat)


def test_env_count_defaults_on_unset_or_empty_and_refuses_below_its_minimum():
    from sglang_hostsync_plugin.config import HostsyncConfigError, env_count

    assert env_count("N", 7, {}) == 7 and env_count("N", 7, {"N": " "}) == 7 and env_count("N", 7, {"N": "3"}) == 3
    assert env_count("N", 0, {"N": "0"}, minimum=0) == 0
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(HostsyncConfigError, match="N='.*': use a positive number of steps"):
            env_count("N", 7, {"N": bad})
    with pytest.raises(HostsyncConfigError, match="replays"):
        env_count("N", 0, {"N": "-1"}, minimum=0, hint="use 0 (off) or a positive number of glued replays")
