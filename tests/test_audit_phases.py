"""The audit's phase attribution on synthetic timelines (CPU): exclusive phase time,
GPU-idle overlap, decode-pair selection, the trace round trip and the e2e tables."""

import math

import pytest

from sglang_hostsync_plugin.e2e import stats
from sglang_hostsync_plugin.slots import audit, audit_phases as ph


def test_attribute_splits_the_window_and_the_idle_interval():
    # window 0..10; GPU idle 4..7; phases: schedule 1..5, verify 5..6, result 8..9.
    segs = [("schedule", 1.0, 5.0), ("verify", 5.0, 6.0), ("result", 8.0, 9.0)]
    got = ph.attribute(segs, (0.0, 10.0), [(4.0, 7.0)])
    assert got == {"schedule": (4.0, 1.0), "verify": (1.0, 1.0), "result": (1.0, 0.0), "other": (4.0, 1.0)}
    assert sum(h for h, _ in got.values()) == 10.0  # phases + other cover the window
    assert sum(i for _, i in got.values()) == 3.0  # and the idle interval


def test_attribute_clips_to_the_window_and_ignores_no_idle():
    got = ph.attribute([("a", -5.0, 2.0), ("b", 9.0, 20.0)], (0.0, 10.0), [(6.0, 5.0)])  # begin before finish
    assert got == {"a": (2.0, 0.0), "b": (1.0, 0.0), "other": (7.0, 0.0)}
    assert ph.attribute([], (0.0, 3.0), []) == {"other": (3.0, 0.0)}


def test_clock_time_is_exclusive_and_take_cuts_open_phases():
    c = ph.PhaseClock(thread_id=0, now=iter([0, 10, 30, 35, 50, 80, 100, 100, 110, 120]).__next__)
    c.enter("run_batch")   # 0
    c.enter("verify")      # 10
    c.enter("verify_prep") # 30
    c.exit()               # 35
    c.exit()               # 50
    segs = c.take()        # 80: run_batch still open
    c.exit()               # 100
    assert segs == [("run_batch", 0, 10), ("verify", 10, 30), ("verify_prep", 30, 35), ("verify", 35, 50),
                    ("run_batch", 50, 80)]
    assert c.take() == [("run_batch", 80, 100)] and c.calls == 3
    c.exit()  # one exit too many (a clock armed inside a call): ignored, never raised
    assert c.take() == []


def test_hooks_time_only_the_scheduler_thread_and_pass_everything_through():
    seen = []
    hook = ph.make_hook("verify")
    ph.arm(thread_id=-1)  # another thread's clock: this call passes through untimed
    try:
        assert hook(lambda *a, **k: seen.append((a, k)) or 7, 1, x=2) == 7
        assert ph.clock().segments == [] and seen == [((1,), {"x": 2})]
        ph.arm()
        with pytest.raises(ZeroDivisionError):
            hook(lambda: 1 / 0)  # the phase closes on an exception too
        assert [p for p, _, _ in ph.clock().segments] == ["verify"] and ph.clock().stack == []
        assert ph.clock().call_ns >= 0
    finally:
        ph.disarm()


def state_with_steps(n, decode=None):
    s = audit.AuditState()
    s.steps = n
    s.decode = dict(enumerate(decode or [True] * n))
    s.host_launch = {k: 10.0 * k for k in range(n)}  # launches every 10 s (synthetic units)
    return s


def test_settle_attributes_decode_pairs_with_a_known_idle_interval():
    s = state_with_steps(4, decode=[True, True, True, False])
    # step k's window is (launch[k-1], launch[k]); GPU finish of k-1 and begin of k
    s.gpu_finish = {0: 2.0, 1: 15.0, 2: 23.0}
    s.gpu_begin = {1: 5.0, 2: 12.0, 3: 26.0}
    ns = lambda t: int(t * 1e9)  # noqa: E731
    for k in range(1, 4):
        w = (s.host_launch[k - 1], s.host_launch[k])
        s.pending_segments[k] = (w, [("schedule", ns(w[0] + 1), ns(w[0] + 6))], 3)  # 3 wrapped calls
    s.phase_call_ns, s.phase_pass_ns, s.phase_every = 500.0, 100.0, 4
    s.own_cost_ns = {1: (700.0, 90.0)}  # the audit's own work per step (of which attribution), at step 1
    s.settle(3)
    assert not s.pending_segments
    # step 1: idle 2..5 (3 s), schedule 1..6 overlaps 3; step 2: begin 12 < finish 15: no idle;
    # step 3 is not a decode step (a prefill), so its pair does not count.
    assert set(s.phase_rows) == {1, 2}
    idle1, row1 = s.phase_rows[1]
    assert idle1 == pytest.approx(3e9) and row1["schedule"] == pytest.approx((5e9, 3e9))
    assert row1["other"] == pytest.approx((5e9, 0.0))
    # 3 calls per timed window of 500 ns, and 3 passing calls of 100 ns in each of 3 untimed steps
    assert row1["@clock"] == (pytest.approx((3 * 500 + 3 * 3 * 100) / 4), 0.0)
    assert row1["@audit"] == (700.0, 0.0) and s.phase_rows[2][1]["@audit"] == (0.0, 0.0)
    assert row1["@attribution"] == (90.0, 0.0) and s.phase_rows[2][1]["@attribution"] == (0.0, 0.0)
    assert s.phase_rows[2][0] == 0.0 and s.phase_rows[2][1]["schedule"][1] == 0.0
    summary = s.summary()["attribution"]
    assert summary["attributed_steps"] == 2
    top = summary["phases"][0]
    assert top["phase"] == "schedule" and top["share_of_gpu_idle"] == pytest.approx(1.0)
    assert top["gpu_idle_us_per_step"] == pytest.approx(1.5e6)  # 3 s over 2 steps, in µs


def test_the_first_decode_step_after_a_prefill_is_attributed_into_the_trace_only():
    # step 1 is a prefill; step 2, the first decode step after it, has the window (launch 1, launch 2);
    # step 3 a steady decode step.
    s = state_with_steps(4, decode=[True, False, True, True])
    s.gpu_finish = {1: 12.0, 2: 22.0}
    s.gpu_begin = {2: 15.0, 3: 25.0}
    ns = lambda t: int(t * 1e9)  # noqa: E731
    for k in (2, 3):
        w = (s.host_launch[k - 1], s.host_launch[k])
        s.pending_segments[k] = (w, [("decode_prep", ns(w[0] + 1), ns(w[0] + 6))], 2)
    s.settle(3)
    assert not s.pending_segments and set(s.phase_rows) == {2, 3}
    # The prefill finished at 12, the first decode step's run_batch began at 15: 3 s of idle in its window,
    # all inside decode_prep (11..16).
    idle2, row2 = s.phase_rows[2]
    assert idle2 == pytest.approx(3e9) and row2["decode_prep"] == pytest.approx((5e9, 3e9))
    # The per-step table holds the steady step only.
    assert s.summary()["attribution"]["attributed_steps"] == 1


def test_trace_round_trip_with_phases_and_v1_lines():
    t = audit.TraceStep(5, 1.5, 1.6, True, 900.0, ("a:1 (f)",), 120.0, {"verify": (300.0, 80.0), "other": (600.0, 40.0)})
    line = audit.format_trace_line(t)
    assert line.count("\t") == 7
    assert audit.parse_trace(audit.TRACE_HEADER + line) == [t]
    v1 = "7\t2.000000\t2.100000\t1\t800.0\t\n"
    (old,) = audit.parse_trace(v1)
    assert old.step == 7 and old.phases == {} and math.isnan(old.gpu_idle_us)
    # v2 (runs before 2026-12-03): seconds and µs as decimals, as committed under benchmarks/results/
    v2 = "9\t262.850476\t262.852397\t1\t9139.1\t\t1750.0\tresult:862.3:862.3,other:252.2:98.6\n"
    (old,) = audit.parse_trace(v2)
    assert old.t_launch == 262.850476 and old.host_us == 9139.1 and old.phases["result"] == (862.3, 862.3)
    # v3: integer ns, -1 where not measured
    missing = audit.TraceStep(3, 1.25, math.nan, False, math.nan, (), math.nan, {})
    line = audit.format_trace_line(missing)
    assert line == "3\t1250000000\t-1\t0\t-1\t\t-1\t\n"
    (back,) = audit.parse_trace(line)
    assert back.t_launch == 1.25 and math.isnan(back.t_finish) and math.isnan(back.host_us)


def test_e2e_pools_phases_per_cell_and_prints_the_table():
    steps = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 100.0 * (k % 2),
                             {"verify": (300.0, 100.0 * (k % 2)), "other": (700.0, 0.0), "@clock": (2.0, 0.0)})
             for k in range(4)]
    pooled = stats.pool_audit([steps[:2], steps[2:]])["attribution"]
    assert pooled["attributed_steps"] == 4 and pooled["window_us_per_step"] == pytest.approx(1000.0)
    assert pooled["gpu_idle_us_per_step"] == pytest.approx(50.0)
    assert pooled["phases"][0] == {"phase": "verify", "host_us_per_step": pytest.approx(300.0),
                                   "gpu_idle_us_per_step": pytest.approx(50.0), "share_of_gpu_idle": pytest.approx(1.0)}
    cell = {"config": "standalone-t4-p16", "concurrency": 1, "arm": "audit", "audit": {"attribution": pooled}}
    text = "\n".join(stats.attribution_tables([cell]))
    assert "| phase | audit c1 |" in text and "| verify | 300 (50) |" in text
    assert "| **step window (GPU idle)** | 1000 (50) |" in text
    assert "waits for the previous one inside" not in text
    # A step that waits inside run_batch (NGRAM, FlashInfer): the idle column misses the idle after that wait.
    waits = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                             {"seq_lens_resolve": (5000.0, 0.0), "verify": (300.0, 0.0)}) for k in range(2)]
    ngram = {"config": "ngram-p1", "concurrency": 1, "arm": "audit",
             "audit": {"attribution": stats.pool_audit([waits])["attribution"], "late_share": 0.4429}}
    short = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                             {"seq_lens_resolve": (100.0, 0.0), "verify": (300.0, 0.0)}) for k in range(2)]
    eagle = {"config": "ngram-p1", "concurrency": 1, "arm": "plugin",
             "audit": {"attribution": stats.pool_audit([short])["attribution"], "late_share": 0.0}}
    marked = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                              {"seq_lens_resolve": (5000.0, 0.0), "verify": (300.0, 250.0), "@marks": (40.0, 0.0)})
              for k in range(2)]
    with_marks = {"config": "ngram-p1", "concurrency": 1, "arm": "slots:default,audit",
                  "audit": {"attribution": stats.pool_audit([marked])["attribution"], "late_share": 0.4}}
    notes = [ln for ln in stats.attribution_tables([ngram, eagle, with_marks]) if ln.startswith("- ")]
    assert notes == ["- audit c1: each step waits for the previous one inside `run_batch` (`seq_lens_resolve` "
                     "5000 µs per step), and the GPU idles after that wait, which the column in parentheses "
                     "leaves out: late launches 44.29% of the decode time."]
    # Ranked: GPU-idle time first, then host time (the phases of no idle time by their host time).
    ranked = [{"phase": p, "host_us_per_step": h, "gpu_idle_us_per_step": i, "share_of_gpu_idle": 0.0}
              for p, h, i in (("a", 10.0, 0.0), ("b", 30.0, 0.0), ("c", 5.0, 4.0), ("d", 30.0, 0.0))]
    for phases in (ranked, ranked[::-1]):
        c = dict(cell, audit={"attribution": dict(pooled, phases=phases)})
        rows = [ln.split(" |")[0][2:] for ln in stats.attribution_tables([c]) if ln.startswith("| ") and "(" in ln]
        assert rows[:4] == ["c", "b", "d", "a"]
    # Host work: the window without process_batch_result (where an ahead host waits for the GPU).
    assert stats.pool_audit([steps])["host_work_us_per_step"] == pytest.approx(1000.0)  # no result phase
    waiting = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                               {"verify": (300.0, 0.0), "result": (2500.0, 0.0), "other": (200.0, 0.0)})
               for k in range(3)]
    audited = stats.pool_audit([waiting])
    assert audited["attribution"]["window_us_per_step"] == pytest.approx(3000.0)
    assert audited["host_work_us_per_step"] == pytest.approx(500.0)
    # FlashInfer's / NGRAM's per-step wait (seq_lens_resolve) is not host work either.
    synced = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                              {"verify": (300.0, 0.0), "seq_lens_resolve": (3000.0, 0.0), "result": (100.0, 0.0),
                               "other": (200.0, 0.0)}) for k in range(2)]
    assert stats.pool_audit([synced])["host_work_us_per_step"] == pytest.approx(500.0)
    assert audited["simulated_acceptance_us_per_step"] == 0  # no simulate phase ran
    simulated = [audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0,
                                 {"verify": (300.0, 0.0), "simulate": (180.0, 0.0), "other": (520.0, 0.0)})
                 for k in range(2)]
    assert stats.pool_audit([simulated])["simulated_acceptance_us_per_step"] == pytest.approx(180.0)
    assert stats.pool_audit([[audit.TraceStep(0, 0.0, 0.5, True, 900.0, ())]])["host_work_us_per_step"] is None
    row = {"config": "c", "concurrency": 1, "arm": "plugin", "tok_s_user_median": 1.0, "tok_s_user_p10": 1.0,
           "ratio_tok_s_user": 1.0, "tok_s_total_median": 1.0, "accept_length": 3.0, "audit": audited}
    assert "| 900 (500) |" in stats.markdown([row], {}, {})


def test_every_phase_target_exists_in_the_pinned_sglang():
    from sglang_hostsync_plugin.checks import check_target
    from sglang_hostsync_plugin.slots import audit_fine

    for target in audit.SLOT.targets + audit_fine.SLOT.targets:
        assert check_target(target) is None, target.path
    assert [t.path for t in audit.SLOT.targets[:2]] == [audit.RUN_BATCH, audit.ON_IDLE]
    assert {t.path for t in audit.SLOT.targets[2:]} == {path for _, path in ph.PHASES}
    # The sub-phases are their own tool slot, on top of the audit, and time nothing twice.
    assert {t.path for t in audit_fine.SLOT.targets} == {path for _, path in ph.FINE_PHASES}
    assert not {p for _, p in ph.PHASES} & {p for _, p in ph.FINE_PHASES}
    assert audit_fine.SLOT.requires == ("audit",) and all(t.observer for t in audit_fine.SLOT.targets)


def test_the_inlined_hook_keeps_the_clocks_exclusive_segments():
    """``make_hook`` inlines ``enter``/``exit``: nested timed calls give the same segments as the
    clock's own methods, and the calibration measures that hook."""
    ph.arm(thread_id=None)
    try:
        c = ph.clock()
        outer, inner = ph.make_hook("verify"), ph.make_hook("verify_sample")
        outer(lambda: inner(lambda: None))
        segs = c.take()
        assert [p for p, _, _ in segs] == ["verify", "verify_sample", "verify"] and c.stack == []
        assert all(t0 <= t1 for _, t0, t1 in segs) and segs[0][2] == segs[1][1] and segs[1][2] == segs[2][1]
        assert c.calls == 2 and c.call_ns > 0
    finally:
        ph.disarm()


def test_the_phase_switch_is_validated_with_the_slot():
    assert ph.enabled({}) is True and ph.enabled({ph.ENV_PHASES: "0"}) is False
    reason = audit.SLOT.precheck()
    assert reason is None
    with pytest.MonkeyPatch.context() as m:
        m.setenv(ph.ENV_PHASES, "maybe")
        assert audit.SLOT.precheck().startswith("bad configuration")


@pytest.fixture
def audit_env(monkeypatch, tmp_path):
    monkeypatch.setattr(audit, "_audit", None)
    monkeypatch.setattr(audit, "_meter", None)
    monkeypatch.setattr(audit, "_last_thread_ns", None)
    monkeypatch.setattr(audit.atexit, "register", lambda *a, **k: None)
    monkeypatch.setenv(audit.ENV_TRACE, str(tmp_path / "t.tsv"))
    yield monkeypatch
    if audit._audit is not None:
        audit._audit.disarm()
    ph.disarm()


def test_the_audit_reports_its_own_work_per_step_at_each_timed_window(audit_env, tmp_path):
    from audit_cases import StubMeter, run_step

    audit_env.setenv(ph.ENV_PHASE_EVERY, "2")
    audit_env.setattr(audit, "_meter", StubMeter())
    for _ in range(5):
        run_step(lambda: None)
    state = audit._audit.state
    total_before_last = state.bookkeeping_total_ns  # hooks 0-4
    audit._log_summary("test")  # writes the trace out
    rows = {s.step: s.phases for s in audit.parse_trace((tmp_path / "t.tsv").read_text()) if s.phases}
    # Windows 2 and 4 are timed and attributed (0 has no previous step); each carries the mean of
    # the audit's work per step since the previous timed window, hooks 0-1 and 2-3.
    assert sorted(rows) == [2, 4] and all(r["@audit"][0] > 0 for r in rows.values())
    assert 0 < 2 * rows[2]["@audit"][0] + 2 * rows[4]["@audit"][0] < total_before_last / 1e3 + 0.2
    assert state.summary()["bookkeeping_us_per_step"] == pytest.approx(state.bookkeeping_total_ns / 5 / 1e3)


def test_markers_are_read_back_before_their_ring_runs_out(audit_env):
    from audit_cases import StubMeter, run_step

    meter = StubMeter()
    drained = []
    meter.drain = lambda: drained.append(audit._audit.state.steps)
    audit_env.setattr(audit, "_meter", meter)
    run_step(lambda: None)  # step 0: arms
    meter.mark_pending.extend(range(audit.MARK_RING // 2))
    run_step(lambda: None)  # half the ring in flight: the pass every PROCESS_EVERY steps is not due yet
    assert drained == []
    meter.mark_pending.append(0)
    run_step(lambda: None)
    assert drained == [3]


def test_the_attribution_reports_its_own_part_of_the_audits_work(audit_env, tmp_path):
    from audit_cases import StubMeter, run_step

    audit_env.setenv(ph.ENV_PHASE_EVERY, "2")
    audit_env.setattr(audit, "PROCESS_EVERY", 1)
    audit_env.setattr(audit, "_meter", StubMeter())
    verify = ph.make_hook("verify")
    for _ in range(9):
        run_step(lambda: verify(lambda: None))
    state = audit._audit.state
    audit._log_summary("test")
    rows = {s.step: s.phases for s in audit.parse_trace((tmp_path / "t.tsv").read_text()) if s.phases}
    # Each timed window after the first pass carries the attribution's mean cost per step since
    # the previous timed window: a part of the audit's own work, never more than it.
    later = [r for step, r in rows.items() if step >= 4]
    assert later and all(0 < r["@attribution"][0] <= r["@audit"][0] for r in later)
    summary = state.summary()
    assert 0 < summary["attribution_us_per_step"] < summary["bookkeeping_us_per_step"]


def test_one_pass_every_process_every_steps_or_after_an_idle_scheduler(audit_env, tmp_path):
    import time as _time

    from audit_cases import StubMeter, run_step

    audit_env.setattr(audit, "PROCESS_EVERY", 4)
    audit_env.setattr(audit, "IDLE_S", 0.02)
    audit_env.setattr(audit, "_meter", StubMeter())
    for _ in range(3):
        run_step(lambda: None)
    state = audit._audit.state
    assert state.lead_pairs == 0 and len(audit._trace.pending) == 3  # no pass yet
    run_step(lambda: None)  # the 4th step: one pass over all four
    assert state.lead_pairs == 3 and not audit._trace.pending
    run_step(lambda: None)
    run_step(lambda: _time.sleep(0.03))  # after an idle scheduler: a pass, and the lines are written
    assert state.lead_pairs == 5
    assert [s.step for s in audit.parse_trace((tmp_path / "t.tsv").read_text())] == list(range(6))


def test_the_idle_pass_runs_in_on_idle_not_before_the_next_requests_first_decode_step(audit_env, tmp_path):
    """The pass over a finished load's tail runs while SGLang's loop idles (``on_idle``), once; the first
    step after the idle gap (a new request's prefill) then makes none, so nothing of it lies between that
    prefill's launch and the first decode step's (H100 2026-12-06: up to 7.7 ms there)."""
    import time as _time

    from audit_cases import FakeScheduler, StubMeter, run_step

    audit_env.setattr(audit, "PROCESS_EVERY", 100)
    audit_env.setattr(audit, "IDLE_S", 0.02)
    audit_env.setattr(audit, "_meter", StubMeter())
    passes = []
    original = audit._process
    audit_env.setattr(audit, "_process", lambda write: (passes.append((audit._audit.state.steps, write)),
                                                        original(write)))
    idle_calls = []
    on_idle = lambda sched: idle_calls.append(sched)  # noqa: E731  (SGLang's on_idle)
    audit.on_idle_hook(on_idle, FakeScheduler())  # before the first step: nothing armed, nothing to do
    assert passes == [] and len(idle_calls) == 1
    for _ in range(3):
        run_step(lambda: None)
    state = audit._audit.state
    book, attr = state.bookkeeping_total_ns, state.attribution_total_ns
    for _ in range(4):  # SGLang calls on_idle on every idle loop turn: one pass
        audit.on_idle_hook(on_idle, FakeScheduler())
    assert passes == [(3, True)] and len(idle_calls) == 5
    # The pass is the audit's own work (@audit), which holds its attribution part (@attribution).
    assert state.bookkeeping_total_ns - book >= state.attribution_total_ns - attr > 0
    assert [s.step for s in audit.parse_trace((tmp_path / "t.tsv").read_text())] == [0, 1, 2]
    _time.sleep(0.03)
    run_step(lambda: None)  # the launch after the idle gap: no second pass
    assert passes == [(3, True)]
    audit.on_idle_hook(on_idle, FakeScheduler())  # the next idle period: its pass
    assert passes == [(3, True), (4, True)]
    assert [s.step for s in audit.parse_trace((tmp_path / "t.tsv").read_text())] == [0, 1, 2, 3]


def test_the_idle_pass_runs_before_sglangs_on_idle_which_may_sleep_until_the_next_request(audit_env):
    """Under --sleep-on-idle SGLang's ``on_idle`` ends in a poll that returns when a request arrives: a pass
    after it would run on that request's path."""
    from audit_cases import FakeScheduler, StubMeter, run_step

    audit_env.setattr(audit, "PROCESS_EVERY", 100)
    audit_env.setattr(audit, "_meter", StubMeter())
    for _ in range(2):
        run_step(lambda: None)
    order = []
    original = audit._process
    audit_env.setattr(audit, "_process", lambda write: (order.append("pass"), original(write)))
    assert audit.on_idle_hook(lambda sched: order.append("sglang's on_idle") or "its result", FakeScheduler()) \
        == "its result"
    assert order == ["pass", "sglang's on_idle"]


def test_an_idle_pass_repeats_while_a_steps_gpu_finish_is_unknown(audit_env):
    from audit_cases import FakeScheduler, StubMeter, run_step

    audit_env.setattr(audit, "PROCESS_EVERY", 100)
    meter = StubMeter()
    audit_env.setattr(audit, "_meter", meter)
    for _ in range(2):
        run_step(lambda: None)
    meter.pending.append((object(), 1))  # step 1's finish event not back yet
    back = []
    meter.drain = lambda: meter.pending.clear() if back else None  # the meter's drain drops completed events
    passes = []
    original = audit._process
    audit_env.setattr(audit, "_process", lambda write: (passes.append(write), original(write)))
    audit.on_idle_hook(lambda sched: None, FakeScheduler())
    audit.on_idle_hook(lambda sched: None, FakeScheduler())
    assert len(passes) == 2  # each idle turn tries again
    back.append(True)  # the event completes: the next pass drains it
    audit.on_idle_hook(lambda sched: None, FakeScheduler())
    audit.on_idle_hook(lambda sched: None, FakeScheduler())
    assert len(passes) == 3  # one more pass resolves it, then none


def test_a_failure_in_the_idle_pass_never_reaches_serving(audit_env, caplog):
    import logging

    from audit_cases import FakeScheduler, StubMeter, run_step

    audit_env.setattr(audit, "_broken", False)
    audit_env.setattr(audit, "_meter", StubMeter())
    run_step(lambda: None)

    def broken(write):
        raise KeyError("a bookkeeping bug")

    audit_env.setattr(audit, "_process", broken)
    with caplog.at_level(logging.ERROR, logger="sglang.srt.plugins.hostsync"):
        assert audit.on_idle_hook(lambda sched: "idled", FakeScheduler()) == "idled"
        assert audit.on_idle_hook(lambda sched: "idled", FakeScheduler()) == "idled"
    assert audit._broken and caplog.text.count("the audit is off in this process") == 1


def test_the_pass_lands_in_timed_windows_no_more_often_than_in_any_window(audit_env):
    """The pass every PROCESS_EVERY steps costs far more than a step's own bookkeeping and lies in
    ``other`` of the window it runs in: timed windows must not hold it more often than the rest, or
    the attribution's ``other`` and step window are inflated (PROCESS_EVERY 16 with the default
    PHASE_EVERY 8 put a pass into every other timed window)."""
    from audit_cases import StubMeter, run_step

    audit_env.setenv(ph.ENV_PHASE_EVERY, str(ph.DEFAULT_PHASE_EVERY))
    audit_env.setattr(audit, "_meter", StubMeter())
    passes = []  # per pass: is the window it runs in (step index ``state.steps``) a timed one?
    original = audit._process

    def spy(write):
        state = audit._audit.state
        passes.append(state.steps % state.phase_every == 0)
        original(write)

    audit_env.setattr(audit, "_process", spy)
    steps = 20 * ph.DEFAULT_PHASE_EVERY * audit.PROCESS_EVERY // 4
    for _ in range(steps):
        run_step(lambda: None)
    timed_windows = steps // ph.DEFAULT_PHASE_EVERY
    assert len(passes) >= steps // audit.PROCESS_EVERY - 1
    share_timed = sum(passes) / timed_windows
    share_all = len(passes) / steps
    assert share_timed <= 1.5 * share_all, (share_timed, share_all)


def test_the_audits_per_step_state_stays_bounded_in_a_long_run(audit_env):
    from audit_cases import StubMeter, run_step

    audit_env.setenv(ph.ENV_PHASE_EVERY, "2")
    audit_env.setattr(audit, "_meter", StubMeter())
    verify = ph.make_hook("verify")
    for _ in range(1000):
        run_step(lambda: verify(lambda: None))
    state = audit._audit.state
    bound = audit.PROCESS_EVERY + 2
    sizes = {name: len(getattr(state, name)) for name in
             ("host_launch", "decode", "gpu_finish", "gpu_begin", "pending_segments", "phase_rows",
              "own_cost_ns")}
    assert max(sizes.values()) <= bound, sizes
    assert state.lead_pairs >= 1000 - bound and state.summary()["attribution"]["attributed_steps"] >= 490


def test_the_clock_times_one_window_in_n_and_passes_through_in_the_others(audit_env):
    from audit_cases import run_step

    audit_env.setenv(ph.ENV_PHASE_EVERY, "4")
    verify, sample = ph.make_hook("verify"), ph.make_hook("verify_sample")
    seen = []

    def body():
        seen.append(ph.clock() is not None)
        return verify(lambda: sample(lambda: 3))

    assert [run_step(body) for _ in range(9)] == [3] * 9
    state = audit._audit.state
    assert seen == [True, False, False, False, True, False, False, False, True]
    assert state.timed_windows == 3 and state.phase_calls == 3 * 3  # run_batch, verify, verify_sample
    assert state.phase_every == 4 and ph.armed().pass_ns > 0 and ph.armed().call_ns > 0
    assert state.summary()["phase_every"] == 4


def test_clock_cost_per_step_counts_the_passing_calls_of_untimed_steps():
    s = audit.AuditState(steps=12, phase_calls=30, timed_windows=3, phase_call_ns=1000.0, phase_pass_ns=400.0)
    assert s.clock_ns_per_step() == pytest.approx((30 * 1000 + 9 * 10 * 400) / 12)
    summary = s.summary()
    assert (summary["phase_call_ns"], summary["phase_pass_ns"], summary["phase_calls_per_timed_window"]) == (1000.0, 400.0, 10.0)
    assert audit.AuditState(steps=5).clock_ns_per_step() == 0.0
    assert audit.AuditState(steps=5).summary()["phase_calls_per_timed_window"] == 0.0


def test_the_calibration_times_the_installed_chain():
    """Through the gate and SGLang's wrapper a passing call costs more than a bare one, and a
    timed call more than a passing one (the chain of a real phase target)."""
    c = ph.PhaseClock()
    c.calibrate(n=2000)
    assert 0 < c.pass_ns < c.call_ns, (c.pass_ns, c.call_ns)
    seen = []
    chained = ph.installed_chain(ph.make_hook("x"), lambda *a, **k: seen.append((a, k)) or 5)
    assert chained(1, y=2) == 5 and seen == [((1,), {"y": 2})]


def test_phase_every_is_validated_with_the_slot(monkeypatch):
    assert ph.phase_every({}) == ph.DEFAULT_PHASE_EVERY and ph.phase_every({ph.ENV_PHASE_EVERY: "1"}) == 1
    for bad in ("0", "-2", "often"):
        with pytest.raises(ValueError, match="positive number of steps"):
            ph.phase_every({ph.ENV_PHASE_EVERY: bad})
    monkeypatch.setenv(ph.ENV_PHASE_EVERY, "0")
    assert audit.SLOT.precheck().startswith("bad configuration: SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY='0'")


def test_settle_adds_the_markers_idle_inside_the_step():
    """A window of step 5 (host 0..10 ms, in ns): the begin event saw no idle (the GPU was busy when
    run_batch began); the markers show the stream drained from 3 ms (after a wait) to the launch at 7 ms."""
    ms = 1_000_000

    def state_with(marks, lost=False):
        st = audit.AuditState(steps=6, mark_latency_ns=10_000.0)
        st.decode.update({4: True, 5: True})
        st.gpu_finish[4] = 2e-3  # s, on the host clock
        st.gpu_begin[5] = 1e-3  # before the finish: no idle before run_batch
        segments = [("run_batch", 1 * ms, 3 * ms), ("prep", 3 * ms, 7 * ms), ("graph_execute", 7 * ms, 7.1 * ms),
                    ("run_batch", 7.1 * ms, 7.2 * ms)]
        st.pending_segments[5] = ((0.0, 10e-3), segments, 4)
        if marks is not None:
            st.marks[5] = marks
            st.mark_ns[5] = 123
        if lost:
            st.marks_lost.add(5)
        st.settle(5)
        return st

    # run_batch begins with the GPU busy until 2.99 ms; it waits; prep from 3 ms with the stream drained;
    # the graph's launch at 7 ms keeps it busy until 9 ms.
    marks = [(1 * ms, 2.99 * ms), (3 * ms, 3 * ms + 10_000), (7 * ms, 7 * ms + 10_000), (7.1 * ms, 9 * ms),
             (7.2 * ms, 9 * ms + 10_000)]
    st = state_with(marks)
    idle_ns, row = st.phase_rows[5]
    # run_batch's wait: from the drain (2.99 ms less the latency) to 3 ms; prep: all of it.
    assert row["prep"] == (4 * ms, 4 * ms) and row["graph_execute"] == (0.1 * ms, 0)
    assert row["run_batch"] == (2.1 * ms, pytest.approx(20_000)) and idle_ns == pytest.approx(4 * ms + 20_000)
    assert row["@marks"] == (123, 0.0) and st.marked_windows == 1
    assert not st.marks and not st.mark_ns  # consumed with the window
    for plain in (state_with(None), state_with(marks, lost=True)):  # no markers, or one lost: the begin event only
        idle_ns, row = plain.phase_rows[5]
        assert idle_ns == 0 and row["prep"] == (4 * ms, 0) and plain.marked_windows == 0 and not plain.marks_lost


def test_markers_setting_is_validated_with_the_slot(monkeypatch):
    assert audit.marks_enabled({}) is False and audit.marks_enabled({audit.ENV_MARKS: "1"}) is True
    monkeypatch.setenv(audit.ENV_MARKS, "maybe")
    assert audit.SLOT.precheck().startswith("bad configuration: SGLANG_HOSTSYNC_AUDIT_MARKS='maybe'")


def test_attribute_matches_its_plain_definition_on_random_timelines():
    import random

    rng = random.Random(7)
    names = [n for n, _ in ph.PHASES]
    for _ in range(500):
        t, segs = rng.randint(0, 100), []
        for _ in range(rng.randint(0, 40)):
            d = rng.randint(-10, 200)  # empty and reversed segments too
            segs.append((rng.choice(names), t, t + d))
            t += max(d, 0)
        window = (rng.randint(0, 50), t + rng.randint(-50, 50))
        idle = rng.choice([None, (t - 60, t + 5), (5, 2), (window[0] - 10, window[0] + 30), (0, t)])
        ivs = [idle] if idle else []
        got, want = ph.attribute(segs, window, ivs), _attribute_reference_many(segs, window, ivs)
        assert got.keys() == want.keys() and all(
            got[k][0] == pytest.approx(want[k][0]) and got[k][1] == pytest.approx(want[k][1]) for k in got), (segs, window, idle)


def _attribute_reference_many(segments, window, idle):
    """The attribution's definition, written plainly: clip each segment to the window, sum per
    phase, and the overlap of each clipped segment with the union of the idle intervals."""
    w0, w1 = window
    ivs = ph.idle_intervals(idle)
    out = {}
    for phase, t0, t1 in segments:
        c0, c1 = max(t0, w0), min(t1, w1)
        if c1 > c0:
            h, i = out.get(phase, (0, 0))
            out[phase] = (h + c1 - c0, i + sum(ph.overlap(c0, c1, a, b) for a, b in ivs))
    out["other"] = (max(0, (w1 - w0) - sum(h for h, _ in out.values())),
                    max(0, sum(ph.overlap(w0, w1, a, b) for a, b in ivs) - sum(i for _, i in out.values())))
    return out


def test_attribute_with_several_idle_intervals_matches_the_plain_definition():
    import random

    assert ph.idle_intervals([]) == [] and ph.idle_intervals([(3, 1)]) == []
    assert ph.idle_intervals([(5, 9), (1, 2), (8, 12), (2, 3), (4, 4)]) == [(1, 3), (5, 12)]
    rng = random.Random(11)
    names = [n for n, _ in ph.PHASES]
    for _ in range(500):
        t, segs = rng.randint(0, 100), []
        for _ in range(rng.randint(0, 40)):
            d = rng.randint(-10, 200)
            segs.append((rng.choice(names), t, t + d))
            t += max(d, 0)
        if rng.random() < 0.1:
            rng.shuffle(segs)  # out of time order: the sweep starts over
        window = (rng.randint(0, 50), t + rng.randint(-50, 50))
        idle = [(a, a + rng.randint(-20, 300)) for a in (rng.randint(-50, t + 50) for _ in range(rng.randint(0, 8)))]
        got, want = ph.attribute(segs, window, idle), _attribute_reference_many(segs, window, idle)
        assert got.keys() == want.keys() and all(
            got[k][0] == pytest.approx(want[k][0]) and got[k][1] == pytest.approx(want[k][1]) for k in got), (segs, window, idle)


def test_idle_from_marks_on_a_synthetic_timeline():
    # (recorded, executed) in one clock; a marker on a drained stream executes 5 after its record.
    marks = [(0, 5),      # drained at the window's first transition
             (100, 105),  # still drained: 0..100 idle (host prep, short launches)
             (200, 450),  # a long launch in 100..200: busy until 450
             (300, 455),  # still busy at 300: nothing
             (500, 505),  # drained again: idle from the drain (455 - 5) to 500
             (520, 540)]  # 540 - 520 = 20 <= 5 + slack 20: drained, from 505 - 5 = 500 (the record at 500) to 520
    assert ph.idle_from_marks(marks, 5, 20) == [(0, 100), (450, 500), (500, 520)]
    assert ph.idle_from_marks(marks, 5, 10) == [(0, 100), (450, 500)]  # a tighter slack: 540 counts as busy
    assert ph.idle_from_marks(marks[:1], 5, 20) == [] and ph.idle_from_marks([], 5, 20) == []
    # A host always ahead (every marker executes long after its record): no idle at all.
    ahead = [(t, t + 3000 + 7 * k) for k, t in enumerate(range(0, 1000, 100))]
    assert ph.idle_from_marks(ahead, 5, 20) == []
    # After a long idle a marker runs later: a share of the time since the previous marker is slack too.
    slow = [(0, 5), (2000, 2095), (2100, 2300)]  # 90 over the latency after 2000 idle; 200 after 100
    assert ph.idle_from_marks(slow, 5, 20) == [] and ph.idle_from_marks(slow, 5, 20, 0.05) == [(0, 2000)]
    # The window's least latency when lower than the armed one (the clocks moved): it is the reference.
    assert ph.idle_from_marks([(m[0], m[1] - 4) for m in marks], 5, 10) == [(0, 100), (450, 500)]


def test_clock_calls_its_marker_at_every_transition():
    c = ph.PhaseClock(thread_id=0, now=iter([0, 10, 30, 35, 50]).__next__)
    seen = []
    c.marker = seen.append
    c.enter("run_batch")
    c.enter("verify")
    c.exit()
    c.exit()
    assert seen == [0, 10, 30, 35]
    import threading
    hook = ph.make_hook("verify_prep")
    clock = ph.PhaseClock(thread_id=threading.get_ident())
    got = []
    clock.marker = got.append
    saved = ph._clock
    ph._clock = clock
    try:
        assert hook(lambda x: x + 1, 1) == 2
    finally:
        ph._clock = saved
    assert len(got) == 2 and got == sorted(got) and [p for p, _, _ in clock.segments] == ["verify_prep"]


def test_a_failing_marker_switches_the_markers_off_and_never_raises(monkeypatch):
    import collections
    import threading

    class Broken:
        calls = 0

        def record(self, stream):
            Broken.calls += 1
            raise RuntimeError("CUDA error")

    meter = audit.RunAheadMeter.__new__(audit.RunAheadMeter)  # no CUDA: the fields mark() reads
    meter.state, meter.stream = audit.AuditState(steps=3), None
    meter.mark_ring, meter.mark_free, meter.mark_pending = [Broken(), Broken()], [0, 1], collections.deque()
    clock = ph.PhaseClock(thread_id=threading.get_ident())
    clock.marker = meter.mark
    monkeypatch.setattr(ph, "_armed", clock)
    monkeypatch.setattr(ph, "_clock", clock)
    assert ph.make_hook("verify")(lambda: 7) == 7  # the call went through
    assert clock.marker is None and meter.state.marks_lost == {3} and not meter.mark_pending
    assert Broken.calls == 1  # the phase's exit, already under way, did not try (and log) again
    meter.mark_free = []
    meter.mark(0)  # a full ring: the window is marked lost, nothing raised
    assert meter.state.marks_lost == {3}


def test_audit_fine_is_reported_undone_when_the_phase_clock_is_off(monkeypatch):
    import os

    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    def verdict(phases_env):
        if phases_env is None:
            monkeypatch.delenv(ph.ENV_PHASES, raising=False)
        else:
            monkeypatch.setenv(ph.ENV_PHASES, phases_env)  # the slots' prechecks read the process env
        return plans.resolve({**os.environ, "SGLANG_HOSTSYNC_SLOTS": "audit,audit_fine"}).verdict("audit_fine")

    on = verdict(None)
    assert on.status is Status.WOULD_APPLY and on.reason == ""
    off = verdict("0")
    assert off.status is Status.WOULD_APPLY and off.reason.startswith("undone: ") and ph.ENV_PHASES in off.reason
    bad = verdict("maybe")
    assert bad.status is Status.FAILED and bad.input_caused  # the audit's bad value, never raised here


def test_e2e_tables_the_first_decode_step_after_a_prefill_apart():
    phases_of = lambda prep: {"decode_prep": (prep, 0.0), "other": (500.0, 0.0)}  # noqa: E731
    # A prefill (step 0) and decode steps 1-3 in each of two windows; step 1 is the first after the prefill.
    def window(base):
        return [audit.TraceStep(base, float(base), float(base) + 0.5, False, 900.0, ()),
                *(audit.TraceStep(base + k, float(base + k), float(base + k) + 0.5, True, 900.0, (), 0.0,
                                  phases_of(1500.0 if k == 1 else 100.0)) for k in (1, 2, 3))]
    pooled = stats.pool_audit([window(0), window(10)])
    assert stats.first_decode_steps(window(0)) == {1}
    steady, first = pooled["attribution"], pooled["attribution_first"]
    assert steady["attributed_steps"] == 4 and steady["window_us_per_step"] == pytest.approx(600.0)
    assert first["attributed_steps"] == 2 and first["window_us_per_step"] == pytest.approx(2000.0)
    cell = {"config": "c", "concurrency": 1, "arm": "plugin", "audit": pooled}
    lines = stats.attribution_tables([cell], "attribution_first", stats.FIRST_STEP_HEADING)
    assert lines[1].startswith("Host µs of the first decode step after a prefill by phase, c (")
    assert lines[1].endswith("attributed steps: 2):")
    assert "| decode_prep | 1500 (0) |" in lines
    assert "| decode_prep | 100 (0) |" in stats.attribution_tables([cell])
    assert lines[1] in stats.markdown([dict(cell, tok_s_user_median=1.0, tok_s_user_p10=1.0, ratio_tok_s_user=1.0,
                                            tok_s_total_median=1.0, accept_length=3.0)], {}, {})
    # Without first steps (a trace from before 2026-12-06, or none timed) there is no such table.
    old = dict(pooled, attribution_first={})
    assert stats.attribution_tables([dict(cell, audit=old)], "attribution_first", stats.FIRST_STEP_HEADING) == []


def test_e2e_tables_host_work_by_decode_steps_after_a_prefill():
    # A prefill, then 12 decode steps; step k's work 100*k µs beside a 1000 µs result wait, GPU idle 50 µs in
    # steps 1-3 only; step 12 has no phases (untimed).
    steps = [audit.TraceStep(0, 0.0, 0.5, False, 900.0, ())]
    for k in range(1, 13):
        phases_k = {} if k == 12 else {"verify": (100.0 * k, 50.0 if k <= 3 else 0.0), "result": (1000.0, 0.0)}
        steps.append(audit.TraceStep(k, float(k), float(k) + 0.5, True, 900.0, (), 0.0, phases_k))
    pooled = stats.pool_audit([steps])
    buckets = pooled["ramp_work"]
    assert [b["attributed_steps"] for b in buckets] == [1, 2, 7, 1]
    assert [b["host_work_us"] for b in buckets] == [pytest.approx(100.0), pytest.approx(250.0),
                                                   pytest.approx(700.0), pytest.approx(1100.0)]
    assert [b["gpu_idle_us"] for b in buckets] == [pytest.approx(50.0), pytest.approx(50.0), 0.0, 0.0]
    lines = stats.ramp_work_lines([{"config": "c", "concurrency": 1, "arm": "plugin", "audit": pooled}])
    assert lines[3] == "| config | conc | arm | 1 | 2-3 | 4-10 | 11+ |"
    assert lines[-1] == "| c | 1 | plugin | 100 (50) [1] | 250 (50) [2] | 700 (0) [7] | 1100 (0) [1] |"
    # A window that begins mid-decode: its leading decode step's window is a steady one (not after a prefill),
    # so it is in bucket 1 of neither table; the later steps count from the window's start as in the ramp table.
    mid = stats.pool_audit([steps[1:]])
    assert mid["attribution_first"] == {} and mid["attribution"]["attributed_steps"] == 11
    assert [b["attributed_steps"] for b in mid["ramp_work"]] == [0, 2, 7, 1]
    # An e2e.json from before these fields (--merge), or a cell without attributed steps: no table.
    assert stats.ramp_work_lines([{"config": "c", "concurrency": 1, "arm": "old", "audit": {"ramp": {}}}]) == []
    assert stats.ramp_work_lines([{"config": "c", "concurrency": 1, "arm": "stock", "audit": None}]) == []


def test_e2e_compares_the_plugin_arms_phase_by_phase_beyond_their_host_speed():
    """Two plugin arms whose processes run 8% apart, one of them with a slot that halves one phase:
    the median ratio is the 8%, the slot's phase stands out beyond it; stock code, the audit's own
    rows, the result wait and phases timed in one arm only do not count."""
    def cell(arm, phases):
        rows = [{"phase": p, "host_us_per_step": v, "gpu_idle_us_per_step": 0.0} for p, v in phases.items()]
        return {"config": "t4", "concurrency": 1, "arm": arm,
                "audit": {"attribution": {"attributed_steps": 10, "phases": rows, "window_us_per_step": 1.0,
                                          "gpu_idle_us_per_step": 0.0}}}

    base = {"verify": 400.0, "draft": 300.0, "draft_extend": 350.0, "schedule": 100.0, "tiny": 10.0}
    a = cell("slots:x,-s", {**base, "result": 2000.0, "@audit": 50.0, "only_a": 90.0})
    b = cell("slots:x", {**{p: v * 1.08 for p, v in base.items()}, "draft_extend": 350.0 * 1.08 / 2,
                         "result": 500.0, "@audit": 80.0, "tiny": 40.0})
    stock_code = cell("audit", {p: v * 3 for p, v in base.items()})
    lines = stats.phase_ab_lines([stock_code, b, a])
    text = "\n".join(lines)
    assert text.count("Phases of") == 1 and "Phases of slots:x,-s over slots:x, t4 c1" in text
    assert "median ratio of the phases of 50 µs or more is 0.926" in text  # 1 / 1.08: B is the first arm by name
    rows = [l for l in lines if l.startswith("| ") and not l.startswith(("| phase", "| ---"))]
    assert rows[-1] == "| draft_extend | 189 | 350 | 1.852 | 2.000 |"  # sorted by the last column
    assert {l.split(" | ")[0][2:] for l in rows} == {"verify", "draft", "draft_extend", "schedule", "tiny"}
    assert "| tiny | 40 | 10 | 0.250 | 0.270 |" in text  # listed, but under 50 µs in A it has no vote
    assert stats.phase_ab_lines([a]) == [] and stats.phase_ab_lines([stock_code, a]) == []
    assert "Phases of" in stats.markdown([dict(c, tok_s_user_median=1.0, tok_s_user_p10=1.0, ratio_tok_s_user=1.0,
                                               tok_s_total_median=1.0, accept_length=3.0) for c in (a, b)], {}, {})


def test_the_simulate_phase_times_sglangs_simulated_acceptance_where_eagle_sample_looks_it_up():
    """Through the real HookRegistry: ``eagle_sample`` imports ``generate_simulated_accept_index``
    from ``spec_utils`` at each call; the audit's timer is what it gets, and it returns SGLang's result."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, torch
from sglang_hostsync_plugin.slots import audit_phases as ph
ph.arm(thread_id=None)
clock = ph.clock()
def as_eagle_sample_calls():
    from sglang.srt.speculative.spec_utils import generate_simulated_accept_index
    accept = torch.tensor([[4, -1, -1, -1], [8, -1, -1, -1]], dtype=torch.int32)
    predict, correct = torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    return generate_simulated_accept_index(accept, predict, correct, None, None, 2, 3, simulate_acc_len=4.0,
                                           simulate_acc_method="match-expected", simulate_acc_token_mode="fixed")
got = as_eagle_sample_calls()
segs = clock.take()
ph.disarm()
print("RESULT" + json.dumps({"err": err, "phases": sorted({p for p, _, _ in segs}), "got": got.tolist()}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="audit", TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["phases"] == ["simulate"], res
    assert res["got"] == [[4, 5, 6, 7], [8, 9, 10, 11]], res  # SGLang's CPU path: accept every draft
