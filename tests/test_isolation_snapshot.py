"""isolation_snapshot on the CPU: against SGLang's own ``Scheduler._forward_isolation`` and
``record_batch_in_overlap`` on a real ScheduleBatch (every field a distinct object), the hook leaves
the batch, its extra attributes and the two-iteration record exactly as SGLang's code does, after
a normal forward and after one that raised; the cases it hands to SGLang's code (non-speculative
batch, a field missing from the instance dict, classes whose attributes are not plain); its
target pins and inert rules; and, through SGLang's HookRegistry in a fresh interpreter, that the
scheduler's methods reach it."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import isolation_snapshot as iso


class Algo:
    def __init__(self, none: bool):
        self.none = none

    def is_none(self):
        return self.none


class SamplingInfo:
    def __init__(self, tag):
        self.tag = tag

    def copy_for_forward(self):
        return SamplingInfo(f"{self.tag}/forward")


def _stock():
    from sglang.srt.managers.scheduler import Scheduler

    return Scheduler._forward_isolation, Scheduler.record_batch_in_overlap


def _batches(speculative=True):
    """Two ScheduleBatches holding the same object in every field (one per side of a comparison)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    values = {f.name: object() for f in dataclasses.fields(ScheduleBatch)}
    values["spec_algorithm"] = Algo(none=not speculative)
    values["sampling_info"] = SamplingInfo("sched")
    out = []
    for _ in range(2):
        b = ScheduleBatch.__new__(ScheduleBatch)
        b.__dict__.update(values)
        out.append(b)
    return out


def _scheduler(record):
    sched = SimpleNamespace(batch_record_ct=0, batch_record_buf=[None, None])
    sched.record_batch_in_overlap = lambda batch: record(sched, batch)
    return sched


NEW = {name: object() for name in ("seq_lens", "spec_info", "forward_mode", "input_ids", "out_cache_loc")}
EXTRA = object()


def _forward(batch, raise_=False):
    """What a spec v2 forward does to the batch: rebinds fields, adds a non-field attribute."""
    seen = batch.sampling_info
    for name, value in NEW.items():
        setattr(batch, name, value)
    batch.hostsync_test_extra = EXTRA
    if raise_:
        raise RuntimeError("forward failed")
    return seen


def _ids(values):
    """Object ids, except a sampling info (each run makes its own forward copy): its tag."""
    return [v.tag if isinstance(v, SamplingInfo) else id(v) for v in values]


def _state(batch, sched):
    """The batch's attributes, and the record slot the last call wrote (batch, field values)."""
    snapshot = sched.batch_record_buf[sched.batch_record_ct]
    return (dict(zip(vars(batch), _ids(vars(batch).values()))), sched.batch_record_ct,
            None if snapshot is None else (snapshot[0] is batch, _ids(snapshot[1])))


def _run(isolation, record, batch, overlap, raise_=False):
    sched = _scheduler(record)
    seen = None
    try:
        with isolation(sched, batch, overlap=overlap):
            seen = _forward(batch, raise_).tag
    except RuntimeError:
        assert raise_
    return sched, seen


def _hooked():
    isolation, record = _stock()
    return (lambda s, b, overlap: iso.isolation_hook(isolation, s, b, overlap=overlap),
            lambda s, b: iso.record_hook(record, s, b))


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("raise_", [False, True])
def test_same_batch_and_record_as_sglangs_code(overlap, raise_):
    stock_batch, hook_batch = _batches()
    stock = _run(*_stock(), stock_batch, overlap, raise_)
    hooked = _run(*_hooked(), hook_batch, overlap, raise_)
    assert _state(stock_batch, stock[0]) == _state(hook_batch, hooked[0])
    assert stock[1] == hooked[1] == (None if raise_ else "sched/forward")  # the forward saw its own copy
    assert hook_batch.sampling_info.tag == "sched" and hook_batch.hostsync_test_extra is EXTRA
    assert all(getattr(hook_batch, n) is not v for n, v in NEW.items())  # the fields came back
    if overlap:
        record = hooked[0].batch_record_buf[hooked[0].batch_record_ct]
        assert record[1][[f.name for f in dataclasses.fields(hook_batch)].index("sampling_info")].tag == "sched/forward"


def test_record_alone_matches_and_alternates():
    stock_batch, hook_batch = _batches()
    _, record = _stock()
    a, b = _scheduler(record), _scheduler(record)
    for _ in range(3):
        record(a, stock_batch)
        iso.record_hook(record, b, hook_batch)
        assert _state(stock_batch, a) == _state(hook_batch, b)
    assert b.batch_record_ct == 1 and b.batch_record_buf[0] is not None


def _spy(fn, calls):
    def spy(*args, **kwargs):
        calls.append(args[1:])
        return fn(*args, **kwargs)
    return spy


def test_non_speculative_batch_runs_sglangs_code():
    isolation, record = _stock()
    calls = []
    stock_batch, hook_batch = _batches(speculative=False)
    stock = _run(isolation, record, stock_batch, True)
    hooked = _run(lambda s, b, overlap: iso.isolation_hook(_spy(isolation, calls), s, b, overlap=overlap),
                  record, hook_batch, True)
    assert len(calls) == 1 and _state(stock_batch, stock[0]) == _state(hook_batch, hooked[0])


def test_a_field_missing_from_the_instance_dict_goes_to_sglangs_getattr():
    """A field deleted from the instance reads the class default in SGLang's code; the hook hands
    that batch to it, in both methods."""
    isolation, record = _stock()
    stock_batch, hook_batch = _batches()
    name = next(f.name for f in dataclasses.fields(stock_batch) if f.name in type(stock_batch).__dict__)
    for b in (stock_batch, hook_batch):
        del b.__dict__[name]
    iso_calls, rec_calls = [], []
    stock = _run(isolation, record, stock_batch, True)
    hooked = _run(lambda s, b, overlap: iso.isolation_hook(_spy(isolation, iso_calls), s, b, overlap=overlap),
                  lambda s, b: iso.record_hook(_spy(record, rec_calls), s, b), hook_batch, True)
    assert len(iso_calls) == 1 and len(rec_calls) == 1
    assert _state(stock_batch, stock[0]) == _state(hook_batch, hooked[0])
    assert name in hook_batch.__dict__  # SGLang's restore sets every field on the instance


def test_classes_whose_attributes_are_not_plain_are_left_to_sglang():
    @dataclasses.dataclass
    class Plain:
        a: int = 0
        b: int = 0

    @dataclasses.dataclass
    class WithProperty:
        a: int = 0
        b: int = 0

    WithProperty.b = property(lambda self: 1, lambda self, v: None)

    @dataclasses.dataclass
    class WithSetattr:
        a: int = 0
        b: int = 0

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int = 0
        b: int = 0

    @dataclasses.dataclass
    class One:
        a: int = 0

    assert iso.fields_of(Plain).names == ("a", "b")
    for cls in (WithProperty, WithSetattr, Slotted, One, SimpleNamespace):
        assert iso.fields_of(cls) is None, cls


def test_schedule_batch_takes_the_fast_path():
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    fields = iso.fields_of(ScheduleBatch)
    assert fields is not None and fields.names == tuple(f.name for f in dataclasses.fields(ScheduleBatch))
    assert len(fields.names) > 50


def test_target_pins_and_preset():
    assert check_slot(iso.SLOT) is None
    assert [t.path for t in iso.SLOT.targets] == [iso.ISOLATION, iso.RECORD]
    assert not iso.SLOT.default and "eagle_host" in iso.SLOT.presets


def test_inert_rules():
    for algo in ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH"):
        assert iso.SLOT.inert(ServingFacts(algo, topk=1)) is None
    assert "unset" in iso.SLOT.inert(ServingFacts())


def test_installed_where_the_scheduler_calls_it():
    """Through the real HookRegistry with the preset and the audit: ``Scheduler``'s two methods
    reach the hooks and a speculative forward is isolated as SGLang isolates it."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, dataclasses
from types import SimpleNamespace
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang_hostsync_plugin.slots import isolation_snapshot as iso
class Algo:
    def is_none(self): return False
class SI:
    def copy_for_forward(self): return SI()
b = ScheduleBatch.__new__(ScheduleBatch)
b.__dict__.update({f.name: object() for f in dataclasses.fields(ScheduleBatch)})
b.spec_algorithm, b.sampling_info = Algo(), SI()
before = dict(vars(b))
sched = SimpleNamespace(batch_record_ct=0, batch_record_buf=[None, None])
sched.record_batch_in_overlap = lambda batch: Scheduler.record_batch_in_overlap(sched, batch)
cm = Scheduler._forward_isolation(sched, b, overlap=True)
with cm:
    b.seq_lens = object()
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["isolation_snapshot"].status.value,
      "fast": type(cm) is iso.Isolation, "restored": vars(b) == before,
      "recorded": sched.batch_record_buf[1][0] is b}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"err": None, "status": "applied", "fast": True, "restored": True, "recorded": True}, res


def test_the_benchmark_runs(tmp_path, capsys):
    import importlib.util
    import os

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("bench_isolation_snapshot",
                                                  os.path.join(REPO, "benchmarks", "bench_isolation_snapshot.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "b.json"
    assert bench.main(["--calls", "20", "--repeats", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["median_us"]) == {"stock", "isolation_snapshot"} and all(v > 0 for v in data["median_us"].values())
    assert "isolation_snapshot / stock:" in capsys.readouterr().out
