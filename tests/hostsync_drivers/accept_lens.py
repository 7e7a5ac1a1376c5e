"""Stock vs plugin drivers for accept_lens_snapshot on the real SGLang methods.

A step: the "replay" writes the step's lengths into the verify epilogue's
``block_accept_lens_buf`` on the forward stream (after an optional GPU delay);
``DSparkWorkerV2._block_accept_lens`` hands them to a real ``GenerationBatchResult``;
the real ``Scheduler._copy_result_to_cpu`` issues the D2H on ``copy_stream``
(optionally delayed by a sleep kernel queued there first); the result of the
previous step is then processed: ``copy_done.synchronize()`` and its host
``block_accept_lens`` compared with what that step wrote.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from types import SimpleNamespace

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from hostsync_drivers import Patcher
from sglang_hostsync_plugin.slots import accept_lens_snapshot as als

MAX_BS = 64


def install(patcher: Patcher, ring: als.SnapshotRing) -> None:
    """The slot's two AROUND hooks, as the HookRegistry would apply them."""
    original_bal = DSparkWorkerV2._block_accept_lens
    original_copy = GenerationBatchResult.copy_to_cpu
    patcher.setattr(als, "_ring", ring)
    patcher.setattr(DSparkWorkerV2, "_block_accept_lens",
                    lambda self, **kw: als.block_accept_lens_hook(original_bal, self, **kw))
    patcher.setattr(GenerationBatchResult, "copy_to_cpu",
                    lambda self, *a, **kw: als.copy_to_cpu_hook(original_copy, self, *a, **kw))


class Loop:
    def __init__(self, device: str, copy_delay_cycles: int = 0, replay_delay_cycles: int = 0, event_factory=None):
        self.device = device
        self.cuda = device.startswith("cuda")
        epilogue = object.__new__(DsparkVerifyEpilogue)
        epilogue.block_accept_lens_buf = torch.zeros((MAX_BS,), dtype=torch.int32, device=device)
        worker = object.__new__(DSparkWorkerV2)
        worker._verify_epilogue = epilogue
        self.epilogue, self.worker = epilogue, worker
        sched = object.__new__(Scheduler)
        sched.enable_async_d2h_copy = False
        if self.cuda:
            sched.forward_stream = torch.cuda.current_stream()
            sched.copy_stream = torch.cuda.Stream()
            sched.copy_stream_ctx = torch.cuda.stream(sched.copy_stream)
        else:
            sched.forward_stream = sched.copy_stream = SimpleNamespace(wait_stream=lambda s: None)
            sched.copy_stream_ctx = contextlib.nullcontext()
        self.sched = sched
        self.batch = SimpleNamespace(return_logprob=False, return_hidden_states=False,
                                     spec_algorithm=SpeculativeAlgorithm.from_string("DSPARK"))
        # copy_done: torch.cuda.Event, or an event_ring ring's acquire (the default slot set)
        self.event_factory = event_factory or (torch.cuda.Event if self.cuda else None)
        self.copy_delay = copy_delay_cycles
        self.replay_delay = replay_delay_cycles
        self.queue: deque = deque()
        self.tokens = torch.zeros((MAX_BS,), dtype=torch.int64, device=device)
        self.mismatches = 0
        self.checked = 0
        self.host_us: list[float] = []  # _block_accept_lens + _copy_result_to_cpu, per step

    def step(self, values: torch.Tensor, expected: list[int]) -> None:
        self.launch(values, expected)
        while len(self.queue) > 1:
            self.process(*self.queue.popleft())

    def launch(self, values: torch.Tensor, expected: list[int]) -> None:
        """The replay, the result and its readback; result processing is ``process``."""
        bs = values.numel()
        if self.replay_delay:
            torch.cuda._sleep(self.replay_delay)
        self.epilogue.block_accept_lens_buf[:bs].copy_(values, non_blocking=True)  # the replay
        t0 = time.perf_counter_ns()
        lens = self.worker._block_accept_lens(accept=None, folded_accept=True, bs=bs)
        result = GenerationBatchResult(logits_output=LogitsProcessorOutput(next_token_logits=None),
                                       next_token_ids=self.tokens[:bs], block_accept_lens=lens)
        result.copy_done = self.event_factory() if self.cuda else SimpleNamespace(record=lambda: None,
                                                                                  synchronize=lambda: None)
        t1 = time.perf_counter_ns()
        if self.copy_delay:
            with self.sched.copy_stream_ctx:
                torch.cuda._sleep(self.copy_delay)
        t2 = time.perf_counter_ns()
        self.sched._copy_result_to_cpu(result, self.batch)
        self.host_us.append((time.perf_counter_ns() - t2 + t1 - t0) / 1e3)
        self.queue.append((result, expected))

    def process(self, result, expected) -> None:
        result.copy_done.synchronize()
        self.checked += 1
        if result.block_accept_lens.tolist() != expected:
            self.mismatches += 1

    def drain(self) -> None:
        while self.queue:
            self.process(*self.queue.popleft())


def random_steps(steps: int, seed: int, device: str, max_bs: int = MAX_BS):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        bs = int(torch.randint(1, max_bs + 1, (1,), generator=gen))
        host = torch.randint(0, 1 << 20, (bs,), generator=gen, dtype=torch.int32)
        out.append((host.to(device), host.tolist()))
    return out
