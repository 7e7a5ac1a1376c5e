"""The audit slot on the CPU: call-site attribution, allowlist, thread scoping, and
the run-ahead arithmetic. torch on the CPU raises no sync warnings, so a planted sync
emits exactly what torch's sync-debug "warn" mode emits for ``.item()`` on CUDA (the
GPU test plants a real one)."""

import threading
import warnings

import pytest

from audit_cases import FakeScheduler, fresh_audit, run_step  # noqa: F401  (fixture)
from sglang_hostsync_plugin.slots import audit

SYNC = f"{audit.SYNC_MESSAGE}"
FAKE_PROCESSOR = "/x/sglang/srt/managers/scheduler_components/batch_result_processor.py"


def planted_item():
    warnings.warn(SYNC, UserWarning)  # line of the planted sync


PLANTED_LINE = planted_item.__code__.co_firstlineno + 1


def allowlisted_wait():
    """A function compiled under SGLang's result-processor path and name."""
    ns = {"warnings": warnings, "SYNC": SYNC}
    code = "def process_batch_result_decode():\n    warnings.warn(SYNC, UserWarning)\n"
    exec(compile(code, FAKE_PROCESSOR, "exec"), ns)
    return ns["process_batch_result_decode"]


def test_planted_sync_counted_with_call_site(fresh_audit):
    run_step(lambda: None)
    run_step(planted_item)
    run_step(planted_item)
    state = audit._audit.state
    assert state.steps == 3 and state.counted() == 2
    (site,) = state.syncs.values()
    assert site.where.endswith(f"test_audit.py:{PLANTED_LINE} (planted_item)") and site.allowed == ""
    assert audit._audit.state.summary()["syncs_per_step"] == pytest.approx(2 / 3)


def torch_sync_called_from_sglang():
    """A sync torch raises inside its own frame (as ``Stream.synchronize`` does), called
    through another torch frame from an SGLang function."""
    ns = {"warnings": warnings, "SYNC": SYNC}
    exec(compile("def synchronize():\n    warnings.warn(SYNC, UserWarning)\n", "/x/torch/cuda/streams.py", "exec"), ns)
    exec(compile("def inner():\n    synchronize()\n", "/x/torch/cuda/__init__.py", "exec"), ns)
    exec(compile("\n\ndef resolve_seq_lens_cpu():\n    inner()\n", "/x/sglang/srt/managers/overlap_utils.py",
                 "exec"), ns)
    return ns["resolve_seq_lens_cpu"]


def test_sync_inside_torch_is_named_with_its_first_caller_outside_torch(fresh_audit):
    run_step(torch_sync_called_from_sglang())
    run_step(planted_item)
    torch_site, planted = sorted(audit._audit.state.syncs, key=lambda where: "planted_item" in where)
    assert torch_site == ("torch/cuda/streams.py:2 (synchronize) <- sglang/srt/managers/overlap_utils.py:4 "
                          "(resolve_seq_lens_cpu)")
    assert " <- " not in planted  # a site outside torch is named by itself


def test_allowlisted_wait_not_counted(fresh_audit):
    wait = allowlisted_wait()
    run_step(wait)
    run_step(planted_item)
    state = audit._audit.state
    assert state.counted() == 1 and state.allowed() == 1
    allowed = [s for s in state.syncs.values() if s.allowed]
    assert allowed[0].allowed.startswith("copy_done") and "(process_batch_result_decode)" in allowed[0].where


def test_sync_on_another_thread_is_neither_counted_nor_breaks_it(fresh_audit, capsys):
    run_step(lambda: None)  # arms on this thread
    finished = []

    def worker():
        planted_item()
        finished.append(True)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert finished == [True]
    state = audit._audit.state
    assert state.counted() == 0 and state.foreign_syncs == 1
    assert SYNC not in capsys.readouterr().err
    run_step(planted_item)  # still armed for the scheduler thread
    assert state.counted() == 1 and audit._audit.armed


def test_other_warnings_pass_through(fresh_audit):
    run_step(lambda: None)
    with pytest.warns(DeprecationWarning, match="unrelated"):
        warnings.warn("unrelated", DeprecationWarning)


def test_disarm_restores_showwarning_and_filters(fresh_audit):
    before, filters = warnings.showwarning, list(warnings.filters)
    run_step(lambda: None)
    assert warnings.showwarning is not before and len(warnings.filters) == len(filters) + 1
    audit._audit.disarm()
    assert warnings.showwarning is before and warnings.filters == filters


def test_meter_arithmetic_on_synthetic_timestamps():
    host_launch = [0.000, 0.010, 0.020, 0.030, 0.040]
    gpu_finish = {0: 0.015, 1: 0.022, 2: 0.029, 3: 0.050}  # step 3's next launch is 0.040
    leads = audit.launch_leads(gpu_finish, host_launch)
    assert leads == pytest.approx([0.005, 0.002, -0.001, 0.010])
    assert audit.run_ahead_fraction(leads) == 0.75
    assert audit.run_ahead_fraction([]) == 0.0
    assert audit.launch_leads({0: 1.0, 4: 2.0}, host_launch) == pytest.approx([0.99])  # missing steps skipped
    assert audit.event_to_host(10.0, 250.0) == pytest.approx(10.25)
    state = audit.AuditState(steps=5, host_launch=dict(enumerate(host_launch)), gpu_finish=gpu_finish)
    summary = state.summary()
    assert summary["run_ahead_fraction"] == 0.75 and summary["measured_steps"] == 4
    assert summary["launch_lead_ms_median"] == pytest.approx(3.5)


def test_summary_every_validation():
    assert audit.summary_every({}) == 1000
    assert audit.summary_every({audit.ENV_EVERY: "50"}) == 50
    for bad in ("0", "-3", "often"):
        with pytest.raises(ValueError, match="positive number of steps"):
            audit.summary_every({audit.ENV_EVERY: bad})


def test_bad_env_refuses_the_slot(monkeypatch):
    monkeypatch.setenv(audit.ENV_EVERY, "often")
    assert audit.SLOT.precheck().startswith("bad configuration: SGLANG_HOSTSYNC_AUDIT_EVERY='often'")


def test_summary_logged_and_dumped(fresh_audit, monkeypatch, tmp_path, caplog):
    path = tmp_path / "audit.json"
    monkeypatch.setenv(audit.ENV_JSON, str(path))
    monkeypatch.setenv(audit.ENV_EVERY, "2")
    with caplog.at_level("INFO", logger="sglang.srt.plugins.hostsync"):
        run_step(planted_item)
        run_step(lambda: None)
    assert "hostsync audit (every 2 steps)" in caplog.text
    import json
    data = json.loads(path.read_text())
    assert data["steps"] == 2 and data["syncs_per_step"] == 0.5 and data["sites"][0]["count"] == 1


def passes(rng, n: int, most: int):
    """The ``upto`` of the audit's passes over n steps, 1 to ``most`` steps apart."""
    upto = 0
    while upto < n:
        upto += rng.randint(1, most)
        yield upto


def test_leads_collected_in_pieces_match_the_whole_and_drop_used_finish_times():
    import random

    rng = random.Random(3)
    n = 400
    host_launch = sorted(rng.uniform(0, 10) for _ in range(n))
    decode = [rng.random() > 0.1 for _ in range(n)]
    finish = {k: host_launch[k] + rng.uniform(-0.05, 0.1) for k in range(n) if rng.random() > 0.05}
    want = audit.launch_leads(finish, host_launch, decode)
    state = audit.AuditState(steps=n, host_launch=dict(enumerate(host_launch)), decode=dict(enumerate(decode)),
                             gpu_finish=dict(finish))
    for upto in passes(rng, n, 30):
        state.collect_leads(upto)
        kept = n - min(upto, n - 2) + 1  # only what a later pair still needs
        assert len(state.gpu_finish) <= kept and len(state.host_launch) <= kept and len(state.decode) <= kept
    assert list(state.leads) == pytest.approx(want) and state.lead_pairs == len(want)
    summary = state.summary()
    assert summary["measured_steps"] == len(want)
    assert summary["run_ahead_fraction"] == pytest.approx(audit.run_ahead_fraction(want))


def test_run_ahead_after_the_ramp_matches_the_e2e_ramp_table():
    # Prefills every 23 steps; the first three decode pairs after each lag, the rest lead, with
    # random misses sprinkled in: the audit's steady-state fraction, collected in pieces, equals
    # the e2e's "run-ahead after 10 steps" over the same steps.
    import random

    from sglang_hostsync_plugin.e2e import stats

    rng = random.Random(5)
    n = 500
    decode = [k % 23 != 0 for k in range(n)]
    since, run = [], 0
    for d in decode:
        run = run + 1 if d else 0
        since.append(run)
    host_launch = [0.01 * k for k in range(n)]
    finish = {k: host_launch[k + 1] + (-0.002 if since[k] <= 3 or rng.random() < 0.1 else 0.003) for k in range(n - 1)}
    state = audit.AuditState(steps=n, host_launch=dict(enumerate(host_launch)), decode=dict(enumerate(decode)),
                             gpu_finish=dict(finish))
    for upto in passes(rng, n, 40):
        state.collect_leads(upto)
    summary = state.summary()
    steps = [audit.TraceStep(k, host_launch[k], finish.get(k, float("nan")), decode[k], 0.0, ()) for k in range(n)]
    want = stats.audit_figures(steps)
    assert summary["run_ahead_fraction"] == pytest.approx(want["run_ahead_fraction"])
    assert summary["run_ahead_after_ramp"] == pytest.approx(want["ramp"]["run_ahead_after_ramp"])
    assert summary["ramp_steps"] == stats.RAMP == 10
    assert 0.8 < summary["run_ahead_after_ramp"] < 0.97 and summary["run_ahead_fraction"] < summary["run_ahead_after_ramp"]
    assert audit.AuditState().summary()["run_ahead_after_ramp"] is None  # no pair yet


def test_the_median_lead_is_over_the_most_recent_pairs(monkeypatch):
    monkeypatch.setattr(audit, "LEADS_KEPT", 10)
    state = audit.AuditState(steps=31, host_launch={k: float(k) for k in range(31)},
                             gpu_finish={k: k + (0.5 if k >= 20 else 2.0) for k in range(30)})
    summary = state.summary()
    # 30 pairs counted; the first 20 lead by 1 s and the last 10 by -0.5 s: the median is the recent one.
    assert summary["measured_steps"] == 30 and summary["run_ahead_fraction"] == pytest.approx(20 / 30)
    assert summary["launch_lead_ms_median"] == pytest.approx(-500.0)


def test_the_trace_is_written_in_batches_and_after_an_idle_scheduler(fresh_audit, monkeypatch, tmp_path):
    import time as _time

    path = tmp_path / "trace.tsv"
    monkeypatch.setenv(audit.ENV_TRACE, str(path))
    monkeypatch.setattr(audit, "_last_thread_ns", None)
    monkeypatch.setattr(audit, "IDLE_S", 0.02)
    run_step(lambda: None)
    run_step(lambda: None)
    assert audit.parse_trace(path.read_text()) == []  # a batch is not full yet
    run_step(lambda: _time.sleep(0.03))  # a window longer than IDLE_S: the scheduler had idled
    assert [s.step for s in audit.parse_trace(path.read_text())] == [0, 1, 2]


def test_a_failure_in_the_audits_own_code_never_reaches_serving(fresh_audit, monkeypatch, caplog):
    """The audit's bookkeeping runs inside SGLang's run_batch: an error there is logged once, the
    audit switches itself off (warning hooks restored), and every step still returns its result."""
    import logging
    import warnings

    monkeypatch.setattr(audit, "_broken", False)
    before = warnings.showwarning

    def broken_settle(self, upto):
        raise KeyError("a bookkeeping bug")

    monkeypatch.setattr(audit.AuditState, "settle", broken_settle)
    with caplog.at_level(logging.ERROR, logger="sglang.srt.plugins.hostsync"):
        results = [run_step(lambda k=k: k) for k in range(3 * audit.PROCESS_EVERY)]
    assert results == list(range(3 * audit.PROCESS_EVERY))
    assert audit._broken and not audit._audit.armed and warnings.showwarning is before
    assert caplog.text.count("the audit is off in this process") == 1
    assert audit._audit.state.steps == audit.PROCESS_EVERY  # nothing counted after the failure


def test_a_failure_while_arming_passes_the_step_through(fresh_audit, monkeypatch, caplog):
    monkeypatch.setattr(audit, "_broken", False)
    monkeypatch.setattr(audit, "summary_every", lambda env=None: 1 / 0)
    assert run_step(lambda: "tokens") == "tokens" and run_step(lambda: "more") == "more"
    assert audit._broken and "the audit is off in this process" in caplog.text


def test_each_rank_writes_its_own_trace_and_json(fresh_audit, monkeypatch, tmp_path):
    assert audit.rank_path(None, 3) is None and audit.rank_path("/a/t.tsv", 0) == "/a/t.tsv"
    assert audit.rank_path("/a/x.trace.tsv", 1) == "/a/x.trace.rank1.tsv"
    assert audit.rank_path("/a/summary", 2) == "/a/summary.rank2"
    path = tmp_path / "x.trace.tsv"
    monkeypatch.setenv(audit.ENV_TRACE, str(path))
    monkeypatch.setattr(audit, "_global_rank", lambda: 1)  # a second TP rank's scheduler
    monkeypatch.setenv(audit.ENV_JSON, str(tmp_path / "summary.json"))
    run_step(lambda: None)
    assert not path.exists() and (tmp_path / "x.trace.rank1.tsv").read_text().startswith("#hostsync-audit-trace")
    assert audit._json.path == str(tmp_path / "summary.rank1.json")
