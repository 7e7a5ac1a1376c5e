"""The plugin inside real SGLang 0.5.23: parser, load_plugins(), HookRegistry.

Every test that applies hooks runs in a fresh interpreter (HookRegistry patches
are process-global and rebind module globals)."""

import json
import re
import os
import sys

import pytest

from helpers import (BUILTINS, HOST_PLAN_FLAGS, LOAD_AND_STARTUP_CHECK, REPO, SWITCH_FLAGS, clean_env, out,
                     run_concurrently, run_process, run_python)

PRINT_HOOKS = """
from sglang.srt.plugins.hook_registry import HookRegistry
def ours():
    return sorted(t for t, hooks in HookRegistry._hooks.items()
                  if any((getattr(h, "__module__", "") or "").startswith("sglang_hostsync_plugin")
                         or hasattr(h, "hostsync_slots") for _, h, _ in hooks))
"""


def test_flag_in_launch_server_help():
    proc = run_process([sys.executable, "-m", "sglang.launch_server", "--help"], env=clean_env(), timeout=300, cwd=REPO)
    assert proc.returncode == 0, out(proc)
    assert "--enable-hostsync-plugin" in proc.stdout, out(proc)


def test_disabled_registers_only_cli_shim_and_launcher_gate_and_flag_sets_env():
    proc = run_python(PRINT_HOOKS + """
    import json, os
    import sglang_hostsync_plugin
    from sglang.srt.plugins import load_plugins
    load_plugins()
    disabled = ours()
    n = len(HookRegistry._hooks["sglang.srt.server_args.ServerArgs.add_cli_args"])
    sglang_hostsync_plugin.register()   # idempotent
    again = len(HookRegistry._hooks["sglang.srt.server_args.ServerArgs.add_cli_args"])
    before = os.environ.get("SGLANG_ENABLE_HOSTSYNC_PLUGIN")
    from sglang.srt.server_args import prepare_server_args
    args = prepare_server_args(["--model-path", "dummy", "--enable-hostsync-plugin"])
    print("RESULT" + json.dumps({"disabled": disabled, "n": n, "again": again, "before": before,
        "after": os.environ.get("SGLANG_ENABLE_HOSTSYNC_PLUGIN"), "type": type(args).__name__}))
    """.replace("\n    ", "\n"))
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["disabled"] == ["sglang.srt.entrypoints.engine._set_envs_and_config",
                               "sglang.srt.server_args.ServerArgs.add_cli_args",
                               "sglang.srt.server_args.prepare_server_args"]
    assert res["n"] == res["again"] == 1
    assert res["before"] is None and res["after"] == "1" and res["type"] == "ServerArgs"
    # The line names the slots that act; the inert ones (dspark_dp_meta without DSpark) only as a count.
    enabled = next(ln for ln in (proc.stderr + proc.stdout).splitlines() if "hostsync: enabled; slots: " in ln)
    assert "event_ring" in enabled and "dspark_dp_meta" not in enabled, enabled
    assert "(also selected: " in enabled and " inert for these server arguments)" in enabled, enabled


def test_the_enabled_line_names_acting_slots_and_counts_inert_and_refused_ones():
    from types import SimpleNamespace

    from sglang_hostsync_plugin.cli import enabled_line
    from sglang_hostsync_plugin.plan import NOT_PICKED, Verdict
    from sglang_hostsync_plugin.slot import Status

    def line(*verdicts):
        return enabled_line(SimpleNamespace(verdicts=verdicts))

    acts = (Verdict("a", True, Status.WOULD_APPLY), Verdict("b", True, Status.UPSTREAM), Verdict("c", True, Status.APPLIED))
    inert = Verdict("d", True, Status.SKIPPED, "inert because --speculative-algorithm is unset")
    refused = Verdict("e", True, Status.FAILED, "upstream shape changed: x")
    others = (Verdict("f", False, Status.WOULD_APPLY), Verdict("g", True, Status.SKIPPED, f"{NOT_PICKED} for x"))
    assert line(*acts, *others) == "a, b, c"
    assert line(*acts, inert, refused, *others) == \
        "a, b, c (also selected: 1 inert for these server arguments; 1 refused)"
    assert line(inert, refused, *others) == "none (also selected: 1 inert for these server arguments; 1 refused)"
    assert line(*others) == "none"


def test_bad_slot_token_fails_argument_preparation():
    proc = run_python("""
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    prepare_server_args(["--model-path", "dummy", "--enable-hostsync-plugin"])
    """, SGLANG_HOSTSYNC_SLOTS="default,bogus_slot")
    assert proc.returncode != 0, out(proc)
    assert "HostsyncConfigError" in proc.stderr and "'bogus_slot'" in proc.stderr, out(proc)
    assert "Slots: dspark_dp_meta" in proc.stderr, out(proc)


def test_enabled_applies_verifies_and_logs_status_block():
    proc = run_python(PRINT_HOOKS + """
    import json, logging
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime, installer
    rt = runtime.current()
    runtime.startup_check(rt)
    from sglang.srt.speculative.dspark_components import dspark_draft
    import sglang.srt.speculative.dspark_components.dspark_worker_v2 as worker
    cls = dspark_draft.DraftBlockProposer
    print("RESULT" + json.dumps({
        "hooks": ours(),
        "status": {n: [s.status.value, s.reason] for n, s in rt.state.statuses.items()},
        "cls": cls.__name__, "slots": list(cls.hostsync_slots),
        "bases": [b.__name__ for b in cls.__mro__[:3]],
        "nnp": dspark_draft._make_num_token_non_padded(4, "cpu"),
        "worker_sees": worker.DraftBlockProposer is cls,
        "sched": installer.hook_in_place(runtime.SCHEDULER_INIT, runtime._scheduler_gate),
    }))
    """.replace("\n    ", "\n"), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    status = res["status"]
    assert status.pop("dspark_dp_meta") == ["applied", ""]
    assert status.pop("eagle_fixed_shape_tail") == ["applied", ""]
    assert status.pop("draft_input_reuse") == ["applied", ""]
    for name in ("event_ring", "accept_lens_snapshot", "target_dp_meta", "flashinfer_plan_guard",
                 "flashinfer_tree_verify_plan", "ngram_accept_readback"):
        assert status.pop(name) == ["applied", ""], name
    # Unset is auto; no server args reached this process, so its pick settled on default and says so.
    from sglang_hostsync_plugin import choice, config, registry

    cat = registry.catalogue()
    union = choice.row_names(cat, config.parse_slot_spec) - set(config.parse_slot_spec("default", cat).names)
    assert union and all(status[n] == ["skipped", "not picked by auto for not measured (the server facts left the "
                                       "configuration open) (it picks default)"] for n in union), status
    status.update({n: ["skipped", "not selected"] for n in union})
    # default: the #31468 built-ins verified, the #45450 switches opt-in.
    assert status == {**{n: ["upstream present", ""] for n in BUILTINS},
                      **{n: ["skipped", "not selected"] for n in [*SWITCH_FLAGS, *HOST_PLAN_FLAGS, "audit", "pinned_d2h_ring",
                                                                 "draft_extend_glue_graph", "fused_tree_compact", "fused_draft_page_locs",
                                                                 "greedy_row_argmax", "ngram_full_mask", "ngram_late_wait", "draft_decode_glue_graph",
                                                                 "fused_relay_stash", "draft_extend_topk_graph", "small_copy_launch", "draft_vocab_topk",
                                                                 "triton_replay_launch", "spec_kernel_replay", "mamba_verdict_once",
                                                                 "isolation_snapshot", "decode_lens_lazy_h2d", "chain_tree_full_mask", "eagle_step_graph",
                                                                 "ngram_device_draft", "dflash_step_graph", "dspark_step_graph",
                                                                 "draft_extend_fused_layout", "audit_fine", "audit_block", "audit_ngram",
                                                                 "flashinfer_device_plan", "flashinfer_prefill_host_indptr"]}}
    assert res["cls"] == "HostsyncDraftBlockProposer" and res["slots"] == ["dspark_dp_meta"]
    assert res["bases"] == ["HostsyncDraftBlockProposer", "DSparkDpMetaProposer", "DraftBlockProposer"]
    assert res["nnp"] is None and res["sched"] is True
    assert res["worker_sees"] is True  # the worker module's import was rebound too
    assert set(res["hooks"]) >= {
        "sglang.srt.speculative.dspark_components.dspark_draft.DraftBlockProposer",
        "sglang.srt.speculative.dspark_components.dspark_draft._make_num_token_non_padded",
        "sglang.srt.managers.scheduler.Scheduler.__init__",
        "sglang.srt.entrypoints.engine._set_envs_and_config",
        "sglang.srt.speculative.eagle_worker_common.duplicate_prefix_tail_to_draft_branches",
        "sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2",
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner._publish_read_done",
        "sglang.srt.managers.scheduler.Scheduler.init_overlap",
        "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2._block_accept_lens",
        "sglang.srt.managers.utils.GenerationBatchResult.copy_to_cpu",
    }
    log = proc.stderr
    assert "hostsync: sglang 0.5.23, SGLANG_HOSTSYNC_SLOTS='auto', strict=True" in log, out(proc)
    assert ("auto: not measured (the server facts left the configuration open): the conservative set; pin it with "
            "SGLANG_HOSTSYNC_SLOTS=default") in log, out(proc)
    assert "dspark_dp_meta               applied" in log, out(proc)
    assert re.search(r"hostsync: set up in \d+\.\d\d s in this process \(plan resolved: targets imported and checked, "
                     r"hooks registered\)", log), out(proc)


def test_opt_in_slots_apply_and_run_through_the_hook_registry():
    proc = run_python("""
    import json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    import sglang.srt.managers.utils as mutils, sglang.srt.utils.common as ucommon
    from sglang.srt.model_executor import forward_batch_info
    from hostsync_drivers import Patcher
    from hostsync_drivers.target_dp_meta import (make_decode_batch, make_forward_batch, make_model_runner,
        make_schedule_batch, stand_in_parallel_state)
    from sglang_hostsync_plugin.slots import target_dp_meta
    rt = runtime.current()
    runtime.startup_check(rt)
    forward_batch_info.enable_num_token_non_padded = lambda: True
    fb = make_forward_batch(8, "cpu")
    fb._init_num_token_non_padded(device="cpu", is_draft_worker=False)
    fb.init_mlp_sync_metadata(make_schedule_batch([3, 0, 5], [1, 0, 1]), "cpu")
    stand_in_parallel_state(Patcher(), "cpu")
    eager = make_decode_batch(2, "cpu", [2, 4])
    eager.prepare_mlp_sync_batch(make_model_runner())  # through the edited method
    print("RESULT" + json.dumps({
        "padded": eager.global_num_tokens_gpu.tolist(),
        "status": [rt.state.statuses[n].status.value for n in ("pinned_d2h_ring", "target_dp_meta")],
        "rebound": mutils._async_d2h is ucommon.async_d2h and hasattr(ucommon.async_d2h, "__wrapped__"),
        "counts": fb.global_num_tokens_gpu.tolist(), "nnp": fb.global_num_token_non_padded.item(),
        "staged": [s.allocations for s in target_dp_meta.stagers()],
    }))
    """.replace("\n    ", "\n"), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
        SGLANG_HOSTSYNC_SLOTS="default,pinned_d2h_ring,target_dp_meta")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["status"] == ["applied", "applied"]
    # managers/utils imports it as `_async_d2h`: the patch must reach that alias too.
    assert res["rebound"] is True
    # The ForwardBatch methods went through target_dp_meta's stagers.
    assert res["counts"] == [3, 0, 5] and res["nnp"] == 8 and res["staged"] == [1, 1, 1]
    assert res["padded"] == [4, 4]


BOGUS_DIST = {
    "bogus_slots.py": '''
from sglang_hostsync_plugin.hookspecs import hookimpl
from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

CALLS = []

def mark(original, *args, **kwargs):
    CALLS.append(args)
    return original(*args, **kwargs)

REAL = "sglang.srt.speculative.spec_info.spec_scale_global_num_tokens"

@hookimpl
def hostsync_slots():
    return [
        # Its second target does not exist: refused before any hook is registered.
        Slot(name="bogus_missing", kind=SlotKind.OWNED, origin="test", summary="", default=False,
             targets=(HookTarget(REAL, TargetKind.FUNCTION, hook=mark),
                      HookTarget("sglang.srt.no_such_module.no_such_fn", TargetKind.FUNCTION, hook=mark))),
        # Resolves and registers, but SGLang cannot apply an AROUND hook to a class:
        # only the post-load verification can see it.
        Slot(name="bogus_unapplied", kind=SlotKind.OWNED, origin="test", summary="", default=False,
             targets=(HookTarget(REAL, TargetKind.FUNCTION, hook=mark),
                      HookTarget("sglang.srt.speculative.spec_info.SpeculativeAlgorithm",
                                 TargetKind.FUNCTION, hook=mark))),
    ]
''',
    "bogus_slots-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: bogus-slots\nVersion: 0.1\n",
    "bogus_slots-0.1.dist-info/entry_points.txt": "[sglang_hostsync.slots]\nbogus = bogus_slots\n",
}


@pytest.fixture
def bogus_path(tmp_path):
    for rel, text in BOGUS_DIST.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path)


LOAD_AND_CHECK = PRINT_HOOKS + "import json\n" + LOAD_AND_STARTUP_CHECK + """
import bogus_slots
from sglang.srt.speculative import spec_info
spec_info.spec_scale_global_num_tokens(type("S", (), {"num_tokens_per_req": 2, "num_tokens_for_logprob_per_req": 1})(), [1], [1])
print("RESULT" + json.dumps({"err": err, "hooks": ours(), "calls": len(bogus_slots.CALLS),
    "status": {n: [s.status.value, s.reason] for n, s in rt.state.statuses.items()}}))
"""


def test_third_party_bogus_slot_strict_mode_raises_with_target(bogus_path):
    proc = run_python(LOAD_AND_CHECK, pythonpath=bogus_path, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
                      SGLANG_HOSTSYNC_SLOTS="default,bogus_missing,bogus_unapplied")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"].startswith("HostsyncStartupError"), res
    assert "sglang.srt.no_such_module.no_such_fn" in res["err"]
    assert "sglang.srt.speculative.spec_info.SpeculativeAlgorithm" in res["err"]
    st = res["status"]
    assert st["dspark_dp_meta"] == ["applied", ""]
    assert st["bogus_missing"][0] == "failed" and "target missing: sglang.srt.no_such_module" in st["bogus_missing"][1]
    assert st["bogus_unapplied"][0] == "failed" and "hook not in place" in st["bogus_unapplied"][1]
    # Nothing half-applied: the refused slot registered none of its hooks, and the
    # unapplied one's live hook is gated off (the call went straight to SGLang).
    assert res["calls"] == 0
    assert "sglang.srt.no_such_module.no_such_fn" not in res["hooks"]


def test_third_party_bogus_slot_lenient_mode_disables_it(bogus_path):
    proc = run_python(LOAD_AND_CHECK, pythonpath=bogus_path, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
                      SGLANG_HOSTSYNC_SLOTS="all", SGLANG_HOSTSYNC_STRICT="0")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["calls"] == 0
    assert res["status"]["bogus_missing"][0] == "failed" and res["status"]["dspark_dp_meta"][0] == "applied"
    assert "bogus_unapplied" in proc.stderr and "failed (hook not in place" in proc.stderr, out(proc)


def test_doctor_table_json_and_drift(bogus_path, monkeypatch, capsys):
    from sglang_hostsync_plugin import doctor

    # The table and the bad token in this process (the doctor hooks nothing); the console script and
    # ``python -m`` (with a third-party slot package on the path) in children.
    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        monkeypatch.delenv(name)
    assert doctor.main(["doctor"]) == 0
    ok = capsys.readouterr()
    assert "dspark_dp_meta" in ok.out and "would apply" in ok.out and "OK:" in ok.out, ok
    script = os.path.join(os.path.dirname(sys.executable), "sglang-hostsync")
    env = clean_env()
    env["PYTHONPATH"] = bogus_path
    js, drift = run_concurrently([
        lambda: run_process([script, "doctor", "--json"], env=clean_env(), timeout=300, cwd=REPO),
        lambda: run_process([sys.executable, "-m", "sglang_hostsync_plugin", "doctor", "--json"],
                            env=env, timeout=300, cwd=REPO)])
    assert js.returncode == 0, out(js)
    data = json.loads(js.stdout)
    row = {r["name"]: r for r in data["slots"]}["dspark_dp_meta"]
    assert {"name", "kind", "origin", "default", "status", "reason"} <= set(row)
    assert row["status"] == "would apply" and row["kind"] == "owned" and row["origin"] == "sglang#47677"
    assert data["sglang"] == "0.5.23" and data["ok"] is True
    assert drift.returncode == 1, out(drift)
    rows = {r["name"]: r for r in json.loads(drift.stdout)["slots"]}
    assert rows["bogus_missing"]["status"] == "failed"
    assert rows["bogus_missing"]["reason"].startswith("target missing: sglang.srt.no_such_module")
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "nope")
    assert doctor.main(["doctor"]) == 2
    bad = capsys.readouterr()
    assert "'nope'" in bad.err, bad


def test_bad_enable_switch_is_loud_at_startup():
    proc = run_python("""
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    runtime.startup_check(runtime.current())
    """, SGLANG_ENABLE_HOSTSYNC_PLUGIN="maybe")
    assert proc.returncode != 0 and "SGLANG_ENABLE_HOSTSYNC_PLUGIN='maybe'" in proc.stderr, out(proc)


def test_event_and_snapshot_hooks_run_through_the_hook_registry():
    """The #5 slots' AROUND hooks, as load_plugins() applied them, on real SGLang
    methods: the arguments reach the hooks and SGLang's own bodies still run."""
    proc = run_python("""
    import json, torch
    from types import SimpleNamespace
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    runtime.startup_check(runtime.current())
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
    from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue
    from hostsync_drivers.event_ring import SimDevice
    from sglang_hostsync_plugin.slots import accept_lens_snapshot as als, event_ring

    device = SimDevice()
    runner = object.__new__(DecodeCudaGraphRunner)
    runner.device_module = device
    runner.model_runner = SimpleNamespace(shared_read_done_event=None)
    events = set()
    for _ in range(5):
        runner._publish_read_done(False)
        ev = runner.model_runner.shared_read_done_event
        events.add(id(ev))
        ev.wait()

    worker = object.__new__(DSparkWorkerV2)
    epilogue = object.__new__(DsparkVerifyEpilogue)
    epilogue.block_accept_lens_buf = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    worker._verify_epilogue = epilogue
    lens = worker._block_accept_lens(accept=None, folded_accept=True, bs=3)
    epilogue.block_accept_lens_buf.fill_(0)  # the next replay
    print("RESULT" + json.dumps({
        "read_done_events": len(events), "constructed": device.constructed,
        "ring_type": type(runner.model_runner.shared_read_done_event).__name__,
        "lens": lens.tolist(), "snapshots": als.ring().allocations, "depth": event_ring.READ_DONE_DEPTH,
    }))
    """.replace("\\n    ", "\\n"), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    # Five publishes, each waited on by the barrier: the ring's events, made once.
    assert res["read_done_events"] == res["depth"] and res["constructed"] == res["depth"]
    assert res["ring_type"] == "RingEvent"
    # A snapshot: the "next replay" zeroing the graph buffer did not reach it.
    assert res["lens"] == [5, 6, 7] and res["snapshots"] == 1
