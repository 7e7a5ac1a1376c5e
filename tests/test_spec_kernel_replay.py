"""spec_kernel_replay on the CPU: the result templates (nesting and None holes), the per-signature
record / replay / normal-path bookkeeping around SGLang's ``_record`` and plans (a fake plan here),
SGLang's kill switch, and the slot's targets, pins, inert rules and installation. Under
``TRITON_INTERPRET`` SGLang records no launch, so through the real ``_record`` every wrapper must
keep returning SGLang's own results. The real replay, bit for bit: test_gpu_spec_kernel_replay.py."""

import random

import pytest
import torch
from sglang.kernels.ops.diffusion.common import fast_launch

from hostsync_drivers import spec_wrappers as sw
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import spec_kernel_replay as skr


@pytest.mark.parametrize("out", [
    torch.ones(2), (torch.ones(2), torch.zeros(3)), (torch.ones(1), None, (torch.ones(2), None), (torch.ones(3),)),
    None, (), (None, None),
])
def test_templates_rebuild_the_nesting_and_the_holes(out):
    leaves = []
    template = skr._flatten(out, leaves)
    assert all(isinstance(t, torch.Tensor) for t in leaves)
    rebuilt = skr._build(template, tuple(leaves))
    assert sw.same(out, rebuilt)
    if isinstance(out, torch.Tensor):
        assert rebuilt is out


@pytest.mark.parametrize("out", [[torch.ones(1)], (torch.ones(1), 3), {"a": torch.ones(1)}, 1.5])
def test_results_it_does_not_know_are_raw(out):
    assert skr._flatten(out, []) is skr._RAW


class FakePlan:
    """SGLang's _Plan as the wrapper uses it: ``device`` and ``replay(inputs)`` -> flat tuple."""

    def __init__(self, fn, device=0):
        self.fn, self.device, self.replays = fn, device, 0

    def replay(self, inputs):
        self.replays += 1
        return self.fn(*inputs)


@pytest.fixture
def fake_record(monkeypatch):
    """SGLang's _record with a FakePlan: the wrapper ran, its flat result replays from the inputs."""
    recorded = []

    def record(fn, args, kwargs, inputs):
        out = fn(*args, **kwargs)
        recorded.append(out)
        if not all(isinstance(t, torch.Tensor) for t in out):
            return out, fast_launch._NORMAL
        return out, FakePlan(lambda *ins, f=replay_fn: tuple(t.clone() for t in f(*ins)))

    replay_fn = None

    def use(fn):
        nonlocal replay_fn
        replay_fn = fn

    monkeypatch.setattr(fast_launch, "_record", record)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    return recorded, use


def test_records_once_per_signature_then_replays_into_the_same_structure(fake_record):
    recorded, use = fake_record
    calls = []

    def upstream(a, b, with_extra):
        calls.append(a.shape)
        return a + b, (a * b, None), (a - b if with_extra else None)

    use(lambda a, b: (a + b, a * b, a - b))  # the flat launches of the extra variant
    r = skr.Replay(upstream)
    a, b = torch.arange(4.0), torch.ones(4)
    first = r(a, b, True)
    assert len(calls) == 1 and len(recorded) == 1 and len(r.plans) == 1
    a2 = torch.arange(4.0) * 3  # new contents, the same signature
    second = r(a2, b, True)
    assert len(calls) == 1 and sw.same(second, upstream(a2, b, True)) and second[1][1] is None
    assert sw.same(first, upstream(a, b, True))
    r(torch.arange(5.0), torch.ones(5), True)  # a new shape: recorded again
    assert len(r.plans) == 2
    use(lambda a, b: (a + b, a * b))
    out = r(a, b, False)  # a scalar is part of the key: the None-hole variant records on its own
    assert len(r.plans) == 3 and out[2] is None and r(a2, b, False)[2] is None


def test_what_keeps_sglangs_path(fake_record, monkeypatch):
    recorded, use = fake_record
    calls = []

    def upstream(a, obj=None):
        calls.append(1)
        return [a + 1]  # a list: not a result SGLang's plan rebuilds

    r = skr.Replay(upstream)
    a = torch.zeros(2)
    for _ in range(3):
        assert sw.same(r(a), [a + 1])
    assert len(calls) == 3 and r.plans[next(iter(r.plans))][0] is fast_launch._NORMAL
    assert len(recorded) == 1  # recorded once, then the normal path
    r(a, obj=object())  # an operand SGLang cannot key: never recorded
    assert len(recorded) == 1 and len(calls) == 4
    monkeypatch.setattr(fast_launch, "_ENABLED", False)  # SGLANG_DIFFUSION_TRITON_FAST_LAUNCH=0
    r2 = skr.Replay(lambda a: (a + 1,))
    r2(a)
    assert r2.plans == {} and len(recorded) == 1


def test_another_device_and_the_plan_cap(fake_record, monkeypatch):
    recorded, use = fake_record
    use(lambda a: (a + 1,))
    calls = []

    def upstream(a):
        calls.append(1)
        return (a + 1,)

    r = skr.Replay(upstream)
    a = torch.zeros(2)
    r(a)
    r(a)
    assert len(calls) == 1
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    r(a)
    assert len(calls) == 2  # recorded on device 0: another current device runs SGLang's wrapper
    monkeypatch.setattr(skr, "MAX_PLANS", 1)
    r(torch.zeros(3))
    assert len(r.plans) == 1 and len(calls) == 3


def test_a_recording_that_breaks_never_reaches_the_serving_loop(monkeypatch):
    """SGLang's recording failing after the wrapper ran returns the wrapper's result and keeps the
    signature on SGLang's path for good; the wrapper's own error still propagates, as in stock."""
    def broken(fn, args, kwargs, inputs):
        fn(*args, **kwargs)
        raise RuntimeError("recording API moved")

    monkeypatch.setattr(fast_launch, "_record", broken)
    calls = []
    r = skr.Replay(lambda a: calls.append(1) or (a + 1, None))
    a = torch.zeros(2)
    out = r(a)
    assert torch.equal(out[0], torch.ones(2)) and out[1] is None and len(calls) == 1
    (plan, _), = r.plans.values()
    assert plan is fast_launch._NORMAL
    r(a)
    assert len(calls) == 2  # SGLang's wrapper, not the broken recording

    def failing(a):
        raise ValueError("bad operand")

    with pytest.raises(ValueError, match="bad operand"):
        skr.Replay(failing)(a)


def test_another_thread_recording_stores_nothing(monkeypatch):
    monkeypatch.setattr(fast_launch, "_record", lambda fn, args, kwargs, inputs: (fn(*args, **kwargs), None))
    r = skr.Replay(lambda a: (a + 1, None))
    out = r(torch.zeros(2))
    assert r.plans == {} and out[1] is None and torch.equal(out[0], torch.ones(2))


def test_every_wrapper_returns_sglangs_results_through_the_real_record():
    """The interpreter records no launch: each signature keeps SGLang's path, results unchanged."""
    rng = random.Random(5)
    for name, variants in sw.VARIANTS:
        fn = sw.FUNCTIONS[name]
        r = skr.Replay(sw.replayed(name))
        for variant in variants:
            for bs in (0, 1, 3):
                for _ in range(2):
                    args, kwargs = sw.case(name, rng, bs, variant, device="cpu")
                    a2, k2 = sw.clone(args), sw.clone(kwargs)
                    assert sw.same(r(*args, **kwargs), fn(*a2, **k2)), (name, variant, bs)
                    assert sw.same((args, kwargs), (a2, k2)), (name, variant, bs)  # in-place outputs too
        assert r.plans and all(plan is fast_launch._NORMAL for plan, _ in r.plans.values())


def test_targets_are_the_wrappers_and_their_pins():
    assert check_slot(skr.SLOT) is None
    assert {t.path.rsplit(".", 1)[1] for t in skr.SLOT.targets} == set(sw.FUNCTIONS)
    hooks = {t.path.rsplit(".", 1)[1]: t.hook for t in skr.SLOT.targets if not t.observer}
    assert hooks.pop("prepare_verify_commit_outputs") is skr.verify_commit_hook
    assert len(hooks) == len(skr.SLOT.targets) - 1 and set(hooks.values()) == {skr.replay_hook}
    assert skr.replay_of(sw.FUNCTIONS["prepare_draft_extend_inputs"]) is skr.replay_of(sw.FUNCTIONS["prepare_draft_extend_inputs"])
    assert not skr.SLOT.default and "eagle_host" in skr.SLOT.presets
    assert "turns SGLang's replay_launches off" in skr.SLOT.env_warning({"SGLANG_DIFFUSION_TRITON_FAST_LAUNCH": "0"})


def test_the_verify_commit_copy_passes_sglangs_recording_guard():
    """SGLang's guard refuses prepare_verify_commit_outputs for its torch.promote_types (an aten op);
    the slot's copy allocates only, for every result structure, and returns the same results."""
    from sglang.kernels.ops.speculative import eagle

    edited = skr.VERIFY_COMMIT_EDIT(eagle.prepare_verify_commit_outputs)
    assert edited is not eagle.prepare_verify_commit_outputs and edited is skr.VERIFY_COMMIT_EDIT(eagle.prepare_verify_commit_outputs)
    rng = random.Random(11)
    for variant in dict(sw.VARIANTS)["prepare_verify_commit_outputs"]:
        for bs in (0, 1, 4):
            args, kwargs = sw.case("prepare_verify_commit_outputs", rng, bs, variant, device="cpu")
            a2, k2 = sw.clone(args), sw.clone(kwargs)
            if bs == 0:  # nothing launched: the guard sees the wrapper's own ops only
                for fn, want in ((eagle.prepare_verify_commit_outputs, "aten.promote_types.default"), (edited, None)):
                    guard = fast_launch._LaunchOnly()
                    with guard:
                        fn(*args, **kwargs)
                    assert guard.violation == want, (variant, fn)
            assert sw.same(edited(*args, **kwargs), eagle.prepare_verify_commit_outputs(*a2, **k2)), (variant, bs)
    from sglang_hostsync_plugin.slots import triton_replay_launch as trl

    for a in trl._INTEGERS + (torch.float32, torch.bfloat16):
        for b in trl._INTEGERS + (torch.float16,):
            assert trl.promote(a, b) == torch.promote_types(a, b)


def test_inert_rules():
    for algo in ("EAGLE", "EAGLE3", "STANDALONE"):
        assert skr.SLOT.inert(ServingFacts(algo, topk=1)) is None
    assert "NGRAM" in skr.SLOT.inert(ServingFacts("NGRAM"))
    assert "DFLASH" in skr.SLOT.inert(ServingFacts("DFLASH"))
    assert "unset" in skr.SLOT.inert(ServingFacts())


def test_installs_beside_the_audits_observer():
    from helpers import install_eagle_host_with_audit

    paths = [path for path, _ in install_eagle_host_with_audit(skr.NAME)]
    for t in skr.SLOT.targets:
        assert paths.count(t.path) == 1, t.path  # one hook per function: the audit's timer shares it


def test_installed_where_sglangs_callers_look_the_wrappers_up():
    """Through the real HookRegistry: the names the EAGLE v2 callers bind (module globals rebound
    at import, module attributes read at call time) reach the slot's replay, results unchanged;
    eagle_utils' verify prep caches its import lazily, so it still resolves the hooked one."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import inspect, json, random
from hostsync_drivers import spec_wrappers as sw
from sglang.kernels.ops.speculative import cache_locs, eagle
from sglang.srt.managers import overlap_utils
from sglang.srt.speculative import eagle_utils, eagle_worker_common
from sglang_hostsync_plugin.slots import spec_kernel_replay as skr
callers = {"gather_spec_extras": overlap_utils.gather_spec_extras,
           "assign_draft_cache_locs_contiguous_func": eagle_worker_common.assign_draft_cache_locs_contiguous_func,
           "prepare_draft_extend_layout": eagle_worker_common.prepare_draft_extend_layout,
           "assign_extend_cache_locs_uniform_func": cache_locs.assign_extend_cache_locs_uniform_func,
           "prepare_draft_extend_inputs": eagle.prepare_draft_extend_inputs,
           "prepare_verify_commit_outputs": eagle_worker_common.prepare_verify_commit_outputs}
rng, same = random.Random(3), {}
for name, fn in callers.items():
    args, kwargs = sw.case(name, rng, 3, "", device="cpu")
    a2, k2 = sw.clone(args), sw.clone(kwargs)
    got = fn(*args, **kwargs)
    # SGLang's own function (for the verify commit the replay holds the slot's edited copy)
    upstream = {r.fn.__name__: r.fn for r in skr._replays.values()}.get(name)
    if name == "prepare_verify_commit_outputs":
        upstream = upstream and inspect.unwrap(eagle.prepare_verify_commit_outputs)
    same[name] = upstream is not None and sw.same(got, upstream(*a2, **k2)) and sw.same((args, kwargs), (a2, k2))
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["spec_kernel_replay"].status.value, "same": same,
      "replayed": sorted(r.fn.__name__ for r in skr._replays.values() if r.plans),
      "verify_deps_lazy": eagle_utils._PREPARE_FOR_VERIFY_DEPS is None}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine", TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert all(res["same"].values()) and res["verify_deps_lazy"], res
    assert res["replayed"] == sorted(sw.FUNCTIONS), res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout
