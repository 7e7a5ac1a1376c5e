"""small_copy_launch on the CPU: on random runner copies and the edge cases try_small_copy turns
away, the hook's result and copies equal SGLang's own function's (its source with the CUDA check
removed and the Triton kernel emulated in torch), every signature after its capture is relaunched
without SGLang's function, and what it leaves to SGLang. The real kernel: test_gpu_small_copy_launch.py."""

import logging
import random
from types import SimpleNamespace

import pytest
import torch

from hostsync_drivers import small_copy as drv
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slots import small_copy_launch as slc


class Compiled:
    """A compiled kernel's launcher as the slot replays it: the emulated copy, counted."""

    def __init__(self):
        self.src = SimpleNamespace(signature=dict.fromkeys(FakeKernel.arg_names))
        self.function, self.packed_metadata, self.replays = "fn", "md", []

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *values):
        assert (function, metadata, launch_metadata, enter, exit_) == ("fn", "md", None, None, None)
        self.replays.append((g0, g1, g2))
        drv.emulate((g0, g1), *values)


class FakeKernel:
    """``_small_copy_kernel`` as Triton's KernelInterface calls it: ``k[grid](...)`` -> ``k.run``."""

    arg_names = ["sources", "destinations", "sizes", "cols", "source_strides", "dest_strides", "BIT_WIDTHS", "BLOCK"]
    params = [SimpleNamespace(default=None) for _ in arg_names]

    def __init__(self):
        self.compiled, self.launches = Compiled(), 0

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        self.launches += 1
        drv.emulate(grid, *args, **kwargs)
        return self.compiled


@pytest.fixture
def cpu_slot(monkeypatch):
    """The slot taking CPU tensors, SGLang's function (CUDA check removed) launching a FakeKernel."""
    from sglang.kernels.ops.memory import small_copy

    kernel = FakeKernel()
    monkeypatch.setattr(small_copy, "_small_copy_kernel", kernel)
    monkeypatch.setattr(slc, "_ON_DEVICE", ("cuda", "cpu"))
    monkeypatch.setattr(slc, "_current_device", lambda: 0)
    monkeypatch.setattr(slc, "_stream", lambda device: "stream")
    monkeypatch.setattr(slc, "_launch_hooked", lambda: False)
    monkeypatch.setattr(slc, "_state", slc.State(plans={}))
    calls = []
    stock = drv.stock_anywhere(lambda grid, *a, **kw: small_copy._small_copy_kernel[grid](*a, **kw))

    def original(dsts, srcs):
        calls.append(len(dsts))
        return stock(dsts, srcs)

    return SimpleNamespace(kernel=kernel, stock=stock, original=original, calls=calls)


def test_results_and_copies_match_sglangs_function(cpu_slot):
    rng = random.Random(5)
    kinds, n = set(), 0
    for kind, dsts, srcs in drv.cases(rng, 300, "cpu"):
        for _ in range(2):  # the second time with new source contents: the signature's replay
            want = drv.run_on_copies(cpu_slot.stock, dsts, srcs)
            got = drv.run_on_copies(lambda d, s: slc.small_copy_hook(cpu_slot.original, d, s), dsts, srcs)
            assert got[0] is want[0], (kind, got[0], want[0])
            assert all(torch.equal(a, b) for a, b in zip(got[1], want[1])), kind
            drv.bump(srcs)
            kinds.add((kind, want[0]))
            n += 1
    assert {("runner", True), ("alias", True), ("alias_cast", False), ("overlap_src", False), ("overlap_dst", False), ("neg", False),
            ("grad", False), ("big", False), ("float_cast", False), ("ndim3", False), ("empty", True),
            ("col_stride", True), ("transposed", False), ("short", False)} <= kinds, kinds
    assert slc._state.hits > n / 3 and cpu_slot.kernel.compiled.replays, (slc._state.hits, n)
    assert len(cpu_slot.calls) == slc._state.captures < n / 2


def test_a_replay_launches_the_captured_kernel_on_the_new_tensors(cpu_slot):
    gen = torch.Generator().manual_seed(3)
    dsts, srcs = drv.runner_case(random.Random(1), 4, 4, "cpu", gen)
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True  # captured (SGLang's function ran)
    assert cpu_slot.calls == [6] and cpu_slot.kernel.launches == 1
    fresh = [drv._tensor(s.shape, s.dtype, "cpu", gen) for s in srcs]
    assert slc.small_copy_hook(cpu_slot.original, dsts, fresh) is True
    assert cpu_slot.calls == [6] and cpu_slot.kernel.launches == 1 and len(cpu_slot.kernel.compiled.replays) == 1
    assert all(torch.equal(d, s.to(d.dtype)) for d, s in zip(dsts, fresh))
    assert cpu_slot.kernel.compiled.replays[0] == (6, 1, 1)  # the recorded grid: one program row per field


def test_the_key_holds_what_the_checks_and_the_specialization_read(cpu_slot):
    buf = torch.zeros(32, dtype=torch.int64)
    base = ([buf[0:4], torch.zeros(2)], [torch.ones(4, dtype=torch.int64), torch.ones(2)])
    key = slc.key_of(*base)
    assert slc.key_of([buf[1:5], base[0][1]], base[1]) != key  # 16-byte alignment (Triton specializes on it)
    assert slc.key_of([buf[2:6], base[0][1]], base[1]) == key
    assert slc.key_of(base[0], [base[1][0].to(torch.int32), base[1][1]]) != key  # a cast
    assert slc.key_of(base[0], [base[1][0], torch.ones(2, requires_grad=True)]) != key


def test_checked_addresses_are_remembered_per_signature_and_an_overlap_is_still_refused(cpu_slot, monkeypatch):
    checked = []
    real = slc.overlaps
    monkeypatch.setattr(slc, "overlaps", lambda *a: checked.append(1) or real(*a))
    a, b = torch.zeros(16, dtype=torch.int64), torch.zeros(16, dtype=torch.int64)
    dsts = [a[0:4], b[0:2]]
    srcs = [torch.arange(4), torch.arange(2) + 7]
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(checked) == 1  # captured
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(checked) == 1  # remembered
    moved = [torch.arange(4) + 1, torch.arange(2) + 2]
    assert slc.small_copy_hook(cpu_slot.original, dsts, moved) is True and len(checked) == 2
    onto = [torch.arange(4) + 3, a[0:2]]  # the same signature, a source inside the first destination
    assert slc.key_of(dsts, onto) == slc.key_of(dsts, srcs)
    before = [d.clone() for d in dsts]
    assert cpu_slot.stock(dsts, onto) is False
    assert slc.small_copy_hook(cpu_slot.original, dsts, onto) is False and len(checked) == 3
    assert slc.small_copy_hook(cpu_slot.original, dsts, onto) is False and len(checked) == 4  # never remembered
    assert all(torch.equal(d, x) for d, x in zip(dsts, before))
    assert len(slc._state.plans[slc.key_of(dsts, srcs)].clear) == 2
    monkeypatch.setattr(slc, "MAX_CLEAR", 2)  # full: new addresses are checked on every call
    again = [torch.arange(4) + 5, torch.arange(2) + 6]
    assert slc.small_copy_hook(cpu_slot.original, dsts, again) is True and len(checked) == 5
    assert slc.small_copy_hook(cpu_slot.original, dsts, again) is True and len(checked) == 6
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(checked) == 6


def test_a_capture_that_disagrees_keeps_sglangs_function(cpu_slot, caplog):
    dsts, srcs = drv.runner_case(random.Random(4), 2, 4, "cpu", torch.Generator().manual_seed(4))
    said = []

    def refuses(d, s):
        said.append(1)
        return False

    with caplog.at_level(logging.WARNING, logger="sglang.srt.plugins.hostsync"):
        assert slc.small_copy_hook(refuses, dsts, srcs) is False
        assert slc.small_copy_hook(refuses, dsts, srcs) is False
        assert slc.small_copy_hook(refuses, dsts[1:], srcs[1:]) is False  # another key: no second line
    assert len(said) == 3 and caplog.text.count("keeps SGLang's try_small_copy") == 1
    assert slc._state.plans[slc.key_of(dsts, srcs)].stock


def test_a_compiled_kernel_api_it_does_not_know_keeps_sglangs_function(cpu_slot):
    """Triton's compiled-kernel fields moved (here: no launcher): the capture's copy stands, the key keeps
    SGLang's function, nothing raises into the serving loop."""
    cpu_slot.kernel.compiled = SimpleNamespace(src=SimpleNamespace(signature=dict.fromkeys(FakeKernel.arg_names)))
    dsts, srcs = drv.runner_case(random.Random(8), 2, 4, "cpu", torch.Generator().manual_seed(8))
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True
    assert all(torch.equal(d, s.to(d.dtype)) for d, s in zip(dsts, srcs))
    assert slc._state.plans[slc.key_of(dsts, srcs)].stock
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(cpu_slot.calls) == 2


def test_what_it_leaves_to_sglang(cpu_slot, monkeypatch):
    dsts, srcs = drv.runner_case(random.Random(6), 2, 4, "cpu", torch.Generator().manual_seed(6))
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True
    monkeypatch.setattr(slc, "_launch_hooked", lambda: True)  # a profiler's launch hooks
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(cpu_slot.calls) == 2
    monkeypatch.setattr(slc, "_launch_hooked", lambda: False)
    monkeypatch.setattr(slc, "_current_device", lambda: 1)  # another current device: captured again
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(cpu_slot.calls) == 3
    for fn in (cpu_slot.stock, lambda d, s: slc.small_copy_hook(cpu_slot.original, d, s)):
        with pytest.raises(AttributeError):  # not tensors: SGLang's function raises, through the hook too
            fn(["x", "y"], ["x", "y"])
    assert len(cpu_slot.calls) == 4
    assert slc.small_copy_hook(cpu_slot.original, dsts[:1], srcs[:1]) is False  # stock's length check
    monkeypatch.setattr(slc, "MAX_PLANS", len(slc._state.plans))  # full: a new signature goes to SGLang
    assert slc.small_copy_hook(cpu_slot.original, dsts[1:], srcs[1:]) is True and len(cpu_slot.calls) == 5
    assert slc.small_copy_hook(cpu_slot.original, dsts, srcs) is True and len(cpu_slot.calls) == 5  # known: kept


def test_cpu_tensors_stay_false_as_in_stock():
    from sglang.kernels.ops.memory.small_copy import try_small_copy

    dsts, srcs = drv.runner_case(random.Random(7), 2, 4, "cpu", torch.Generator().manual_seed(7))
    assert try_small_copy(dsts, srcs) is False
    assert slc.small_copy_hook(try_small_copy, dsts, srcs) is False


def test_pins_target_and_preset(monkeypatch):
    assert slc.pinned_sources() is None and check_slot(slc.SLOT) is None
    assert not slc.SLOT.default and "eagle_host" in slc.SLOT.presets
    owner, attr, _ = slc.PINS[0]
    monkeypatch.setattr(slc, "PINS", ((owner, attr, "0" * 16),) + slc.PINS[1:])
    assert slc.pinned_sources().startswith("upstream shape changed")


def test_installs_with_the_preset_and_the_audit():
    from helpers import install_eagle_host_with_audit

    order = install_eagle_host_with_audit(slc.NAME)
    assert [path for path, _ in order].count(slc.TARGET) == 1
