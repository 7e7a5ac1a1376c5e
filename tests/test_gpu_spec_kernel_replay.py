"""spec_kernel_replay on a CUDA device: each SGLang wrapper it hooks, through the slot's ``Replay``,
records on the first call of an operand signature (SGLang's ``_record``: a real plan, not the
normal path) and, on later calls with new contents of that signature, relaunches without Triton's
JIT dispatch and returns, and writes in place, exactly what SGLang's wrapper does, with the same
nesting and None holes. Cases: every result structure the EAGLE v2 step asks for, bs 1, 5 and 8,
and the empty batch (no launch: SGLang's path); prepare_verify_commit_outputs through the slot's
edited copy, compared with SGLang's own. Host time per call: benchmarks/bench_replay_launch.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch
from sglang.kernels.ops.diffusion.common import fast_launch

from hostsync_drivers import spec_wrappers as sw
from sglang_hostsync_plugin.slots import spec_kernel_replay as skr

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("name,variant", [(n, v) for n, vs in sw.VARIANTS for v in vs])
def test_replays_return_and_write_what_sglangs_wrapper_does(name, variant, jit_calls):
    fn = sw.FUNCTIONS[name]
    rng = random.Random(f"{name}/{variant}")
    for bs in (1, 5, 8, 0):
        r = skr.Replay(sw.replayed(name))
        changed = 0
        for i in range(6):
            args, kwargs = sw.case(name, rng, bs, variant)
            a2, k2 = sw.clone(args), sw.clone(kwargs)
            want = fn(*a2, **k2)
            before = len(jit_calls)
            got = r(*args, **kwargs)
            torch.cuda.synchronize()
            assert sw.same(got, want), (name, variant, bs, i)
            assert sw.same((args, kwargs), (a2, k2)), (name, variant, bs, i)  # what it writes in place
            (plan, _), = r.plans.values()
            if bs == 0:
                assert plan is fast_launch._NORMAL  # nothing launched: SGLang's path
                continue
            assert plan is not fast_launch._NORMAL, f"{name}/{variant}: SGLang's recording refused it"
            if i:
                assert len(jit_calls) == before, f"{name}/{variant} bs {bs}: call {i} went through Triton's JIT"
                changed += not sw.same(want, prev)
            prev = want
        assert bs == 0 or name.startswith("assign_draft") or changed, "the cases never changed the result"


def test_the_kill_switch_keeps_the_jit(jit_calls, monkeypatch):
    monkeypatch.setattr(fast_launch, "_ENABLED", False)
    fn = sw.FUNCTIONS["prepare_draft_extend_inputs"]
    r = skr.Replay(fn)
    for _ in range(3):
        args, _ = sw.case("prepare_draft_extend_inputs", random.Random(1), 4)
        before = len(jit_calls)
        r(*args)
        assert len(jit_calls) == before + 1
    assert r.plans == {}
