"""Slot ``event_ring`` (sglang#31698, still open upstream): per-step CUDA events
come from rings instead of a fresh ``Event()`` every replay / step.

Covered sites (SGLang 0.5.23):
- ``DecodeCudaGraphRunner._publish_read_done(in_graph=False)``: the WAR
  ``read_done`` event (one per replay; also used by its subclass
  ``EAGLEDraftExtendCudaGraphRunner``). One ring per runner, depth 2.
- every ``self.device_module.Event()`` the scheduler makes: the ``copy_done``
  events in ``Scheduler.run_batch`` and ``_copy_auxiliary_output_to_cpu`` (and
  the disagg mixins'). ``Scheduler.init_overlap`` sets ``self.device_module``
  (and hands the real module to the async D2H worker); the hook then wraps it in
  a module proxy whose ``Event()`` (no arguments) takes from one scheduler ring of
  depth 3. Calls with arguments (timing, IPC) and every other attribute go to the
  real module. Under unified memory or PP (pp_size > 1) the proxy is not
  installed: the allocator's ``forward_done`` and PP's send events can be held
  longer than the depth argument covers, and a re-record there would make their
  waiters wait for a later step.
  ``GenerationBatchResult.copy_to_cpu`` only records the event it was given, so
  it needs no change.

Why reuse is safe: a ring hands out an event only once its last record was
consumed (a ``wait``/``synchronize``, or a ``query`` that saw it fire). A holder
that keeps an event longer only sees a later record, which fires later: it waits
more, never less. When the next event is still pending and has not fired
(``premature``), the ring makes a new one rather than re-record it. What the depth
buys is that no waiter is made to wait for a later step: an event that fired but
whose waiter has not run yet would be re-recorded at a too-small depth, and the
waiter would then block on the newer record (the depth tests show both cases).

Not covered: ``maybe_publish_prefill_shared_read_done`` (prefill, not decode),
``EmbeddingBatchResult.copy_to_cpu`` (embeddings) and the async D2H worker's own
``src_ready`` event (Confidential Computing path).
"""

from __future__ import annotations

import logging
import weakref

from ..slot import HookTarget, Slot, SlotKind, TargetKind

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "event_ring"
RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"

# Only firing frees the event of a runner the barrier does not wait on (a spec worker's
# other runner); with the CPU at most one step ahead, the one from two replays ago has fired.
READ_DONE_DEPTH = 2
# copy_done of step N is waited while step N+1 is in flight (overlap loop); disagg
# prefill's polling loop keeps two results unprocessed; the third is being recorded.
COPY_DONE_DEPTH = 3

_TRACKED: dict[type, type] = {}


def tracked_event_class(base: type) -> type:
    """``base`` (an Event class) plus a flag: recorded and not yet consumed."""
    cls = _TRACKED.get(base)
    if cls is not None:
        return cls

    class RingEvent(base):
        hs_pending = False
        hs_records = 0  # tests compare it between a record and its waiter's wait

        def record(self, stream=None):
            super().record(stream)
            self.hs_pending = True
            self.hs_records += 1

        def wait(self, stream=None):
            super().wait(stream)
            self.hs_pending = False  # cudaStreamWaitEvent bound the current record

        def synchronize(self):
            super().synchronize()
            self.hs_pending = False

        def query(self):
            done = super().query()
            if done:
                self.hs_pending = False
            return done

    RingEvent.__name__ = RingEvent.__qualname__ = f"Ring{base.__name__}"
    _TRACKED[base] = RingEvent
    return RingEvent


def known_complete(event) -> bool:
    """True when ``event`` is a ring event whose last record was waited on or seen fired."""
    return type(event) in _TRACKED.values() and not event.hs_pending


class EventRing:
    """``depth`` events handed out in turn; counters for tests and benchmarks."""

    def __init__(self, event_class: type, depth: int):
        self.event_class = tracked_event_class(event_class)
        self.events: list = [None] * depth
        self.next = 0
        self.allocations = 0  # events constructed
        self.premature = 0  # next event still pending and not fired: a new one was made

    def acquire(self):
        index = self.next
        self.next = (index + 1) % len(self.events)
        event = self.events[index]
        if event is not None and event.hs_pending and not event.query():
            self.premature += 1
            event = None
        if event is None:
            event = self.events[index] = self.event_class()
            self.allocations += 1
        return event


# --- read_done -------------------------------------------------------------

_read_done_rings: "weakref.WeakKeyDictionary[object, EventRing]" = weakref.WeakKeyDictionary()


def read_done_ring(runner) -> EventRing:
    ring = _read_done_rings.get(runner)
    if ring is None:
        ring = _read_done_rings[runner] = EventRing(runner.device_module.Event, READ_DONE_DEPTH)
    return ring


def publish_read_done_hook(original, self, in_graph: bool):
    if in_graph:  # SGLang wires its persistent in-graph marker: nothing is made
        return original(self, in_graph)
    read_done = read_done_ring(self).acquire()
    read_done.record()
    self.model_runner.shared_read_done_event = read_done


# --- scheduler events (copy_done and the rest) ---------------------------------


class RingDeviceModule:
    """Stands in for the scheduler's ``device_module``: ``Event()`` from a ring."""

    def __init__(self, module, depth: int = COPY_DONE_DEPTH):
        self.hs_module = module
        self.hs_ring = EventRing(module.Event, depth)

    def Event(self, *args, **kwargs):  # noqa: N802 (the module attribute's name)
        if args or kwargs:
            return self.hs_module.Event(*args, **kwargs)
        return self.hs_ring.acquire()

    def __getattr__(self, name):
        return getattr(self.hs_module, name)


def wrap_device_module(scheduler) -> None:
    module = scheduler.device_module
    if isinstance(module, RingDeviceModule):
        return
    scheduler.device_module = RingDeviceModule(module)


def init_overlap_hook(original, self):
    result = original(self)
    from sglang.srt.runtime_context import get_parallel

    if self.enable_unified_memory or get_parallel().pp_size > 1:
        # Their events (forward_done, PP sends) may be held past the depth argument above.
        logger.info("event_ring: scheduler events left to SGLang under unified memory / PP; read_done ring on")
    else:
        wrap_device_module(self)
    return result


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang#31698",
    summary="read_done (ring of 2) and scheduler copy_done (ring of 3) events reused, not Event() per step",
    default=True,
    targets=(
        HookTarget(
            f"{RUNNER}._publish_read_done", TargetKind.FUNCTION, hook=publish_read_done_hook,
            params=("self", "in_graph"), source_sha="327e0b0335025473",  # re-implemented: pin it
        ),
        HookTarget(
            f"{SCHEDULER}.init_overlap", TargetKind.FUNCTION, hook=init_overlap_hook,
            params=("self",),
        ),
    ),
)
