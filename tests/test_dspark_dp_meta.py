"""dspark_dp_meta: bit-identical to SGLang 0.5.23's fill on the real DraftBlockProposer."""

import random
import threading
import time

import pytest
import torch

from hostsync_drivers.dp_meta import (compare_stock_and_plugin, make_batch, make_proposer, plugin_classes,
                           random_case, step)
from sglang_hostsync_plugin import csrc, staging
from sglang_hostsync_plugin.config import HostsyncConfigError
from sglang_hostsync_plugin.slots import dspark_dp_meta, target_dp_meta
from sglang_hostsync_plugin.staging import TwoSlotStager

from helpers import BlockingBuild

DEVICE = "cpu"


def _compare(case, nnp_enabled, cls, make_nnp):
    compare_stock_and_plugin(case, nnp_enabled, cls, make_nnp, DEVICE)


def test_random_inputs_bit_identical(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    rng = random.Random(47677)
    for _ in range(400):
        _compare(random_case(rng), nnp_enabled, cls, make_nnp)


@pytest.mark.parametrize("case", [
    dict(gnt=[5], gnt_logprob=[5], coordination=False),              # dp=1
    dict(gnt=[0, 0, 0, 0], gnt_logprob=[0, 0, 0, 0], coordination=False),  # all ranks idle
    dict(gnt=[6, 18, 0, 12], gnt_logprob=[1, 3, 0, 2], coordination=False),  # scaled counts
    dict(gnt=[6, 18, 0, 12], gnt_logprob=[1, 3, 0, 2], coordination=True),   # coordination-applied
])
@pytest.mark.parametrize("idle", [False, True])
def test_edge_cases_bit_identical(case, idle, nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    full = dict(case, dp_moe_sync=True, no_counts=False, nnp=True, idle=idle, num_tokens=0 if idle else 8,
                per_req=4, logprob_per_req=1)
    _compare(full, nnp_enabled, cls, make_nnp)


def test_seed_review_rows_differ_and_three_fills_reuse_storage(nnp_enabled):
    """#47677 review: differing rows, both device tensors asserted; three fills on one
    proposer, each holding its own counts, the third reusing the first's storage."""
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEVICE, per_req=1, logprob_per_req=1)
    counts = [([6, 18, 0, 12], [1, 3, 0, 2]), ([7, 1, 2, 0], [2, 0, 1, 0]), ([0, 9, 9, 3], [0, 4, 5, 1])]
    fbs = []
    for gnt, lp in counts:
        fb = step(p, make_batch(gnt, lp, coordination=True), 8, DEVICE, make_nnp)
        assert fb.global_num_tokens_gpu.tolist() == gnt
        assert fb.global_num_tokens_for_logprob_gpu.tolist() == lp
        fbs.append(fb)
    assert fbs[2].global_num_tokens_gpu.data_ptr() == fbs[0].global_num_tokens_gpu.data_ptr()
    assert fbs[2].global_num_tokens_for_logprob_gpu.data_ptr() == fbs[0].global_num_tokens_for_logprob_gpu.data_ptr()
    assert fbs[1].global_num_tokens_gpu.data_ptr() != fbs[0].global_num_tokens_gpu.data_ptr()
    assert fbs[1].global_num_tokens_gpu.tolist() == counts[1][0]  # the other slot is untouched
    assert p._hs_stager.allocations == 1


def test_no_allocation_after_first_fill_and_realloc_on_dp_change(nnp_enabled):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEVICE, per_req=2)
    rng = random.Random(0)
    ptrs = set()
    for _ in range(200):
        gnt = [rng.randint(0, 9) for _ in range(8)]
        fb = step(p, make_batch(gnt, gnt), 8, DEVICE, make_nnp)
        assert fb.global_num_tokens_gpu.tolist() == [2 * x for x in gnt]
        ptrs.add(fb.global_num_tokens_gpu.data_ptr())
        assert fb.global_num_token_non_padded.data_ptr() == p._num_token_non_padded.data_ptr()
    assert len(ptrs) == 2 and p._hs_stager.allocations == 1
    fb = step(p, make_batch([1, 2, 3], [1, 1, 1]), 8, DEVICE, make_nnp)  # dp changed 8 -> 3
    assert fb.global_num_tokens_gpu.tolist() == [2, 4, 6] and p._hs_stager.allocations == 2


def test_gate_off_is_stock(nnp_enabled):
    state, cls, make_nnp = plugin_classes()
    state.active.clear()
    p = make_proposer(cls, DEVICE)
    fb = step(p, make_batch([1, 2], [1, 2]), 8, DEVICE, make_nnp)
    assert p._hs_stager is None and fb.global_num_token_non_padded is not p._num_token_non_padded
    assert make_nnp(8, DEVICE).tolist() == 8  # the stock H2D path again


def test_stager_alternates_two_slots_and_reuses_them():
    s = TwoSlotStager(rows=2)
    a, b = s.stage("cpu", [1, 2, 3], [4, 5, 6])
    assert a.tolist() == [1, 2, 3] and b.tolist() == [4, 5, 6] and a.dtype == torch.int64
    c, _ = s.stage("cpu", [7, 8, 9], [0, 0, 0])
    assert a.tolist() == [1, 2, 3] and c.tolist() == [7, 8, 9]  # two slots
    assert s.stage("cpu", [5, 5, 5], [6, 6, 6])[0].data_ptr() == a.data_ptr()


def test_stager_scalar_rides_along_in_the_same_stage():
    s = TwoSlotStager(rows=1, scalar=True)
    dst = torch.zeros((1,), dtype=torch.int32)
    (a,) = s.stage("cpu", [1, 2], scalar_into=dst, scalar_value=7)
    assert a.tolist() == [1, 2] and dst.tolist() == [7]
    s.stage("cpu", [3, 4], scalar_into=dst, scalar_value=9)
    assert dst.tolist() == [9] and s.scalar_host[:, 0].tolist() == [7, 9]  # one pinned slot per stage
    s.stage("cpu", [5, 6])  # without scalar_into the destination is untouched
    assert dst.tolist() == [9]


@pytest.mark.parametrize("dst, match", [
    (torch.zeros((1,), dtype=torch.int64), "one contiguous int32 element"),
    (torch.zeros((2,), dtype=torch.int32), "one contiguous int32 element"),
])
def test_stager_scalar_destination_is_checked(dst, match):
    with pytest.raises(ValueError, match=match):
        TwoSlotStager(rows=1, scalar=True).stage("cpu", [1], scalar_into=dst, scalar_value=1)
    with pytest.raises(ValueError, match="scalar=True"):
        TwoSlotStager(rows=1).stage("cpu", [1], scalar_into=torch.zeros((1,), dtype=torch.int32), scalar_value=1)


@pytest.mark.skipif(csrc.unavailable_reason() is None, reason="this machine can build csrc (the GPU run tests that path)")
def test_staging_impl_choice_and_the_slots_precheck(monkeypatch):
    assert staging.staging_impl({}) == "python"  # auto, csrc unavailable here
    assert staging.staging_impl({staging.ENV_IMPL: "python"}) == "python"
    with pytest.raises(HostsyncConfigError, match="cannot be built here"):
        staging.staging_impl({staging.ENV_IMPL: "cuda"})
    monkeypatch.setenv(staging.ENV_IMPL, "fast")
    for slot in (dspark_dp_meta.SLOT, target_dp_meta.SLOT):
        assert slot.precheck() == (f"bad configuration: {staging.ENV_IMPL}='fast': use one of auto, python, cuda")
    monkeypatch.setenv(staging.ENV_IMPL, "python")
    assert dspark_dp_meta.SLOT.precheck() is None


def test_csrc_staging_source_ships_with_the_package():
    with open(csrc.source_path("h2d_stage.cu")) as f:
        assert "cudaEventRecord" in f.read()


@pytest.fixture
def staging_auto(monkeypatch):
    """The stagers under ``auto`` where csrc builds: the build stands in (``csrc._build``)."""
    monkeypatch.setattr(csrc, "unavailable_reason", lambda: None)
    monkeypatch.setattr(csrc, "AUTO_WAIT_S", 0.05)
    monkeypatch.setattr(csrc, "_modules", {})
    monkeypatch.setattr(staging, "_impl", None)
    monkeypatch.delenv(staging.ENV_IMPL, raising=False)
    yield
    csrc.wait_loaded(staging.KERNEL, 70)


def test_staging_kernel_still_building_never_holds_the_start(staging_auto, monkeypatch, caplog):
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "_build", build)
    with caplog.at_level("INFO", logger="sglang.srt.plugins.hostsync"):
        note = staging.prepare_staging("target_dp_meta", True)
        assert not build.released.is_set() and "still building" in note
        assert staging._impl == "python" and not csrc.loaded(staging.KERNEL)
        assert staging.staging_impl() == "python"  # a stager made now stages from Python
        build.released.set()
        assert csrc.wait_loaded(staging.KERNEL, 10)
    build.timer.cancel()
    assert not build.by_timer.is_set() and build.threads == ["hostsync-load-h2d_stage"]
    assert staging._impl == "cuda" and csrc.loaded(staging.KERNEL)
    assert "serves from now on" in caplog.text
    # The second DP-meta slot's prepare finds it loaded: no second load.
    assert staging.prepare_staging("dspark_dp_meta", True) == "csrc/h2d_stage.cu loaded"
    assert build.threads == ["hostsync-load-h2d_stage"]


def test_staging_kernel_failing_late_leaves_python(staging_auto, monkeypatch, caplog):
    build = BlockingBuild(fail=True)
    monkeypatch.setattr(csrc, "_build", build)
    with caplog.at_level("INFO", logger="sglang.srt.plugins.hostsync"):
        assert "still building" in staging.prepare_staging("target_dp_meta", True)
        build.released.set()
        assert csrc.wait_loaded(staging.KERNEL, 10)
    build.timer.cancel()
    assert staging._impl == "python" and not csrc.loaded(staging.KERNEL)
    assert "nvcc error: stand-in" in caplog.text and "using the fallback path" in caplog.text


def test_staging_kernel_asked_for_is_loaded_before_ready(staging_auto, monkeypatch):
    monkeypatch.setenv(staging.ENV_IMPL, "cuda")
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "_build", build)
    threading.Timer(0.3, build.released.set).start()
    assert staging.prepare_staging("target_dp_meta", True).startswith("csrc/h2d_stage.cu loaded in")
    build.timer.cancel()
    assert build.released.is_set() and not build.by_timer.is_set()
    assert build.threads == [threading.current_thread().name] and staging._impl == "cuda"


def test_csrc_load_is_one_load_per_kernel_across_threads(staging_auto, monkeypatch):
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "_build", build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(csrc.load(staging.KERNEL))) for _ in range(3)]
    for t in threads:
        t.start()
    while not build.threads and not build.by_timer.is_set():
        time.sleep(0.01)
    time.sleep(0.3)  # the other two reach load() meanwhile: without the lock they would build too
    build.released.set()
    for t in threads:
        t.join(10)
    build.timer.cancel()
    assert len(build.threads) == 1 and len(results) == 3 and len({id(r) for r in results}) == 1


def test_staging_kernel_failing_within_the_wait_leaves_python(staging_auto, monkeypatch):
    monkeypatch.setattr(csrc, "AUTO_WAIT_S", 30.0)
    build = BlockingBuild(fail=True)
    build.released.set()
    monkeypatch.setattr(csrc, "_build", build)
    staging._impl = "cuda"  # chosen earlier (a stager's first allocation)
    assert staging.prepare_staging("target_dp_meta", True) == "fallback: nvcc error: stand-in"
    build.timer.cancel()
    assert staging._impl == "python"
    failed = []
    assert csrc.load_in_background("staging", staging.KERNEL, on_loaded=lambda: None,
                                   on_failed=lambda: failed.append(1), wait=30).startswith("fallback")
    assert failed == [1]  # once, whether the failure came within the wait or after it


def test_a_stager_made_while_prepares_load_runs_is_pending_until_it_is_loaded(staging_auto, monkeypatch):
    """A stager whose first allocation comes after prepare started the load but before it finished
    stages from Python and is pending: it switches to csrc once the module is loaded."""
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "_build", build)
    assert "still building" in staging.prepare_staging("target_dp_meta", True)
    assert staging.initial_impl() == ("python", True)
    build.released.set()
    assert csrc.wait_loaded(staging.KERNEL, 10)
    build.timer.cancel()
    assert staging._impl == "cuda" and staging.initial_impl() == ("cuda", False)
    assert build.threads == ["hostsync-load-h2d_stage"]


def test_a_stager_made_before_prepare_starts_one_load_without_waiting(staging_auto, monkeypatch):
    build = BlockingBuild()
    monkeypatch.setattr(csrc, "_build", build)
    t0 = time.perf_counter()
    assert staging.initial_impl() == ("python", True)
    assert staging.initial_impl() == ("python", True)  # a second stager: no second load
    assert time.perf_counter() - t0 < 5 and not csrc.loaded(staging.KERNEL)
    assert "still building" in staging.prepare_staging("target_dp_meta", True)  # waits on the same build
    build.released.set()
    assert csrc.wait_loaded(staging.KERNEL, 10)
    build.timer.cancel()
    assert build.threads == ["hostsync-load-h2d_stage"] and staging.initial_impl() == ("cuda", False)


def test_a_stager_made_after_a_failed_load_stays_on_python(staging_auto, monkeypatch):
    build = BlockingBuild(fail=True)
    monkeypatch.setattr(csrc, "_build", build)
    assert "still building" in staging.prepare_staging("target_dp_meta", True)
    build.released.set()
    assert csrc.wait_loaded(staging.KERNEL, 10)
    build.timer.cancel()
    assert staging.initial_impl() == ("python", False)


def test_a_switch_that_raises_leaves_the_fallback(staging_auto, monkeypatch, caplog):
    monkeypatch.setattr(csrc, "_build", lambda name, verbose=False: object())
    failed = []

    def broken():
        raise RuntimeError("switch broke")

    with caplog.at_level("WARNING", logger="sglang.srt.plugins.hostsync"):
        note = csrc.load_in_background("staging", staging.KERNEL, on_loaded=broken, on_failed=lambda: failed.append(1),
                                       wait=10)
    assert failed == [1] and note == "fallback: switch broke" and "csrc/h2d_stage.cu unavailable (switch broke)" in caplog.text
