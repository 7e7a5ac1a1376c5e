"""Stock vs plugin drivers for event_ring on the real SGLang methods.

One decode step is what ``Scheduler.event_loop_overlap`` does with a spec worker:
``run_batch`` (the target runner and the draft runner each publish their
``read_done`` through ``DecodeCudaGraphRunner._publish_read_done``; the scheduler
makes the step's ``copy_done`` in ``_copy_auxiliary_output_to_cpu`` and the real
``GenerationBatchResult.copy_to_cpu`` records it), then ``_apply_war_barrier``
(waits on the draft runner's event, as ``last_shared_read_runner`` says), then the
result of ``inflight`` steps ago is processed (``copy_done.synchronize()``, as
``batch_result_processor`` does).

``SimDevice`` stands in for ``torch.cuda`` on the CPU: its events fire when a
simulated GPU, ``lag`` steps behind the host, has finished the step they were
recorded in; a host ``synchronize`` lets the GPU catch up to that step.
"""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.runtime_context import get_context
from sglang_hostsync_plugin.slots import event_ring


class SimStream:
    def wait_event(self, event):
        event.wait(self)  # what torch.cuda.Stream.wait_event does

    def wait_stream(self, stream):
        pass


class SimDevice:
    """A device module whose Event() counts constructions and follows a simulated GPU."""

    def __init__(self, lag: int = 1):
        self.launched = 0  # the step the host is launching
        self.lag = lag
        self.completed = -1  # the last step the GPU finished
        self.constructed = 0
        device = self

        class Event:
            def __init__(self, *args, **kwargs):
                device.constructed += 1
                self.step = None

            def record(self, stream=None):
                self.step = device.launched

            def query(self):
                return self.step is None or device.completed >= self.step

            def synchronize(self):
                if self.step is not None:
                    device.completed = max(device.completed, self.step)

            def wait(self, stream=None):
                pass

        self.Event = Event
        self.stream = SimStream()

    def current_stream(self, device=None):
        return self.stream

    def begin_step(self, n: int) -> None:
        self.launched = n
        self.completed = max(self.completed, n - 1 - self.lag)


class CountingDevice:
    """torch.cuda with an Event class that counts its constructions (GPU runs)."""

    def __init__(self):
        self.constructed = 0
        device = self

        class Event(torch.cuda.Event):
            def __new__(cls, *args, **kwargs):
                device.constructed += 1
                return super().__new__(cls, *args, **kwargs)

        self.Event = Event

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    def begin_step(self, n: int) -> None:
        pass


class _Aux:
    """An auxiliary device output: gives _copy_auxiliary_output_to_cpu a reason to run."""

    def copy_to_host(self, d2h):
        return "host"


def _runner(device_module):
    runner = object.__new__(DecodeCudaGraphRunner)
    runner.device_module = device_module
    runner.model_runner = SimpleNamespace(shared_read_done_event=None)
    return runner


class Loop:
    """The scheduler's view of decode steps, stock or plugin."""

    def __init__(self, device_module, plugin: bool, inflight: int = 1, device="cpu",
                 read_done_depth=event_ring.READ_DONE_DEPTH, copy_done_depth=event_ring.COPY_DONE_DEPTH):
        self.device_module = device_module
        self.plugin = plugin
        self.inflight = inflight
        self.device = device
        self.target = _runner(device_module)
        self.draft = _runner(device_module)
        sched = object.__new__(Scheduler)
        sched._war_barrier_enabled = True
        sched.model_worker = SimpleNamespace(last_shared_read_runner=self.draft.model_runner)
        sched.schedule_stream = device_module.current_stream()
        sched.device_module = device_module
        if plugin:
            event_ring.wrap_device_module(sched)
            sched.device_module.hs_ring = event_ring.EventRing(device_module.Event, copy_done_depth)
            for runner in (self.target, self.draft):
                event_ring._read_done_rings[runner] = event_ring.EventRing(device_module.Event, read_done_depth)
        self.sched = sched
        self.queue: deque = deque()
        self.records: deque = deque()  # copy_done.hs_records right after each result's record
        self.rerecorded = 0  # results whose copy_done was re-recorded before it was waited on
        self.batch = SimpleNamespace(return_logprob=False, return_hidden_states=False)
        self.waited_published = 0  # barrier waits that bound the draft runner's own event
        self.host_us: list[float] = []  # publishes + copy_done + barrier, per step
        self.tokens = torch.zeros((4,), dtype=torch.int64, device=device)

    def publish(self, runner) -> None:
        if self.plugin:
            event_ring.publish_read_done_hook(DecodeCudaGraphRunner._publish_read_done, runner, False)
        else:
            runner._publish_read_done(False)

    def step(self, n: int) -> None:
        self.launch(n)
        while len(self.queue) > self.inflight:
            self.process()

    def launch(self, n: int) -> None:
        """run_batch and the barrier; result processing is ``process``."""
        self.device_module.begin_step(n)
        t0 = time.perf_counter_ns()
        self.publish(self.target)
        self.publish(self.draft)
        published = self.draft.model_runner.shared_read_done_event
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None), next_token_ids=self.tokens,
        )
        result.logits_output.auxiliary_device_output = _Aux()
        self.sched._copy_auxiliary_output_to_cpu(self.batch, result)
        self.sched._apply_war_barrier()
        self.host_us.append((time.perf_counter_ns() - t0) / 1e3)
        if self.draft.model_runner.shared_read_done_event is None and published is not None:
            self.waited_published += 1
        self.queue.append(result)
        self.records.append(result.copy_done.hs_records if self.plugin else 0)

    def process(self) -> None:
        result, records = self.queue.popleft(), self.records.popleft()
        if self.plugin and result.copy_done.hs_records != records:
            self.rerecorded += 1
        result.copy_done.synchronize()  # what batch_result_processor does

    def run(self, steps: int, start: int = 0) -> None:
        with get_context().override_server_args():
            for n in range(start, start + steps):
                self.step(n)

    def drain(self) -> None:
        while self.queue:
            self.process()

    def rings(self):
        read_done = [event_ring._read_done_rings[r] for r in (self.target, self.draft)] if self.plugin else []
        copy_done = [self.sched.device_module.hs_ring] if self.plugin else []
        return read_done, copy_done
