"""accept_lens_snapshot on the CPU: real DSparkWorkerV2._block_accept_lens,
GenerationBatchResult.copy_to_cpu and Scheduler._copy_result_to_cpu.

On the CPU the readback of a CPU tensor is the tensor itself, so stock SGLang's
result aliases the graph buffer outright: the hazard shows without a delay."""

from types import SimpleNamespace

import torch

from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
from hostsync_drivers.accept_lens import MAX_BS, Loop, install, random_steps
from hostsync_drivers import Patcher
from sglang_hostsync_plugin.slots import accept_lens_snapshot as als


def _run(plugin: bool, seed: int, steps: int = 80):
    patcher = Patcher()
    ring = als.SnapshotRing()
    if plugin:
        install(patcher, ring)
    try:
        loop = Loop("cpu")
        returned = []
        for values, expected in random_steps(steps, seed, "cpu"):
            loop.step(values, expected)
            returned.append(loop.queue[-1][0].block_accept_lens.tolist())
        loop.drain()
    finally:
        patcher.undo()
    return loop, ring, returned


def test_stock_result_aliases_the_graph_buffer():
    loop, _, _ = _run(plugin=False, seed=0)
    assert loop.checked == 80 and loop.mismatches > 70


def test_snapshot_values_identical_and_survive_the_next_replay():
    for seed in range(4):
        stock_loop, _, stock_returned = _run(plugin=False, seed=seed)
        loop, ring, returned = _run(plugin=True, seed=seed)
        # What the step handed out equals stock's at that moment, bit for bit ...
        assert returned == stock_returned
        # ... and is still that step's when its result is processed.
        assert loop.mismatches == 0 and loop.checked == 80
        assert ring.allocations == als.DEPTH  # bs <= 64: each slot made once


def test_each_reused_slot_waits_for_its_reader():
    loop, ring, _ = _run(plugin=True, seed=5, steps=30)
    # Every copy_to_cpu noted its copy_done; every reuse (30 - DEPTH) waited on one.
    assert ring.reader_waits == 30 - als.DEPTH


def test_a_reused_slot_waits_on_its_readers_cuda_event_before_the_rewrite(monkeypatch):
    """copy_done as a CUDA event (a recording fake): each rewrite of a slot is preceded by a
    forward-stream wait on the event recorded after the slot's previous D2H, while it still holds that step."""
    steps, results, log = random_steps(12, 9, "cpu"), [], []

    class Event:
        def __init__(self):
            self.step = len(results)

        def record(self):
            log.append(("record", self.step))

        def synchronize(self):
            pass

    class Stream:
        def wait_event(self, event):
            held = results[event.step].block_accept_lens.tolist() == steps[event.step][1]
            log.append(("wait", event.step, held))

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    patcher, ring = Patcher(), als.SnapshotRing()
    install(patcher, ring)
    try:
        loop = Loop("cpu")
        loop.cuda, loop.event_factory = True, Event  # no delays set, so the loop makes no other CUDA call
        for values, expected in steps:
            loop.step(values, expected)
            results.append(loop.queue[-1][0])
        loop.drain()
    finally:
        patcher.undo()
    want = []
    for i in range(len(steps)):
        if i >= als.DEPTH:
            want.append(("wait", i - als.DEPTH, True))
        want.append(("record", i))
    assert log == want
    assert loop.mismatches == 0 and ring.reader_waits == len(steps) - als.DEPTH


def test_without_the_reader_wait_a_slow_reader_would_see_later_values():
    # Depth alone is not the guard: three steps later the slot is rewritten, and a
    # reader that has not run yet (a delayed copy) would see that step's values.
    ring = als.SnapshotRing(depth=als.DEPTH)
    first = ring.snapshot(torch.tensor([1, 2, 3], dtype=torch.int32))
    for k in range(als.DEPTH):
        ring.snapshot(torch.tensor([7 + k] * 3, dtype=torch.int32))
    assert first.tolist() == [7 + als.DEPTH - 1] * 3


def test_eager_path_is_passed_through():
    patcher = Patcher()
    install(patcher, als.SnapshotRing())
    try:
        worker = object.__new__(DSparkWorkerV2)
        worker._verify_epilogue = None
        accept = SimpleNamespace(commit_lens=torch.tensor([1, 2]), cap_trim_lens=torch.tensor([0, 1]))
        out = worker._block_accept_lens(accept=accept, folded_accept=False, bs=2)
        assert out.tolist() == [1, 3] and als.ring().allocations == 0
        # Folded, but the epilogue has no buffer (post-forward graph off): SGLang's sum.
        worker._verify_epilogue = SimpleNamespace(block_accept_lens_buf=None,
                                                  read_block_accept_lens=lambda bs: None)
        assert worker._block_accept_lens(accept=accept, folded_accept=True, bs=2).tolist() == [1, 3]
        assert als.ring().allocations == 0
    finally:
        patcher.undo()


def test_grows_past_the_first_capacity_and_empty_batch():
    ring = als.SnapshotRing(depth=1)
    assert ring.snapshot(torch.zeros((0,), dtype=torch.int32)).numel() == 0
    big = torch.arange(MAX_BS * 3, dtype=torch.int32)
    assert torch.equal(ring.snapshot(big), big) and ring.allocations == 2
