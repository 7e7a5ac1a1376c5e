"""eagle_fixed_shape_tail on the CPU: KV pool bit-identical to stock SGLang's
duplicate_prefix_tail_to_draft_branches, Triton kernel under TRITON_INTERPRET."""

import random
import threading

import pytest

from hostsync_drivers.eagle_tail import changed, make_case, pools_equal, run_both
from sglang_hostsync_plugin import csrc
from sglang_hostsync_plugin.config import HostsyncConfigError
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft

from helpers import BlockingBuild


def triton_call(pool, rows, base, last, pages, topk, page_size):
    tgt, src = eft.tail_slots_triton(rows, base, last, pages, topk, page_size)
    pool.move_kv_cache(tgt, src)


def hook_call(pool, *args):
    eft.duplicate_prefix_tail(None, pool, *args)


EDGES = [
    dict(bs=1, topk=2, page_size=4),
    dict(bs=1, topk=4, page_size=16, last_page=0),
    dict(bs=3, topk=3, page_size=16, last_page=15),
    dict(bs=2, topk=2, page_size=2, last_page=1),
    dict(bs=64, topk=4, page_size=8),
    dict(bs=5, topk=2, page_size=64, last_page=63, num_steps=1),
]


@pytest.mark.parametrize("case", EDGES, ids=[str(c) for c in EDGES])
def test_edges_bit_identical_to_stock(case):
    rng = random.Random(str(case))
    topk, page_size = case["topk"], case["page_size"]
    size, args = make_case(rng, **case)
    stock, plugin = run_both(size, args, topk, page_size, triton_call)
    assert pools_equal(stock, plugin)
    # Whenever a lane is live, the call really copied (the comparison is not vacuous).
    assert changed(stock, 0, size, page_size, "cpu") == bool((args[2] > 0).any())


def test_random_cases_bit_identical_to_stock():
    rng = random.Random(7)
    for i in range(40):
        topk, page_size = rng.choice([2, 3, 4, 8]), rng.choice([2, 4, 16, 32, 64])
        size, args = make_case(rng, rng.randint(1, 12), topk, page_size)
        stock, plugin = run_both(size, args, topk, page_size, hook_call, seed=i)
        assert pools_equal(stock, plugin), (i, topk, page_size)


def test_topk_one_is_a_no_op():
    rng = random.Random(1)
    size, args = make_case(rng, 3, 1, 4)
    stock, plugin = run_both(size, args, 1, 4, hook_call)
    assert pools_equal(stock, plugin) and not changed(plugin, 0, size, 4, "cpu")


def test_masked_lanes_copy_only_slot_zero_onto_itself():
    rng = random.Random(3)
    size, (rows, base, last, pages) = make_case(rng, 4, 3, 8)
    tgt, src = eft.tail_slots_triton(rows, base, last, pages, 3, 8)
    assert tgt.shape == src.shape == (4 * 2 * 8,)
    lane_off = (tgt.new_zeros(0).new_tensor(range(tgt.numel())) % 8)
    masked = lane_off.view(4, 2, 8) >= last.view(4, 1, 1)
    assert bool((tgt.view(4, 2, 8)[masked] == 0).all()) and bool((src.view(4, 2, 8)[masked] == 0).all())
    assert bool((tgt.view(4, 2, 8)[~masked] != 0).all())


@pytest.mark.skipif(csrc.unavailable_reason() is None, reason="this machine can build csrc (the GPU run tests that path)")
def test_loader_falls_back_to_triton_without_gpu_toolchain():
    impl, why = eft.choose_impl({})
    assert impl == "triton" and why.startswith("auto: csrc unavailable (")
    assert eft.choose_impl({eft.ENV_IMPL: "triton"})[0] == "triton"
    with pytest.raises(HostsyncConfigError, match="cannot be built here"):
        eft.choose_impl({eft.ENV_IMPL: "cuda"})
    with pytest.raises(HostsyncConfigError, match="use one of auto, triton, cuda"):
        eft.choose_impl({eft.ENV_IMPL: "fast"})
    with pytest.raises(RuntimeError, match="cannot build csrc/eagle_tail.cu"):
        csrc.load("eagle_tail")


def test_csrc_source_ships_with_the_package():
    with open(csrc.source_path("eagle_tail.cu")) as f:
        assert "tail_slots_kernel" in f.read()


def test_bad_impl_env_refuses_the_slot(monkeypatch):
    monkeypatch.setenv(eft.ENV_IMPL, "fast")
    assert eft.SLOT.precheck().startswith("bad configuration: SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL='fast'")


@pytest.fixture
def tail_prepare(monkeypatch):
    """prepare() under ``auto`` choosing csrc, with the kernel calls recorded: the csrc
    one stands in with Triton (no CUDA here), so the pool stays checkable against stock."""
    calls = []
    monkeypatch.setattr(csrc, "AUTO_WAIT_S", 0.05)
    monkeypatch.setattr(eft, "choose_impl", lambda env=None: ("cuda", "auto: csrc where it builds"))
    triton_fn = eft.tail_slots_triton
    monkeypatch.setattr(eft, "tail_slots_cuda", lambda *a: (calls.append("cuda"), triton_fn(*a))[1])
    monkeypatch.setattr(eft, "tail_slots_triton", lambda *a: (calls.append("triton"), triton_fn(*a))[1])
    monkeypatch.setattr(eft, "_impl", None)
    monkeypatch.delenv(eft.ENV_IMPL, raising=False)
    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16)
    yield facts, calls
    csrc.wait_loaded("eagle_tail", 70)


def _one_step_bit_identical(seed):
    rng = random.Random(seed)
    size, args = make_case(rng, 3, 4, 16)
    stock, plugin = run_both(size, args, 4, 16, hook_call, seed=seed)
    assert pools_equal(stock, plugin)


def test_an_auto_kernel_still_building_never_holds_the_start(tail_prepare, monkeypatch, caplog):
    facts, calls = tail_prepare
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "load", build)
    with caplog.at_level("INFO", logger="sglang.srt.plugins.hostsync"):
        note = eft.prepare(facts)
        assert not build.released.is_set(), "prepare returned only once the build was done"
        assert "still building" in note and eft._impl == "triton"
        assert build.threads == ["hostsync-load-eagle_tail"]  # never the scheduler's thread
        _one_step_bit_identical(1)
        build.released.set()
        assert csrc.wait_loaded("eagle_tail", 10)
        assert eft._impl == "cuda"
        _one_step_bit_identical(2)
    build.timer.cancel()
    assert not build.by_timer.is_set()
    assert calls == ["triton", "cuda"]
    assert "csrc/eagle_tail.cu loaded" in caplog.text and "serves from now on" in caplog.text


def test_an_auto_kernel_failing_late_leaves_triton_serving(tail_prepare, monkeypatch, caplog):
    facts, calls = tail_prepare
    build = BlockingBuild(fail=True)
    monkeypatch.setattr(csrc, "load", build)
    with caplog.at_level("INFO", logger="sglang.srt.plugins.hostsync"):
        assert "still building" in eft.prepare(facts)
        build.released.set()
        assert csrc.wait_loaded("eagle_tail", 10)
        _one_step_bit_identical(3)
    build.timer.cancel()
    assert eft._impl == "triton" and calls == ["triton"]
    assert "nvcc error: stand-in" in caplog.text and "using the fallback path" in caplog.text


@pytest.mark.parametrize("fail", [False, True])
def test_an_auto_kernel_ready_in_time_decides_at_prepare(tail_prepare, monkeypatch, fail):
    facts, calls = tail_prepare
    monkeypatch.setattr(csrc, "AUTO_WAIT_S", 30.0)
    build = BlockingBuild(fail=fail)
    build.released.set()
    monkeypatch.setattr(csrc, "load", build)
    note = eft.prepare(facts)
    build.timer.cancel()
    if fail:
        assert note == "fallback: nvcc error: stand-in" and eft._impl == "triton"
    else:
        assert note.startswith("csrc/eagle_tail.cu loaded in") and eft._impl == "cuda"


@pytest.mark.parametrize("fail", [False, True])
def test_an_explicit_cuda_kernel_is_loaded_before_ready(tail_prepare, monkeypatch, fail):
    facts, calls = tail_prepare
    monkeypatch.setattr(eft, "choose_impl", lambda env=None: ("cuda", f"{eft.ENV_IMPL}=cuda"))
    monkeypatch.setenv(eft.ENV_IMPL, "cuda")
    build = BlockingBuild(fail=fail)
    monkeypatch.setattr(csrc, "load", build)
    threading.Timer(0.3, build.released.set).start()
    if fail:
        with pytest.raises(RuntimeError, match="nvcc error"):
            eft.prepare(facts)
    else:
        assert eft.prepare(facts).startswith("csrc/eagle_tail.cu loaded in")
        assert eft._impl == "cuda"
    build.timer.cancel()
    assert build.released.is_set() and not build.by_timer.is_set()
    assert build.threads == [threading.current_thread().name]
