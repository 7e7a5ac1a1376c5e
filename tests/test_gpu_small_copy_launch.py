"""small_copy_launch on a CUDA device: SGLang's real ``try_small_copy`` and the slot's hook give the
same result and bit-identical copies on random runner copies and on the edge cases its checks sort
out, each operand list three times (new contents, then new addresses); the relaunches do not enter
Triton's JIT dispatch and make no host sync. Host time per call: benchmarks/bench_small_copy.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers import small_copy as drv
from sglang_hostsync_plugin.slots import small_copy_launch as slc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def fresh(monkeypatch, jit_calls):
    monkeypatch.setattr(slc, "_state", slc.State(plans={}))
    return jit_calls


def _bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t


def test_bit_identical_to_sglangs_try_small_copy(fresh):
    from sglang.kernels.ops.memory.small_copy import try_small_copy

    rng = random.Random(11)
    kinds, n = set(), 0
    for kind, dsts, srcs in drv.cases(rng, 400, "cuda"):
        for attempt in range(3):
            if attempt == 2:  # the same signature at new addresses (when the alignment holds)
                srcs = [s.clone() if not (s.is_neg() or s.requires_grad) else s for s in srcs]
            want = drv.run_on_copies(try_small_copy, dsts, srcs)
            got = drv.run_on_copies(lambda d, s: slc.small_copy_hook(try_small_copy, d, s), dsts, srcs)
            torch.cuda.synchronize()
            assert got[0] is want[0], (kind, attempt, got[0], want[0])
            assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got[1], want[1])), (kind, attempt)
            drv.bump(srcs)
            kinds.add((kind, want[0]))
            n += 1
    assert {("runner", True), ("alias", True), ("overlap_src", False), ("big", False), ("empty", True),
            ("col_stride", True), ("mixed_device", False)} <= kinds, kinds
    assert slc._state.hits > n / 3, (slc._state.hits, n)
    print(f"small_copy_launch: {n} calls bit-identical to try_small_copy ({len(kinds)} kinds), "
          f"{slc._state.captures} captures, {slc._state.hits} without SGLang's function")


def test_a_relaunch_skips_the_jit_and_makes_no_host_sync(fresh):
    from sglang.kernels.ops.memory.small_copy import try_small_copy

    gen = torch.Generator().manual_seed(5)
    dsts, srcs = drv.runner_case(random.Random(5), 4, 4, "cuda", gen)
    assert slc.small_copy_hook(try_small_copy, dsts, srcs) is True  # captured
    torch.cuda.synchronize()
    before = len(fresh)
    drv.bump(srcs)
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert slc.small_copy_hook(try_small_copy, dsts, srcs) is True
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert len(fresh) == before, "the relaunch went through Triton's JIT dispatch"
    assert all(torch.equal(d, s.to(d.dtype)) for d, s in zip(dsts, srcs))
    assert slc._state.hits == 1
