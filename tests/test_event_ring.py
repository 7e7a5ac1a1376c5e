"""event_ring on the CPU: the real SGLang publish / barrier / copy_done methods,
with a simulated device (drivers.event_ring.SimDevice)."""

import pytest

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from hostsync_drivers.event_ring import Loop, SimDevice
from sglang_hostsync_plugin.slots import event_ring

STEPS = 200


def test_stock_constructs_three_events_per_step():
    device = SimDevice()
    loop = Loop(device, plugin=False)
    loop.run(STEPS)
    # read_done of the target and the draft runner, and the scheduler's copy_done.
    assert device.constructed == 3 * STEPS
    assert loop.waited_published == STEPS


def test_plugin_constructs_no_event_after_warm_up():
    device = SimDevice()
    loop = Loop(device, plugin=True)
    loop.run(3)
    warm = device.constructed
    # 2 per read_done ring, 3 in the scheduler's ring.
    assert warm == 2 * event_ring.READ_DONE_DEPTH + event_ring.COPY_DONE_DEPTH
    loop.run(STEPS, start=3)
    assert device.constructed == warm
    read_done, copy_done = loop.rings()
    assert all(r.premature == 0 for r in read_done + copy_done)
    # The barrier still waited on exactly the event the draft runner published.
    assert loop.waited_published == STEPS + 3


def test_barrier_waits_the_published_ring_event():
    device = SimDevice()
    loop = Loop(device, plugin=True)
    loop.run(5)
    ring = event_ring._read_done_rings[loop.draft]
    loop.publish(loop.draft)
    published = loop.draft.model_runner.shared_read_done_event
    assert published in ring.events and published.hs_pending
    loop.sched._apply_war_barrier()
    assert loop.draft.model_runner.shared_read_done_event is None and not published.hs_pending


def _premature(inflight, read_done_depth=event_ring.READ_DONE_DEPTH, copy_done_depth=event_ring.COPY_DONE_DEPTH):
    device = SimDevice(lag=inflight)
    loop = Loop(device, plugin=True, inflight=inflight,
                read_done_depth=read_done_depth, copy_done_depth=copy_done_depth)
    loop.run(50)
    read_done, copy_done = loop.rings()
    return [r.premature for r in read_done], copy_done[0].premature + loop.rerecorded


def test_read_done_depth_two_is_needed():
    # The target runner's event is never waited on (the barrier waits on the draft
    # runner's); with the GPU a step behind, depth 1 re-records it before it fired.
    (target, draft), _ = _premature(1, read_done_depth=1)
    assert target > 40 and draft == 0
    (target, draft), _ = _premature(1, read_done_depth=2)
    assert target == 0 and draft == 0


def test_copy_done_depth_three_is_needed():
    # Counted: a copy_done still pending when its slot came round (the ring had to make
    # a new one) or re-recorded before result processing waited on it (the wait would
    # then block on a later step).
    # Overlap loop: step N+1's copy_done is made before step N's result is processed.
    assert _premature(1, copy_done_depth=1)[1] > 40
    assert _premature(1, copy_done_depth=2)[1] == 0
    # Two results unprocessed (disagg prefill's polling loop): depth 2 is not enough.
    assert _premature(2, copy_done_depth=2)[1] > 40
    assert _premature(2, copy_done_depth=3)[1] == 0


def test_premature_event_is_replaced_not_re_recorded():
    device = SimDevice()
    ring = event_ring.EventRing(device.Event, depth=1)
    first = ring.acquire()
    first.record()  # step 0, not fired, not consumed
    second = ring.acquire()
    assert second is not first and ring.premature == 1 and ring.allocations == 2
    assert first.step == 0  # the holder's record is untouched


def test_module_proxy_forwards_everything_but_plain_event():
    device = SimDevice()
    proxy = event_ring.RingDeviceModule(device)
    assert proxy.current_stream() is device.stream
    timing = proxy.Event(enable_timing=True)
    assert type(timing) is device.Event and proxy.hs_ring.allocations == 0
    assert isinstance(proxy.Event(), device.Event) and proxy.hs_ring.allocations == 1


def _init_overlap_with(unified_memory=False, **server_args):
    from sglang.srt.runtime_context import get_context

    device = SimDevice()
    sched = type("S", (), {"enable_unified_memory": unified_memory})()

    def init_overlap(self):
        self.device_module = device

    with get_context().override_server_args(**server_args):
        event_ring.init_overlap_hook(init_overlap, sched)
    return sched, device


def test_init_overlap_hook_wraps_once():
    sched, device = _init_overlap_with()
    proxy = sched.device_module
    assert isinstance(proxy, event_ring.RingDeviceModule) and proxy.hs_module is device
    event_ring.wrap_device_module(sched)
    assert sched.device_module is proxy


def test_scheduler_events_left_to_sglang_under_unified_memory_or_pp():
    sched, device = _init_overlap_with(unified_memory=True)
    assert sched.device_module is device
    sched, device = _init_overlap_with(pp_size=2)
    assert sched.device_module is device


def test_in_graph_publish_is_sglang_s_own():
    device = SimDevice()
    loop = Loop(device, plugin=True)
    marker = device.Event()
    loop.target.in_graph_metadata_prep_done = marker
    event_ring.publish_read_done_hook(DecodeCudaGraphRunner._publish_read_done, loop.target, True)
    assert loop.target.model_runner.shared_read_done_event is marker
    assert loop.target not in event_ring._read_done_rings or event_ring._read_done_rings[loop.target].allocations == 0


@pytest.mark.parametrize("inflight", [1, 2])
def test_unprocessed_results_keep_their_own_record(inflight):
    # Every result waiting to be processed still holds the event recorded for its
    # own step (a re-record would make its waiter block on a later step).
    device = SimDevice(lag=inflight)
    loop = Loop(device, plugin=True, inflight=inflight)
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args():
        for n in range(40):
            loop.step(n)
            loop.queue[-1].hs_step = n
            assert [r.copy_done.step for r in loop.queue] == [r.hs_step for r in loop.queue]
            assert len({id(r.copy_done) for r in loop.queue}) == len(loop.queue)
