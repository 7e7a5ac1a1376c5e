"""Shared by the CPU and GPU audit tests: a fresh audit per test and a step driver
that goes through the slot's real run_batch hook."""

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


