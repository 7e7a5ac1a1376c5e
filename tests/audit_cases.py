"""Shared by the CPU and GPU audit tests: a fresh audit per test and a step driver
that goes through the slot's real run_batch hook."""

import collections
import time

import pytest

from sglang_hostsync_plugin.slots import audit


@pytest.fixture
def fresh_audit(monkeypatch):
    monkeypatch.setattr(audit, "_audit", None)
    monkeypatch.setattr(audit, "_meter", None)
    monkeypatch.setattr(audit.atexit, "register", lambda *a, **k: None)
    yield
    if audit._audit is not None:
        audit._audit.disarm()


class FakeScheduler:
    """The one Scheduler field the hook reads."""

    def __init__(self, forward_stream=None):
        self.forward_stream = forward_stream


def run_step(body, scheduler=None):
    return audit.run_batch_hook(lambda sched, batch, pp_proxy_tensors=None: body(),
                                scheduler or FakeScheduler(), None)




class StubMeter:
    """The run-ahead meter's interface without CUDA: a step's GPU begins when its run_batch
    starts and finishes 1 ms after its launch (synthetic, so the audit's own bookkeeping runs)."""

    def __init__(self):
        self.pending = collections.deque()
        self.mark_pending = collections.deque()  # no GPU markers

    def began(self, step: int) -> None:
        audit._audit.state.gpu_begin[step] = time.perf_counter()

    def finished_launching(self) -> None:
        state = audit._audit.state
        step = state.steps - 1
        state.host_launch[step] = time.perf_counter()
        state.gpu_finish[step] = state.host_launch[step] + 1e-3

    def drain(self) -> None:  # its times are known at once
        pass
