"""The audit slot on a CUDA device: real syncs, thread scoping, and the run-ahead
meter on real events. Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import threading

import pytest
import torch

from audit_cases import FakeScheduler, fresh_audit, run_step  # noqa: F401  (fixture)
from sglang_hostsync_plugin.slots import audit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_gpu_real_item_counted_with_call_site(fresh_audit):
    x = torch.ones(8, device="cuda")

    def decode_step_with_item():
        return x.sum().item()

    run_step(lambda: None, FakeScheduler(torch.cuda.current_stream()))
    assert run_step(decode_step_with_item) == 8.0
    state = audit._audit.state
    assert state.counted() == 1, state.syncs
    (site,) = state.syncs.values()
    assert site.where.endswith("(decode_step_with_item)"), site.where
    print("audit site:", site.where)


def test_gpu_sync_on_another_thread(fresh_audit):
    x = torch.ones(8, device="cuda")
    run_step(lambda: None, FakeScheduler(torch.cuda.current_stream()))
    got = []
    t = threading.Thread(target=lambda: got.append(x.sum().item()))
    t.start()
    t.join()
    state = audit._audit.state
    assert got == [8.0] and state.counted() == 0 and state.foreign_syncs >= 1
    run_step(lambda: x.max().item())
    assert state.counted() == 1 and audit._audit.armed


def test_gpu_meter_primitive_costs():
    """What one meter step is made of, in host µs (printed for the record)."""
    import time
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(1000)]
    stream = torch.cuda.current_stream()
    t = time.perf_counter_ns()
    for e in ev:
        e.record(stream)
    record = (time.perf_counter_ns() - t) / 1e3 / len(ev)
    torch.cuda.synchronize()
    t = time.perf_counter_ns()
    for e in ev:
        e.query()
    query = (time.perf_counter_ns() - t) / 1e3 / len(ev)
    t = time.perf_counter_ns()
    for e in ev:
        ev[0].elapsed_time(e)
    elapsed = (time.perf_counter_ns() - t) / 1e3 / len(ev)
    print(f"meter primitives (us): record {record:.2f}, query {query:.2f}, elapsed_time {elapsed:.2f}")


def test_gpu_meter_run_ahead_and_stall(fresh_audit):
    sched = FakeScheduler(torch.cuda.current_stream())
    cycles = 2_000_000  # about 1 ms of GPU per step
    inflight = []
    for _ in range(300):  # the host only enqueues and stays two steps ahead, like the overlap loop
        run_step(lambda: torch.cuda._sleep(cycles), sched)
        inflight.append(torch.cuda.Event())
        inflight[-1].record()
        if len(inflight) > 2:
            inflight.pop(0).synchronize()
    torch.cuda.synchronize()
    run_step(lambda: None, sched)
    audit._meter.drain()  # the pass every PROCESS_EVERY steps would; the summary reads what it mapped
    ahead = audit._audit.state.summary()
    audit._audit.disarm()
    audit._audit = None
    audit._meter = None
    for _ in range(300):  # each launch waits for the previous step (a sync stall): no run-ahead
        run_step(lambda: (torch.cuda.current_stream().synchronize(), torch.cuda._sleep(cycles)), sched)
    run_step(lambda: None, sched)
    torch.cuda.synchronize()
    audit._meter.drain()
    stalled = audit._audit.state.summary()
    print(f"run-ahead: fraction {ahead['run_ahead_fraction']:.3f}, lead median {ahead['launch_lead_ms_median']:.3f} ms, "
          f"meter {ahead['meter_us_per_step']:.2f} us/step over {ahead['measured_steps']} steps")
    print(f"stalled:   fraction {stalled['run_ahead_fraction']:.3f}, lead median {stalled['launch_lead_ms_median']:.3f} ms, "
          f"meter {stalled['meter_us_per_step']:.2f} us/step over {stalled['measured_steps']} steps")
    assert ahead["run_ahead_fraction"] >= 0.99 and ahead["launch_lead_ms_median"] > 0
    assert stalled["run_ahead_fraction"] <= 0.01 and stalled["launch_lead_ms_median"] < 0
    assert ahead["measured_steps"] >= 290


def _idle_by_phase(body, steps: int = 40) -> tuple[dict, dict]:
    """Runs ``body`` as ``steps`` decode steps, every window timed; the attribution's rows by phase."""
    sched = FakeScheduler(torch.cuda.current_stream())
    for _ in range(steps):
        run_step(body, sched)
    torch.cuda.synchronize()
    run_step(lambda: None, sched)
    audit._process(write=False)
    summary = audit._audit.state.summary()
    return {r["phase"]: r for r in summary["attribution"]["phases"]}, summary


@pytest.fixture
def timed_every_step(fresh_audit, monkeypatch):
    """Every window timed by a fresh phase clock; yields the phase module."""
    from sglang_hostsync_plugin.slots import audit_phases as ph

    monkeypatch.setenv(ph.ENV_PHASE_EVERY, "1")
    monkeypatch.setattr(ph, "_armed", None)
    monkeypatch.setattr(ph, "_clock", None)
    yield ph


@pytest.mark.parametrize("marks", ["0", "1"])
def test_gpu_markers_find_the_idle_inside_a_step(timed_every_step, monkeypatch, marks):
    """An NGRAM-like step: it waits for the previous step inside run_batch, prepares on the host
    (2 ms) while the GPU idles, then launches 1 ms of GPU work. The begin event alone sees no idle
    (it is recorded before the wait); the markers put the prep's 2 ms in GPU idle."""
    import time

    ph = timed_every_step
    monkeypatch.setenv(audit.ENV_MARKS, marks)
    prep, launch = ph.make_hook("prep"), ph.make_hook("launch")

    def body():
        torch.cuda.current_stream().synchronize()  # the wait inside run_batch
        prep(lambda: time.sleep(0.002))
        launch(lambda: torch.cuda._sleep(2_000_000))

    rows, summary = _idle_by_phase(body)
    print(f"marks={marks}: prep {rows['prep']['host_us_per_step']:.0f} us/step, of it in GPU idle "
          f"{rows['prep']['gpu_idle_us_per_step']:.0f}; launch in GPU idle {rows['launch']['gpu_idle_us_per_step']:.0f}; "
          f"marker latency {summary['mark_latency_us']:.1f} us, windows with markers {summary['marked_windows']}, "
          f"@marks {rows.get('@marks', {}).get('host_us_per_step', 0):.1f} us")
    if marks == "1":
        assert summary["marked_windows"] >= 30
        assert rows["prep"]["gpu_idle_us_per_step"] > 0.8 * rows["prep"]["host_us_per_step"] > 1500
        assert rows["launch"]["gpu_idle_us_per_step"] < 300
    else:
        assert summary["marked_windows"] == 0 and rows["prep"]["gpu_idle_us_per_step"] < 300


def test_gpu_markers_see_no_idle_while_the_host_runs_ahead(timed_every_step, monkeypatch):
    """The overlap loop with the host two steps ahead: every marker finds the stream busy."""
    import time

    ph = timed_every_step
    monkeypatch.setenv(audit.ENV_MARKS, "1")
    prep, launch = ph.make_hook("prep"), ph.make_hook("launch")
    inflight = []

    def body():
        if len(inflight) > 2:
            inflight.pop(0).synchronize()
        prep(lambda: time.sleep(0.0005))
        launch(lambda: torch.cuda._sleep(4_000_000))  # about 2 ms of GPU per step
        inflight.append(torch.cuda.Event())
        inflight[-1].record()

    rows, summary = _idle_by_phase(body)
    print(f"ahead: prep in GPU idle {rows['prep']['gpu_idle_us_per_step']:.0f} of {rows['prep']['host_us_per_step']:.0f} us/step, "
          f"run-ahead {summary['run_ahead_fraction']:.3f}")
    assert summary["marked_windows"] >= 30 and summary["run_ahead_fraction"] > 0.9
    assert rows["prep"]["gpu_idle_us_per_step"] < 50
