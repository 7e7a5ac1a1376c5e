"""Stock vs plugin drivers for pinned_d2h_ring on the real
``GenerationBatchResult.copy_to_cpu`` (which calls ``async_d2h`` through
``managers/utils``' ``_async_d2h`` alias).

A step makes the device outputs of a DSpark decode step (next_token_ids,
accept_lens, block_accept_lens, and logprobs when asked), copies them on
``copy_stream`` behind an optional sleep kernel, and hands the result to a
consumer that keeps it for ``hold`` steps (as a request keeping its outputs would)
before it waits on ``copy_done`` and checks the host values.
"""

from __future__ import annotations

import random
import time
from collections import deque

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers import utils as manager_utils
from sglang.srt.managers.utils import GenerationBatchResult
from hostsync_drivers import Patcher
from sglang_hostsync_plugin.slots import pinned_d2h_ring as pdr


def install(patcher: Patcher, ring: pdr.PinnedRing) -> None:
    original = manager_utils._async_d2h
    patcher.setattr(pdr, "_ring", ring)
    patcher.setattr(manager_utils, "_async_d2h", lambda tensor: pdr.async_d2h_hook(original, tensor))


class Loop:
    def __init__(self, seed: int, copy_delay_cycles: int = 0, max_hold: int = 1, logprobs: bool = True,
                 check: bool = True):
        self.rng = random.Random(seed)
        self.copy_stream = torch.cuda.Stream()
        self.copy_delay = copy_delay_cycles
        self.max_hold = max_hold
        self.logprobs = logprobs
        self.check = check  # False in the decode-loop bench: the expected values need a host sync
        self.held: deque = deque()
        self.checked = 0
        self.mismatches = 0
        self.copy_us: list[float] = []  # host time of copy_to_cpu, per step

    def make(self, bs: int):
        def ints(dtype):
            return torch.randint(0, 1 << 20, (bs,), dtype=dtype, device="cuda")

        out = {"next_token_ids": ints(torch.int64), "accept_lens": ints(torch.int32),
               "block_accept_lens": ints(torch.int32)}
        if self.logprobs:
            out["logprobs"] = torch.randn((bs,), device="cuda")
        return out

    def step(self) -> None:
        self.launch()
        self.release()

    def launch(self) -> None:
        """Make a step's outputs and issue their readback; ``release`` is the consumer."""
        bs = self.rng.randint(1, 64)
        dev = self.make(bs)
        expected = {k: v.cpu() for k, v in dev.items()} if self.check else {}  # a host sync, not timed
        logits = LogitsProcessorOutput(next_token_logits=None, next_token_logprobs=dev.get("logprobs"))
        result = GenerationBatchResult(logits_output=logits, next_token_ids=dev["next_token_ids"],
                                       accept_lens=dev["accept_lens"], block_accept_lens=dev["block_accept_lens"])
        result.copy_done = torch.cuda.Event()
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            if self.copy_delay:
                torch.cuda._sleep(self.copy_delay)
            t0 = time.perf_counter_ns()
            result.copy_to_cpu(return_logprob=self.logprobs)
            self.copy_us.append((time.perf_counter_ns() - t0) / 1e3)
        # The device tensors die here, as in the scheduler (record_stream keeps them valid).
        del dev
        self.held.append((result, expected, self.rng.randint(1, self.max_hold)))

    def release(self, all_: bool = False) -> None:
        keep = deque()
        while self.held:
            result, expected, hold = self.held.popleft()
            if hold > 1 and not all_:
                keep.append((result, expected, hold - 1))
                continue
            result.copy_done.synchronize()
            got = {"next_token_ids": result.next_token_ids, "accept_lens": result.accept_lens,
                   "block_accept_lens": result.block_accept_lens}
            if self.logprobs:
                got["logprobs"] = result.logits_output.next_token_logprobs
            self.checked += 1
            if any(not torch.equal(got[k], expected[k]) for k in expected):
                self.mismatches += 1
        self.held = keep
