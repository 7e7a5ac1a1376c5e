"""Startup defects of issue 14 that this tree fixes, each through the path where it
lived: the env switch in the launcher, the audit's file outputs, the packaged
kernel sources, and kernel builds moved out of the serving path."""

import importlib.resources
import json
import os
import sys

import pytest

from helpers import LOAD_AND_STARTUP_CHECK, REPO, clean_env, out, run_concurrently, run_process, run_python
from sglang_hostsync_plugin import csrc, runtime
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import audit, eagle_fixed_shape_tail as eft

# launch_server's own order: load_plugins() at import, then prepare_server_args.
LAUNCHER = """
import json, logging, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
try:
    prepare_server_args(["--model-path", "dummy"] + sys.argv[1:])
    err = None
except Exception as exc:
    err = f"{type(exc).__name__}: {exc}"
print("RESULT" + json.dumps({"err": err}))
"""


def test_env_switch_launch_passes_argument_preparation_strict():
    # Defect 1: with the switch exported, load_plugins() installs the replacement classes
    # in the launcher; argument preparation must not shape-check those as upstream code.
    proc = run_python(LAUNCHER, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_STRICT="1")
    assert proc.returncode == 0, out(proc)
    assert json.loads(proc.stdout.split("RESULT", 1)[1])["err"] is None, out(proc)
    log = proc.stderr + proc.stdout
    # The line names the slots that act; the inert ones (dspark_dp_meta without DSpark) only as a count.
    enabled = next(ln for ln in log.splitlines() if "hostsync: enabled; slots: " in ln)
    assert "event_ring" in enabled and "dspark_dp_meta" not in enabled, enabled
    assert "(also selected: " in enabled and " inert for these server arguments)" in enabled, enabled
    # The env warnings and the version line are logged once, by activate().
    assert log.count("upstream shape changed") == 0


def test_env_switch_and_flag_together_also_pass():
    proc = run_process([sys.executable, "-c", LAUNCHER, "--enable-hostsync-plugin"],
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1"), cwd=REPO, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout.split("RESULT", 1)[1])["err"] is None, out(proc)


def test_env_switch_launch_still_refuses_a_bad_slot_token():
    proc = run_python(LAUNCHER, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,nope")
    err = json.loads(proc.stdout.split("RESULT", 1)[1])["err"]
    assert err.startswith("HostsyncConfigError") and "'nope'" in err, out(proc)


# --- defect 4: the audit's file outputs ---------------------------------------------

@pytest.mark.parametrize("bad", ["/proc/nope.json", "{tmp}", "{tmp}/missing/dir/a.json"])
def test_bad_audit_output_paths_refuse_the_slot_at_startup(tmp_path, monkeypatch, bad):
    path = bad.format(tmp=tmp_path)
    for env in (audit.ENV_JSON, audit.ENV_TRACE):
        monkeypatch.setenv(env, path)
        reason = audit.SLOT.precheck()
        assert reason and reason.startswith(f"bad configuration: {env}="), reason
        monkeypatch.delenv(env)
    assert audit.SLOT.precheck() is None


def test_a_good_output_path_is_checked_without_leaving_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv(audit.ENV_TRACE, str(tmp_path / "t.tsv"))
    assert audit.SLOT.precheck() is None and not (tmp_path / "t.tsv").exists()


def test_output_that_fails_while_serving_is_logged_once_and_never_raises(tmp_path, caplog):
    target = tmp_path / "gone" / "summary.json"
    output = audit._Output(str(target))
    with caplog.at_level("ERROR", logger="sglang.srt.plugins.hostsync"):
        output.write("{}", append=False)
        output.write("{}", append=False)
    assert output.broken and caplog.text.count("cannot write") == 1


def test_audit_trace_through_the_run_batch_hook(tmp_path, monkeypatch):
    from audit_cases import FakeScheduler

    monkeypatch.setattr(audit, "_audit", None)
    monkeypatch.setattr(audit, "_meter", None)
    monkeypatch.setattr(audit, "_trace", None)
    monkeypatch.setattr(audit, "_last_thread_ns", None)
    monkeypatch.setattr(audit.atexit, "register", lambda *a, **k: None)
    path = tmp_path / "trace.tsv"
    monkeypatch.setenv(audit.ENV_TRACE, str(path))

    class Mode:
        def __init__(self, decode):
            self.decode = decode

        def is_decode(self):
            return self.decode

    class Batch:
        def __init__(self, decode):
            self.forward_mode = Mode(decode)

    try:
        # Up to the first pass that has a full batch of lines to format: they are written.
        n = -(-audit.TRACE_BATCH // audit.PROCESS_EVERY) * audit.PROCESS_EVERY
        for i in range(n):
            audit.run_batch_hook(lambda s, b, pp_proxy_tensors=None: None, FakeScheduler(), Batch(i != 3))
        steps = audit.parse_trace(path.read_text())
        assert [s.step for s in steps] == list(range(n))
        assert [s.decode for s in steps[:5]] == [True, True, True, False, True]
        assert all(s.sites == () for s in steps) and steps[1].host_us >= 0
        # No meter without CUDA, so no lead: the trace still carries every launch time.
        assert all(s.t_launch > 0 for s in steps)
        # The per-step state is pruned once written and collected: bounded in a long run.
        state = audit._audit.state
        assert len(state.decode) <= audit.PROCESS_EVERY + 2 and len(state.host_launch) <= audit.PROCESS_EVERY + 2
    finally:
        audit._audit.disarm()


# --- defect 8: packaged kernel sources come from the package --------------------------

def test_source_path_prefers_the_packaged_copy(tmp_path, monkeypatch):
    packaged = tmp_path / "pkg"
    packaged.mkdir()
    (packaged / "eagle_tail.cu").write_text("// packaged")
    monkeypatch.setattr(importlib.resources, "files", lambda name: packaged)
    assert csrc.source_path("eagle_tail.cu") == str(packaged / "eagle_tail.cu")


def test_source_path_outside_a_checkout_never_looks_next_to_the_package(tmp_path, monkeypatch):
    # An installed wheel: no packaged file, no setup.py beside the package; a planted
    # <site-packages>/csrc/ file must not be picked up.
    site = tmp_path / "site"
    (site / "csrc").mkdir(parents=True)
    (site / "csrc" / "eagle_tail.cu").write_text("// planted")
    (site / "sglang_hostsync_plugin").mkdir()
    monkeypatch.setattr(importlib.resources, "files", lambda name: tmp_path / "empty")
    monkeypatch.setattr(csrc, "__file__", str(site / "sglang_hostsync_plugin" / "csrc.py"))
    with pytest.raises(FileNotFoundError):
        csrc.source_path("eagle_tail.cu")


# --- defect 9: kernels build before the server is ready -------------------------------

def facts(algo="STANDALONE", topk=4, page=16, dp=False, **env):
    return ServingFacts(speculative_algorithm=algo, topk=topk, page_size=page, dp_attention=dp, env=env)


def test_kernels_follow_the_server_arguments(monkeypatch):
    from sglang_hostsync_plugin import registry

    monkeypatch.setattr(csrc, "unavailable_reason", lambda: None)  # as on a CUDA machine
    slots = list(registry.catalogue().values())
    assert runtime.kernels_for(slots, facts()) == ("eagle_tail",)
    assert runtime.kernels_for(slots, facts(algo="EAGLE3")) == ("eagle_tail",)
    assert runtime.kernels_for(slots, facts(topk=1)) == ()
    assert runtime.kernels_for(slots, facts(page=1)) == ()
    assert runtime.kernels_for(slots, facts(algo="NGRAM")) == ()
    assert runtime.kernels_for(slots, facts(SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL="triton")) == ()
    assert runtime.kernels_for(slots, facts(algo="DSPARK", topk=1, page=1, dp=True)) == ("h2d_stage",)
    assert runtime.kernels_for(slots, facts(dp=True)) == ("h2d_stage", "eagle_tail")  # catalogue order
    monkeypatch.setattr(csrc, "unavailable_reason", lambda: "no CUDA device")
    assert runtime.kernels_for(slots, facts(dp=True)) == ()


def test_prebuild_starts_once_in_the_background(monkeypatch):
    started = []

    class Proc:
        pid = 4242

    monkeypatch.setattr(csrc, "_prebuild", None)
    monkeypatch.setattr(csrc.subprocess, "Popen", lambda argv, **kw: started.append(argv) or Proc())
    assert csrc.start_prebuild(()) is None and not started
    assert csrc.start_prebuild(("eagle_tail",)).pid == 4242
    assert csrc.start_prebuild(("eagle_tail",)) is None
    assert started == [[sys.executable, "-m", "sglang_hostsync_plugin", "prebuild", "eagle_tail"]]


def test_prepare_loads_the_kernel_or_falls_back_under_auto(monkeypatch, caplog):
    monkeypatch.setattr(csrc, "unavailable_reason", lambda: None)
    loaded = []
    monkeypatch.setattr(csrc, "load", lambda name: loaded.append(name))
    monkeypatch.setattr(eft, "_impl", None)
    assert eft.prepare(facts()).startswith("csrc/eagle_tail.cu loaded") and eft._impl == "cuda"
    assert loaded == ["eagle_tail"]
    assert eft.prepare(facts(topk=1)) == ""

    def broken(name):
        raise RuntimeError("nvcc exploded")

    monkeypatch.setattr(csrc, "load", broken)
    with caplog.at_level("WARNING", logger="sglang.srt.plugins.hostsync"):
        assert eft.prepare(facts()).startswith("fallback") and eft._impl == "triton"
    assert "nvcc exploded" in caplog.text
    monkeypatch.setenv(eft.ENV_IMPL, "cuda")  # asked for explicitly: the failure stops startup
    with pytest.raises(RuntimeError, match="nvcc exploded"):
        eft.prepare(facts())


def test_prebuild_command_without_a_gpu_builds_nothing_and_says_so():
    proc = run_process([sys.executable, "-m", "sglang_hostsync_plugin", "prebuild"],
                       env=clean_env(CUDA_VISIBLE_DEVICES=""), cwd=REPO, timeout=300)
    assert proc.returncode == 0 and "nothing built" in proc.stdout, out(proc)
    bad = run_process([sys.executable, "-m", "sglang_hostsync_plugin", "prebuild", "nope"], env=clean_env(), cwd=REPO,
                      timeout=300)
    assert bad.returncode == 2 and "unknown kernel" in bad.stderr, out(bad)


# --- defect 6 and part of 7: bad input is an error everywhere, and the doctor agrees --------

def test_empty_strict_means_unset_not_lenient():
    from sglang_hostsync_plugin import config

    assert config.strict_mode({config.ENV_STRICT: ""}) is True
    assert config.strict_mode({config.ENV_STRICT: "  "}) is True
    assert config.plugin_enabled({config.ENV_ENABLE: ""}) is False


@pytest.mark.parametrize("env", [
    {"SGLANG_HOSTSYNC_STAGING_IMPL": "fast"},
    {"SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL": "fast"},
    {"SGLANG_HOSTSYNC_AUDIT_EVERY": "often", "SGLANG_HOSTSYNC_SLOTS": "default,audit"},
])
def test_bad_slot_env_values_fail_argument_preparation_even_lenient(env):
    stricts = ("0", "", "1")
    procs = run_concurrently([
        lambda strict=strict: run_process([sys.executable, "-c", LAUNCHER, "--enable-hostsync-plugin"],
                                          env=clean_env(SGLANG_HOSTSYNC_STRICT=strict, **env), cwd=REPO, timeout=300)
        for strict in stricts])
    for strict, proc in zip(stricts, procs):
        err = json.loads(proc.stdout.split("RESULT", 1)[1])["err"]
        assert err and err.startswith("HostsyncConfigError") and list(env)[0] in err, (strict, out(proc))


def doctor(monkeypatch, capsys, **env):
    """``sglang-hostsync doctor --json`` under the environment a child of ``clean_env(**env)`` gets, run in
    this process (the doctor hooks nothing and reads the environment when it runs): (exit code, stdout).
    ``python -m`` and the console script around the same ``main`` run in test_plugin_load's children."""
    from sglang_hostsync_plugin import doctor as doctor_module

    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("SGLANG_")]:
            m.delenv(name)
        for name, value in clean_env(**env).items():
            m.setenv(name, value)
        code = doctor_module.main(["doctor", "--json"])
    return code, capsys.readouterr().out


def test_doctor_exit_codes_match_what_the_server_does(monkeypatch, capsys):
    # (env, doctor exit code, what the server does)
    table = [
        ({}, 0, "starts"),
        ({"SGLANG_HOSTSYNC_STAGING_IMPL": "fast"}, 2, "argument preparation fails"),
        ({"SGLANG_HOSTSYNC_STAGING_IMPL": "fast", "SGLANG_HOSTSYNC_STRICT": "0"}, 2, "argument preparation fails"),
        # audit is not selected: its bad value is never read, and the server starts.
        ({"SGLANG_HOSTSYNC_AUDIT_EVERY": "often"}, 0, "starts"),
        ({"SGLANG_HOSTSYNC_AUDIT_EVERY": "often", "SGLANG_HOSTSYNC_SLOTS": "default,audit"}, 2, "argument preparation fails"),
        ({"SGLANG_HOSTSYNC_SLOTS": "default,nope"}, 2, "argument preparation fails"),
        ({"SGLANG_HOSTSYNC_STRICT": "2"}, 2, "argument preparation fails"),
        ({"SGLANG_HOSTSYNC_AUDIT_JSON": "/proc/nope.json", "SGLANG_HOSTSYNC_SLOTS": "default,audit"}, 2,
         "argument preparation fails"),
    ]
    launches = run_concurrently([
        lambda env=env: run_process([sys.executable, "-c", LAUNCHER, "--enable-hostsync-plugin"],
                                    env=clean_env(**env), cwd=REPO, timeout=300)
        for env, _, _ in table])
    for (env, code, server), launch in zip(table, launches):
        got, stdout = doctor(monkeypatch, capsys, **env)
        assert got == code, (env, stdout)
        report = json.loads(stdout)  # --json prints JSON on every exit, errors too
        assert report["ok"] is (code == 0), (env, report)
        err = json.loads(launch.stdout.split("RESULT", 1)[1])["err"]
        assert (err is None) == (server == "starts"), (env, err)


# --- defects 2 and 3: one slot's failure stays that slot's --------------------------------

REPORT = """
import json
from sglang.srt.plugins.hook_registry import HookRegistry
print("RESULT" + json.dumps({"err": err, "status": {n: [s.status.value, s.reason] for n, s in rt.state.statuses.items()},
    "run_batch_hooks": len(HookRegistry._hooks.get("sglang.srt.managers.scheduler.Scheduler.run_batch", []))}))
"""


def check_code(pre: str = "") -> str:
    return pre + "\n" + LOAD_AND_STARTUP_CHECK + REPORT
DRIFT = "from sglang.srt.speculative import spec_info\ndel spec_info.spec_scale_global_num_tokens"


def check(pre="", **env):
    proc = run_python(check_code(pre), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", **env)
    assert proc.returncode == 0, out(proc)
    return json.loads(proc.stdout.split("RESULT", 1)[1]), proc


def test_an_upstream_rename_refuses_only_the_slots_that_import_it():
    res, proc = check(DRIFT, SGLANG_HOSTSYNC_STRICT="0")
    st = res["status"]
    for name in ("dspark_dp_meta", "target_dp_meta"):
        assert st[name][0] == "failed" and "did not import: ImportError" in st[name][1], (name, st[name])
        assert "spec_scale_global_num_tokens" in st[name][1]
    # accept_lens_snapshot's target module (DSpark's worker) imports the renamed function too.
    assert st["accept_lens_snapshot"][0] == "failed" and "target missing" in st["accept_lens_snapshot"][1]
    failed = {n: reason for n, (state, reason) in st.items() if state == "failed"}
    # Every refusal names the rename (host_envelope_bound's contract check imports it too).
    assert all("spec_scale_global_num_tokens" in reason for reason in failed.values()), failed
    assert st["eagle_fixed_shape_tail"][0] == "applied" and st["event_ring"][0] == "applied", st
    assert res["err"] is None
    strict, _ = check(DRIFT)
    assert strict["err"].startswith("HostsyncStartupError") and "dspark_dp_meta" in strict["err"]
    deselected, _ = check(DRIFT, SGLANG_HOSTSYNC_SLOTS="default," + ",".join(f"-{n}" for n in failed))
    assert deselected["err"] is None, deselected


RUN_BATCH_DIST = {
    "rb_slots.py": '''
from sglang_hostsync_plugin.hookspecs import hookimpl
from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

def wrap(original, *args, **kwargs):
    return original(*args, **kwargs)

@hookimpl
def hostsync_slots():
    return [Slot(name="rb_hook", kind=SlotKind.OWNED, origin="test", summary="", default=False,
                 targets=(HookTarget("sglang.srt.managers.scheduler.Scheduler.run_batch", TargetKind.FUNCTION, hook=wrap),))]
''',
    "rb_slots-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: rb-slots\nVersion: 0.1\n",
    "rb_slots-0.1.dist-info/entry_points.txt": "[sglang_hostsync.slots]\nrb = rb_slots\n",
}


def test_two_slots_on_one_target_are_both_refused_and_nothing_of_them_is_hooked(tmp_path):
    for rel, text in RUN_BATCH_DIST.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = run_python(check_code(), pythonpath=str(tmp_path), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
                      SGLANG_HOSTSYNC_SLOTS="default,audit,rb_hook", SGLANG_HOSTSYNC_STRICT="0")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    st = res["status"]
    assert st["audit"][0] == "failed" and "conflicts with slot(s) rb_hook" in st["audit"][1], st["audit"]
    assert st["rb_hook"][0] == "failed" and "conflicts with slot(s) audit" in st["rb_hook"][1]
    assert st["dspark_dp_meta"][0] == "applied" and res["err"] is None
    assert res["run_batch_hooks"] == 0
    strict = run_python(check_code(), pythonpath=str(tmp_path), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
                        SGLANG_HOSTSYNC_SLOTS="default,audit,rb_hook")
    err = json.loads(strict.stdout.split("RESULT", 1)[1])["err"]
    assert err.startswith("HostsyncStartupError") and "rb_hook" in err and "audit" in err, out(strict)


def test_doctor_rejects_an_unknown_algorithm_with_exit_2(capsys):
    from sglang_hostsync_plugin import doctor as doctor_module

    code = doctor_module.main(["doctor", "--json", "--speculative-algorithm", "NOPE"])
    cap = capsys.readouterr()
    assert code == 2 and "NOPE" in json.loads(cap.out)["error"], cap
