"""Slot ``isolation_snapshot``: the scheduler's per-forward snapshot of the batch's fields reads and
restores them in one C-level call each, not one Python ``getattr``/``setattr`` per field (host
work per step).

SGLang 0.5.23, ``Scheduler._forward_isolation`` (every speculative forward under spec v2): it takes
``dataclasses.fields(batch)`` and a ``getattr`` of each of the ScheduleBatch's 99 fields before the
forward and a ``setattr`` of each after it (the worker rebinds fields mid-forward), and
``record_batch_in_overlap`` takes the fields and their values once more to keep the batch's
tensors alive for two iterations. That is about 300 attribute operations and two field scans per
step: 23.8 µs per forward on the CPU box against 5.4 with this slot (``bench_isolation_snapshot.py``);
in real H200 servers the phase that holds it (``run_batch``) moved 1.7-2.5% beyond the host speed.

With the slot the field names come from the batch's class once; the values are read from the
instance dict with one ``operator.itemgetter`` call and written back with one ``dict.update``.
That is what ``getattr``/``setattr`` do for a dataclass whose fields are plain instance
attributes, which is checked once per class: no ``__slots__``, no ``__setattr__`` or
``__getattribute__`` of its own, no data descriptor named like a field. A class that fails the
check, a batch whose dict lacks a field, and a non-speculative batch run SGLang's methods. The
order of the steps (snapshot, ``sampling_info`` swapped for its forward copy, the batch recorded,
the restore in ``finally``) and the values are SGLang's. Hook targets: ``Scheduler._forward_isolation``
and ``Scheduler.record_batch_in_overlap`` (AROUND).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import NamedTuple

from ..slot import HookTarget, Slot, SlotKind, TargetKind, not_speculative
from .upstream_switches import HOST_PRESET

NAME = "isolation_snapshot"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
ISOLATION = f"{SCHEDULER}._forward_isolation"
ISOLATION_SHA = "1b3afb2200527f72"
RECORD = f"{SCHEDULER}.record_batch_in_overlap"
RECORD_SHA = "72ac533f176e64b1"


class Fields(NamedTuple):
    names: tuple[str, ...]
    values: operator.itemgetter  # instance dict -> the fields' values, in field order


_by_class: dict[type, Fields | None] = {}


def _data_descriptor(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            kind = type(klass.__dict__[name])
            return hasattr(kind, "__set__") or hasattr(kind, "__delete__")
    return False


def fields_of(cls: type) -> Fields | None:
    """The plan for ``cls``, or None where a dict read/update is not what getattr/setattr do."""
    if cls not in _by_class:
        plain = (dataclasses.is_dataclass(cls) and cls.__setattr__ is object.__setattr__
                 and cls.__getattribute__ is object.__getattribute__ and "__slots__" not in vars(cls))
        names = tuple(f.name for f in dataclasses.fields(cls)) if plain else ()
        # itemgetter of one name returns the value, not a 1-tuple: such a class stays SGLang's.
        if len(names) < 2 or any(_data_descriptor(cls, n) for n in names):
            _by_class[cls] = None
        else:
            _by_class[cls] = Fields(names, operator.itemgetter(*names))
    return _by_class[cls]


class Isolation:
    """``_forward_isolation``'s speculative branch: snapshot, ``sampling_info`` swap, record on
    enter; every field restored on exit, whether or not the forward raised."""

    __slots__ = ("scheduler", "batch", "overlap", "fields", "original", "saved", "delegate")

    def __init__(self, scheduler, batch, overlap: bool, fields: Fields, original):
        self.scheduler, self.batch, self.overlap, self.fields, self.original = scheduler, batch, overlap, fields, original
        self.saved = self.delegate = None

    def __enter__(self):
        batch = self.batch
        try:
            self.saved = self.fields.values(batch.__dict__)
        except KeyError:  # a field not in the instance dict: SGLang's getattr path decides
            self.delegate = self.original(self.scheduler, batch, overlap=self.overlap)
            return self.delegate.__enter__()
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            batch.sampling_info = sampling_info.copy_for_forward()
        if self.overlap:
            self.scheduler.record_batch_in_overlap(batch)
        return None

    def __exit__(self, *exc):
        if self.delegate is not None:
            return self.delegate.__exit__(*exc)
        self.batch.__dict__.update(zip(self.fields.names, self.saved))
        return False


def isolation_hook(original, self, batch, *, overlap):
    fields = fields_of(type(batch))
    if fields is None or batch.spec_algorithm.is_none():
        return original(self, batch, overlap=overlap)
    return Isolation(self, batch, overlap, fields, original)


def record_hook(original, self, batch):
    fields = fields_of(type(batch))
    if fields is None:
        return original(self, batch)
    try:
        snapshot = list(fields.values(batch.__dict__))
    except KeyError:
        return original(self, batch)
    self.batch_record_ct = (self.batch_record_ct + 1) % 2
    self.batch_record_buf[self.batch_record_ct] = [batch, snapshot]


def inert(f) -> str | None:
    return not_speculative(f, "the full field snapshot is taken for speculative batches only",
                           bool(f.speculative_algorithm))


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (spec v2 scheduler loop: forward isolation snapshot)",
    summary="the scheduler's per-forward batch snapshot and restore in one dict read and one dict "
            "update, not ~300 getattr/setattr per step",
    default=False,
    presets=(HOST_PRESET,),
    inert=inert,
    targets=(
        HookTarget(ISOLATION, TargetKind.FUNCTION, hook=isolation_hook, params=("self", "batch", "overlap"),
                   source_sha=ISOLATION_SHA),
        HookTarget(RECORD, TargetKind.FUNCTION, hook=record_hook, params=("self", "batch"), source_sha=RECORD_SHA),
    ),
)
