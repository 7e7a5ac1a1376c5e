"""Slot ``flashinfer_device_plan`` on the CPU, through the certified plan's miniature server
(``World``: SGLang's real FutureMap resolve, ``update_single_wrapper`` / ``call_begin_forward`` /
``fast_prefill_plan`` and ``_build_draft_indptr_host``, a stand-in FlashInfer planner that writes the port's
plan into the pinned buffer and copies it into the int workspace as FlashInfer's planner does).

- The first decode step at a batch size is stock (a probe of its sites); once a probe ran every site through
  the CUDA-graph planners, every decode step of that size with a window skips the read (no D2H, no
  synchronize) and FlashInfer's planner does not run in it; the bytes the device plan (Triton, interpreted)
  writes into each wrapper's int workspace are the plan stock SGLang makes at the exact lengths, and
  ``plan_info`` stays the capture's.
- A wrapper the device plan does not cover is planned by FlashInfer from the exact lengths (read back,
  counted) and its batch size keeps stock's read from then on; so does a batch size whose probe saw a site
  planned by FlashInfer's ``plan()`` (an eager step).
- A window miss turns the slot off; the hooks go in through SGLang's hook registry.

The GPU side: tests/test_gpu_flashinfer_device_plan.py.
"""

import random
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from sglang_hostsync_plugin import flashinfer_split as fs, registry
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slots import flashinfer_certified_plan as cert, flashinfer_device_plan as dp
from test_flashinfer_certified_plan import (HD, HKV, HQ, W, FakePlanner, FakeWrapper, World, _accept, _exact_plans,
                                            _facts, _sync_count)


@pytest.fixture(autouse=True)
def _fresh_engine(monkeypatch):
    monkeypatch.setattr(dp, "ENGINE", dp.Engine())
    dp.ENGINE.device = fs.H100
    monkeypatch.setenv("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN", "1")
    monkeypatch.setenv("SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR", "1")


def test_an_opt_in_catalogue_slot_that_requires_the_plan_guard_and_hooks_the_certified_plans_targets():
    assert registry.catalogue()[dp.NAME] is dp.SLOT
    s = dp.SLOT
    assert not s.default and s.presets == ()
    assert s.requires == ("flashinfer_plan_guard",) and check_slot(s) is None
    assert [(t.path, t.params, t.source_sha) for t in s.targets[:3]] == \
        [(t.path, t.params, t.source_sha) for t in cert.SLOT.targets]
    assert [t.hook for t in s.targets] == [dp.next_batch_hook, dp.prefill_update_hook, dp.draft_template_hook,
                                           dp.verify_input_hook]
    assert s.targets[3].path.endswith("eagle_worker_common.build_eagle_verify_input")


@pytest.mark.parametrize("kw, want", [
    ({}, None),
    ({"topk": 4}, None),  # the verify's host plan is flashinfer_tree_verify_plan's there
    ({"topk": 4, "attention_backends": ("triton", "triton")}, "not flashinfer"),
    ({"speculative_algorithm": "EAGLE3", "topk": None}, None),  # decided at the refinement
    ({"speculative_algorithm": "NGRAM"}, "--speculative-algorithm is NGRAM"),
    ({"disable_cuda_graph": True}, "--disable-cuda-graph"),
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"tp_size": 2, "topk": 4}, "--tp-size is 2"),
    ({"dp_attention": True}, "attention DP"),
    ({"speculative_num_steps": 1}, "--speculative-num-steps is 1"),
    ({"draft_window_size": 64, "topk": 4}, "draft-window-size"),
])
def test_inert_rules(kw, want):
    reason = dp.inert(_facts(**kw))
    assert (reason is None) if want is None else (want in reason), reason


def test_the_window_is_the_most_a_verify_commits():
    """The tree's depth plus the bonus token: at topk > 1 fewer than the draft tokens, so the window stays
    within the KV SGLang reserved (the certified plan's, at topk 1, is the draft tokens)."""
    args = SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=8, speculative_eagle_topk=4)
    assert dp.Engine.max_accept(args) == 4 and cert.Engine.max_accept(args) == 8
    assert cert.request_window(100, 104, "decode", dp.Engine.max_accept(args)) == (101, 104)
    # SGLang's own bound on the accepted run: the verify input's tree depth
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    assert EagleVerifyInput.max_tree_depth.fget(SimpleNamespace(spec_steps=3)) == dp.Engine.max_accept(args)
    # No step count: no window at all (a width of 1 would undershoot every pending verify)
    none = SimpleNamespace(speculative_num_steps=None, speculative_num_draft_tokens=8)
    assert dp.Engine.max_accept(none) == 0
    assert "no speculative steps" in dp.ENGINE.runtime_reason(SimpleNamespace(server_args=none), None)


class CopyingPlanner(FakePlanner):
    """FlashInfer's planner as the port says it behaves, with its last step: the pinned buffer copied into
    the device int workspace (``args[1]``), where the kernels read the plan."""

    def plan(self, *args):
        info = super().plan(*args)
        args[1].copy_(args[2])
        return info


class DeviceWorld(World):
    """``World`` with each wrapper's int workspace, captured once (FlashInfer's ``plan()`` at capture sets
    ``_plan_info``), planning through ``CopyingPlanner``; the slot's hooks."""

    def __init__(self, rows, committed, tamper_capture=None, topk=1):
        super().__init__(rows, committed, planner=CopyingPlanner, slot=dp, topk=topk)
        self.tamper_capture = tamper_capture

    def _wrapper(self, name, bs, planner_kind):
        fresh = (name, bs) not in self.wrappers
        w = super()._wrapper(name, bs, planner_kind)
        if fresh:
            w._int_workspace_buffer = torch.zeros(1 << 16, dtype=torch.uint8)
            width = W if name in ("verify", "draft_extend") else 1
            rows = self.rows_of(name, bs)
            if width == 1:  # a tensor-core decode wrapper's, made at its construction under CUDA graphs
                w._qo_indptr_buf = torch.arange(rows + 1, dtype=torch.int32)
            call = fs.PlannerCall(tuple(range(0, (rows + 1) * width, width)), tuple(range(0, (rows + 1) * 9, 9)),
                                  rows * width, rows, HQ, HKV, 1, True, HD, HD, False, -1, -1, False, 0, 0)
            args = list(_args_of(call))
            args[1], args[2] = w._int_workspace_buffer, w._pin_memory_int_workspace_buffer
            w._plan_info = w._cached_module.plan(*args)
            if self.tamper_capture:
                self.tamper_capture(name, w)
            w._cached_module.calls.clear()
        return w

    def planner_calls(self):
        return sum(len(_module(w).calls) for w in self.wrappers.values())


def _module(w):
    return w._cached_module.module if isinstance(w._cached_module, dp.DevicePlanner) else w._cached_module


SITES = ("draft0", "draft1", "verify", "draft_extend")


@pytest.mark.parametrize("topk", [1, 4])  # at topk 4 the draft decode plans four rows per request
def test_every_step_with_a_window_after_the_first_at_its_size_skips_the_read_and_plans_as_stock(topk):
    rng = random.Random(5)
    world = DeviceWorld(rows=[3, 7, 9], committed=[1000, 127, 40000], topk=topk)
    pending = False
    for n in range(25):
        for w in world.wrappers.values():
            w._int_workspace_buffer.fill_(0xA5)  # what a skipped step's plan is must come from this step
        captured = {k: list(w._plan_info) for k, w in world.wrappers.items()}
        calls = world.planner_calls()
        batch, _ = world.step(hooked=True, pending=pending)
        exact = world.device_lens()
        step = dp.ENGINE.last_step
        if n == 0:  # the first step at this batch size: stock's read, its sites probed
            assert not step.skipped and dict(dp.ENGINE.stats.stock) == {"first at this size": 1}
            assert _sync_count(world) == 1 and batch.seq_lens_cpu.tolist() == exact
            assert world.planner_calls() == calls + len(SITES)  # FlashInfer's planner, at the exact lengths
            _accept(world, [rng.randint(1, W) for _ in world.rows])
            pending = True
            continue
        assert step.skipped, dp.ENGINE.stats.stock
        assert _sync_count(world) == 0 and batch.seq_lens_cpu is None and batch.seq_lens_sum is None
        assert world.planner_calls() == calls  # FlashInfer's planner did not run
        bs = world.bucket()
        want = _exact_plans(world, exact)  # stock SGLang's plans at the exact lengths, site by site
        for site in SITES:
            w = world.wrappers[(site, bs)]
            assert captured.get((site, bs), w._plan_info) == list(w._plan_info)  # the capture's plan_info
            (model,) = want[site]
            rows = world.rows_of(site, bs)
            assert model.total_num_rows // (W if site in ("verify", "draft_extend") else 1) == rows
            assert fs.compare(model, w._plan_info, w._int_workspace_buffer, rows) == [], (n, site, exact)
        # The verify just launched accepts 1..W; the host processes the previous one (its lengths catch up).
        if pending:
            for r, e in zip(world.reqs, exact):
                r.kv.kv_committed_len = e
                r.kv.kv_allocated_len = e + 64
        _accept(world, [rng.randint(1, W) for _ in world.rows])
        pending = True
    stats = dp.ENGINE.stats
    assert stats.skipped == 24 and stats.decode_steps == 25 and stats.device_plans == 24 * len(SITES)
    assert dict(stats.stock) == {"first at this size": 1}
    assert stats.rescues == 0 and stats.window_misses == 0 and stats.window_checks > 0


def test_a_wrapper_the_device_plan_does_not_cover_plans_from_the_exact_lengths_then_keeps_stocks_read():
    def no_split(name, w):  # a capture without split KV (SGLang's disable_cuda_graph_kv_split)
        if name == "verify":
            w._plan_info = list(w._plan_info)
            w._plan_info[fs.PLAN_INFO_FIELDS.index("split_kv")] = 0

    world = DeviceWorld(rows=[2], committed=[3000], tamper_capture=no_split)
    world.step(hooked=True, pending=False)  # the probe: stock's read, every site through a CUDA-graph plan
    assert not dp.ENGINE.last_step.skipped and dp.ENGINE.stats.stock["first at this size"] == 1
    assert dp.ENGINE.stats.rescues == 0
    no_split("verify", world.wrappers[("verify", 1)])  # the capture's plan_info (the stand-in planner replanned it)
    before = len(_module(world.wrappers[("verify", 1)]).calls)
    world.step(hooked=True, pending=False)
    assert dp.ENGINE.last_step.skipped and dp.ENGINE.stats.rescues == 1
    (call,) = _module(world.wrappers[("verify", 1)]).calls[before:]  # FlashInfer's planner, at the exact lengths
    assert call.kv_lens == (3000 + W,)
    _accept(world, [2])
    world.step(hooked=True, pending=True)
    assert not dp.ENGINE.last_step.skipped and dp.ENGINE.stats.stock["not covered"] == 1
    assert _sync_count(world) == 1


def test_a_window_miss_turns_the_slot_off():
    world = DeviceWorld(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)  # the probe at this batch size: stock's read, the window holds
    assert not dp.ENGINE.last_step.skipped and not dp.ENGINE.disabled
    world.fm.new_seq_lens_buf[4] = 503  # the device is ahead of what the host can explain
    world.step(hooked=True, pending=False)  # skipped: its window copy is read at the next decision
    assert dp.ENGINE.last_step.skipped and _sync_count(world) == 0
    world.step(hooked=True, pending=False)
    assert dp.ENGINE.disabled and "window miss" in dp.ENGINE.disabled
    assert not dp.ENGINE.last_step.skipped and dp.ENGINE.stats.stock["off"] == 1 and _sync_count(world) == 1


@pytest.mark.parametrize("eager_site", ["draft_extend", "verify"])
def test_a_batch_size_whose_sites_run_eagerly_never_skips_the_read(eager_site):
    """A site planned by FlashInfer's plan() (an eager step, past the captured batch sizes): SGLang's eager
    draft extend reads the host lengths, so that size's first step is stock and so is every later one."""
    def eager(name, w):  # not a CUDA-graph fast plan: what an eager batch's wrapper plans through
        if name == eager_site:
            w.begin_forward = partial(_flashinfer_plan, w)

    rng = random.Random(3)
    world = DeviceWorld(rows=[1, 5], committed=[800, 2000], tamper_capture=eager)
    pending = False
    for n in range(6):
        batch, _ = world.step(hooked=True, pending=pending)
        assert not dp.ENGINE.last_step.skipped, n
        assert _sync_count(world) == 1 and batch.seq_lens_cpu.tolist() == world.device_lens()
        _accept(world, [rng.randint(1, W) for _ in world.rows])
        for r, e in zip(world.reqs, world.device_lens()):  # the host catches up: no step pending
            r.kv.kv_committed_len = e
            r.kv.kv_allocated_len = e + 64
    stats = dp.ENGINE.stats
    assert stats.skipped == 0 and stats.device_plans == 0 and stats.rescues == 0
    assert dict(stats.stock) == {"first at this size": 1, "not covered": 5}
    assert dp.ENGINE.stock_sizes == {2} and dp.ENGINE.covered_sizes == set()


def test_a_probe_that_did_not_see_every_site_probes_again():
    """A stock step at a new batch size whose sites did not all run (no draft extend, say) proves nothing:
    the next step at that size is a probe again, and the one after it skips."""
    world = DeviceWorld(rows=[6], committed=[700])
    dp.ENGINE.decide(world.sched, world.batch())  # a decision whose step ran no site
    assert not dp.ENGINE.last_step.skipped and dp.ENGINE.covered_sizes == set()
    world.step(hooked=True, pending=False)
    assert not dp.ENGINE.last_step.skipped and dp.ENGINE.stats.stock["first at this size"] == 2
    world.step(hooked=True, pending=False)
    assert dp.ENGINE.last_step.skipped and _sync_count(world) == 0 and dp.ENGINE.covered_sizes == {1}


def _flashinfer_plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, **_):
    """FlashInfer's own ``plan()`` as far as the planner goes: it reads the indptrs it is given back itself."""
    qo, kv = qo_indptr.cpu().to(torch.int32), kv_indptr.cpu().to(torch.int32)
    bs = len(qo) - 1
    self._plan_info = self._cached_module.plan(
        self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer, qo, kv,
        kv[1:] - kv[:-1], int(qo[-1]), bs, num_qo_heads, num_kv_heads, page_size, self.is_cuda_graph_enabled, head_dim,
        head_dim, False, -1, -1, False, 0, 0)


def test_the_hooks_go_in_through_sglangs_hook_registry():
    from helpers import out, run_python

    proc = run_python("""
    import json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()
    runtime.startup_check(rt)
    import sglang.srt.layers.attention.flashinfer_backend as fb
    from sglang.srt.managers.scheduler import Scheduler
    from sglang_hostsync_plugin.slots import flashinfer_device_plan as dp
    import sglang.srt.speculative.eagle_worker_common as ewc
    hooked = (fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper,
              fb.FlashInferMultiStepDraftBackend.common_template, Scheduler.get_next_batch_to_run,
              ewc.build_eagle_verify_input)
    print("RESULT" + json.dumps({
        "status": rt.state.statuses["flashinfer_device_plan"].status.value,
        "hooked": [hasattr(f, "__wrapped__") for f in hooked],
    }))
    """, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
        SGLANG_HOSTSYNC_SLOTS="default,flashinfer_verify_host_plan,flashinfer_draft_host_indptr,"
                              "flashinfer_device_plan")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"status": "applied", "hooked": [True, True, True, True]}, res


def test_the_device_plan_reads_each_planners_arguments_where_flashinfer_passes_them():
    """The argument positions: the fa2 prefill planner's 20 (batch size, heads, page size; a GQA of 32 and a
    width of 8 make two query tiles, so the head count matters) and the CUDA-core decode planner's 15."""
    from test_flashinfer_device_plan import STALE, decode_case, packed, prefill_layout, stand_in_wrapper

    rng = random.Random(9)
    for _ in range(6):
        bs, width, hq, hkv = rng.choice([1, 3, 8]), 8, 32, 1
        lens = [rng.randrange(width, 30000) for _ in range(bs)]
        call = fs.PlannerCall(tuple(range(0, (bs + 1) * width, width)), tuple(fs.page_indptr(lens, 1)), bs * width, bs,
                              hq, hkv, 1, True, HD, HD, False, -1, -1, False, 0, 0)
        model = fs.plan_call(call)
        assert model.cta_tile_q < width * hq // hkv  # more than one query tile per request
        info, size = prefill_layout(model, bs, bs * width)
        w = stand_in_wrapper(info, size, bs)
        w._qo_indptr_buf.copy_(torch.tensor(call.qo_indptr))
        w._paged_kv_indptr_buf.copy_(torch.tensor(call.kv_indptr))
        hi = torch.tensor([n + 5 for n in lens], dtype=torch.int32)  # host lengths the plan must not read
        args = (None, w._int_workspace_buffer, None, torch.tensor(call.qo_indptr), hi, hi, bs * width, bs, hq, hkv, 1,
                True, HD, HD, False, -1, -1, False, 0, 0)
        launch = dp.device_plan_for(w, args, fs.H100)
        hi.fill_(0)  # bound once: later calls read the device buffers only
        launch()
        assert fs.compare(model, w._plan_info, w._int_workspace_buffer, bs) == []

    kv = [rng.randrange(1, 30000) for _ in range(5)]
    model, _, _ = decode_case(kv, kv_heads=8, page_size=1, max_grid=264)
    padded = model.padded_batch_size
    offsets, size = packed({"request_indices_offset": 4 * padded, "kv_tile_indices_offset": 4 * padded,
                            "o_indptr_offset": 4 * (padded + 1), "kv_chunk_size_ptr_offset": 4,
                            "block_valid_mask_offset": padded})
    offsets.update(padded_batch_size=padded, split_kv=model.split_kv, v_offset=0, s_offset=0, enable_cuda_graph=1)
    from sglang_hostsync_plugin.flashinfer_device_plan import DECODE_PLAN_INFO_FIELDS

    w = stand_in_wrapper({}, size, 5)
    w._plan_info = [offsets[f] for f in DECODE_PLAN_INFO_FIELDS]
    w._paged_kv_indptr_buf.copy_(torch.tensor(fs.page_indptr(kv, 1)))
    args = (None, w._int_workspace_buffer, None, torch.zeros(6), 5, 8, 8, 1, True, -1, 0.0, HD, HD, None, None)
    dp.device_plan_for(w, args, fs.H100)()
    raw = w._int_workspace_buffer.view(torch.int32)
    at = offsets["request_indices_offset"] // 4
    assert tuple(raw[at: at + model.new_batch_size].tolist()) == model.request_indices
    at = offsets["o_indptr_offset"] // 4
    assert tuple(raw[at: at + 6].tolist()) == model.o_indptr
    assert int(raw[offsets["kv_chunk_size_ptr_offset"] // 4]) == model.kv_chunk_size_tokens
    assert w._int_workspace_buffer[offsets["block_valid_mask_offset"] + padded - 1] != STALE


def test_the_device_plans_launch_is_a_replayed_wrapper_of_tensors_and_ints(monkeypatch):
    """With ``triton_replay_launch`` on, a wrapper's device plan goes through SGLang's ``replay_launches`` (here
    a stand-in that records each call and runs the plain launch). Its arguments are tensors, ints and bools only
    (a signature ``replay_launches`` can key; anything else keeps Triton's dispatch every call), the same objects
    at every call of the wrapper, and the plan written is stock's."""
    from sglang_hostsync_plugin.slots import triton_replay_launch as trl
    from test_flashinfer_device_plan import prefill_layout, stand_in_wrapper

    seen, plain = [], dp.launch_plan.__wrapped__
    monkeypatch.setitem(trl._wrappers.replays, plain, lambda *a: seen.append(a) or plain(*a))
    monkeypatch.setattr(trl._wrappers, "on", True)
    bs, width, lens = 3, 8, [17, 9000, 250]
    call = fs.PlannerCall(tuple(range(0, (bs + 1) * width, width)), tuple(fs.page_indptr(lens, 1)), bs * width, bs,
                          32, 8, 1, True, HD, HD, False, -1, -1, False, 0, 0)
    model = fs.plan_call(call)
    info, size = prefill_layout(model, bs, bs * width)
    w = stand_in_wrapper(info, size, bs)
    w._qo_indptr_buf.copy_(torch.tensor(call.qo_indptr))
    w._paged_kv_indptr_buf.copy_(torch.tensor(call.kv_indptr))
    hi = torch.tensor([n + 5 for n in lens], dtype=torch.int32)
    args = (None, w._int_workspace_buffer, None, torch.tensor(call.qo_indptr), hi, hi, bs * width, bs, 32, 8, 1,
            True, HD, HD, False, -1, -1, False, 0, 0)
    launch = dp.device_plan_for(w, args, fs.H100)
    launch()
    launch()
    assert len(seen) == 2 and all(a is b for a, b in zip(*seen))
    assert all(isinstance(x, torch.Tensor) or type(x) in (int, bool) for x in seen[0]), [type(x) for x in seen[0]]
    assert fs.compare(model, w._plan_info, w._int_workspace_buffer, bs) == []


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_sglangs_replay_recording_maps_every_tensor_of_the_device_plans_launch(kind, monkeypatch):
    """SGLang's ``replay_launches`` relaunches a recorded launch only where each kernel tensor is exactly one of
    the wrapper's inputs (two inputs on one pointer, or a temporary, keep Triton's dispatch every call) and the
    wrapper runs no aten op but allocations and views. The arguments ``device_plan_for`` binds (``prefill_args``,
    ``decode_args``), run through SGLang's own signature, dispatch guard and plan builder (the kernel launch itself
    stood in, as the interpreter records nothing): a plan, every kernel tensor mapped to an input."""
    from types import SimpleNamespace

    from hostsync_drivers import device_plan
    from sglang.kernels.ops.diffusion.common import fast_launch as fl
    from sglang_hostsync_plugin import flashinfer_device_plan as kernels

    launched = []

    class Kernel:
        arg_names = kernels._plan_kernel.arg_names

        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append((grid, a, kw))

    monkeypatch.setattr(kernels, "_plan_kernel", Kernel())
    monkeypatch.setattr(fl, "driver", SimpleNamespace(active=SimpleNamespace(get_current_stream=None)))  # no GPU
    args, (info, _) = device_plan.prefill_launch(random.Random(5), 3, device="cpu")
    if kind == "decode":  # the same indptr and workspace, as a CUDA-core decode wrapper's
        args = kernels.decode_args(args[0], args[1], {**info, "v_offset": 0, "s_offset": 0}, batch_size=3,
                                   page_size=1)
    key, inputs = fl._signature(args, {})
    assert key is not None  # tensors, ints, bools and None only
    guard = fl._LaunchOnly()
    with guard:
        kernels.launch_plan(*args)
    assert guard.violation is None, guard.violation
    (grid, a, kw), = launched
    compiled = SimpleNamespace(src=SimpleNamespace(signature=[None] * (len(a) + len(kw))), run=None, function=None,
                               packed_metadata=None)
    plan = fl._plan(None, inputs, [(Kernel(), compiled, grid, a, kw, 0)])
    assert isinstance(plan, fl._Plan), "SGLang's recording would keep Triton's dispatch for this launch"
    (_, _, _, _, _, constants, slots), = plan.launches
    assert sorted(p for p, _, _ in slots) == [0, 1, 2, 3] and constants[4:] == (*a[4:], *kw.values())


@pytest.mark.parametrize("change, why", [
    (dict(window_left=100), "a sliding window"), (dict(fixed_split_size=256), "a fixed split size"),
    (dict(disable_split_kv=True), "split KV disabled"), (dict(num_colocated_ctas=4), "colocated CTAs"),
    (dict(uniform_q_len=4), "a uniform query length"), (dict(enable_cuda_graph=False), "no CUDA graph"),
    (dict(total_num_rows=12), "another row count than the capture's"),
])
def test_the_device_plan_refuses_what_it_does_not_make(change, why):
    from dataclasses import replace

    from test_flashinfer_device_plan import prefill_layout, stand_in_wrapper

    call = fs.PlannerCall((0, 4, 8), (0, 100, 300), 8, 2, HQ, HKV, 1, True, HD, HD, False, -1, -1, False, 0, 0)
    info, size = prefill_layout(fs.plan_call(call), 2, 8)
    w = stand_in_wrapper(info, size, 2)
    assert callable(dp.device_plan_for(w, _args_of(call), fs.H100))
    assert dp.device_plan_for(w, _args_of(replace(call, **change)), fs.H100) == why


@pytest.mark.parametrize("field, value, why", [
    ("split_kv", 0, "the capture planned without split KV"),
    ("padded_batch_size", 8, "a split budget above the captured padded size"),  # a capture with fewer SMs
])
def test_the_device_plan_refuses_a_capture_it_cannot_write_into(field, value, why):
    from test_flashinfer_device_plan import prefill_layout, stand_in_wrapper

    call = fs.PlannerCall((0, 4, 8), (0, 100, 300), 8, 2, HQ, HKV, 1, True, HD, HD, False, -1, -1, False, 0, 0)
    info, size = prefill_layout(fs.plan_call(call), 2, 8)
    w = stand_in_wrapper(info, size, 2)
    w._plan_info[fs.PLAN_INFO_FIELDS.index(field)] = value
    assert dp.device_plan_for(w, _args_of(call), fs.H100) == why
    assert "16 arguments" in dp.device_plan_for(w, (None,) * 16, fs.H100)
    decode = (None, None, None, None, 2, HQ, HQ, 1, True, 64, 0.0, HD, HD, None, None)
    assert dp.device_plan_for(w, decode, fs.H100) == "a sliding window"


def _args_of(call):
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return (None, None, None, t(call.qo_indptr), t(call.kv_indptr), t(call.kv_lens), *[getattr(call, f) for f in (
        "total_num_rows", "batch_size", "num_qo_heads", "num_kv_heads", "page_size", "enable_cuda_graph",
        "head_dim_qk", "head_dim_vo", "causal", "window_left", "fixed_split_size", "disable_split_kv",
        "num_colocated_ctas", "uniform_q_len")])


def _skipped_step(hi):
    step = cert.Step(SimpleNamespace(seq_lens=torch.tensor(hi)), len(hi), lo=list(hi), hi=list(hi), skipped=True)
    dp.ENGINE.step = step
    return step


def test_a_topk_verify_site_gets_the_upper_lengths():
    """At topk > 1 the verify is a site too (its kv_indices and mask padding are sized from the length sum,
    which SGLang's eagle_info adds to without a None check)."""
    from sglang.srt.speculative.spec_info import SpecInput, SpecInputType

    class TreeVerify(SpecInput):
        def __init__(self):
            super().__init__(SpecInputType.EAGLE_VERIFY)
            self.topk, self.num_tokens_per_req = 4, 8

    _skipped_step([100, 300])
    dp.ENGINE.copies.clear()
    got = {}

    def original(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, *rest, plan):
        got.update(lens=seq_lens_cpu.tolist(), total=seq_lens_sum)

    updater = SimpleNamespace(data_type=torch.bfloat16, attn_backend=SimpleNamespace(
        get_cuda_graph_seq_len_fill_value=lambda: 1))
    wrapper = SimpleNamespace(begin_forward=None, is_cuda_graph_enabled=True)
    dp.prefill_update_hook(original, updater, None, torch.zeros(4), None, None, None, [wrapper], False, None,
                           TreeVerify(), plan=None)
    assert got == {"lens": [100, 300, 1, 1], "total": 402}


def test_the_tree_mask_is_sized_from_the_upper_sum_in_a_skipped_step_only():
    seen = []

    def original(batch, *args, **kw):
        seen.append(batch.seq_lens_sum)
        return "verify input"

    kw = dict(target_worker=None, topk=4, num_steps=3, num_draft_tokens=8, tree_mask_mode=None, device="cpu")
    batch = SimpleNamespace(seq_lens_sum=None)
    assert dp.verify_input_hook(original, batch, None, None, None, None, None, **kw) == "verify input"
    _skipped_step([100, 300])
    dp.verify_input_hook(original, batch, None, None, None, None, None, **kw)
    assert seen == [None, 400] and batch.seq_lens_sum is None  # restored: the bound never outlives the call
    stock = SimpleNamespace(seq_lens_sum=391)
    dp.verify_input_hook(original, stock, None, None, None, None, None, **kw)
    assert seen[-1] == 391


def test_a_device_plan_that_raises_turns_the_slot_off_and_plans_from_the_wrappers_own_lengths(monkeypatch):
    """Draft decode rows at topk 4: four rows per request, read back from the wrapper's device indptr."""
    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(dp, "device_plan_for", lambda w, a, d: broken)
    step = _skipped_step([50, 70])
    step.site = ("draft_decode", 8, "hi")
    rows = [51, 52, 53, 54, 71, 72, 73, 74]
    indptr = torch.tensor([0] + list(torch.tensor(rows).cumsum(0).tolist()), dtype=torch.int32)
    planned = []
    module = SimpleNamespace(plan=lambda *args: planned.append(args) or ["info"])
    wrapper = FakeWrapper(is_cuda_graph_enabled=True, _paged_kv_indptr_buf=indptr, _plan_info=[0] * 10,
                          _cached_module=module)
    dp.install_planner(wrapper)
    hi_indptr = torch.zeros(9, dtype=torch.int32)  # what the site's host lengths said: not what the kernel reads
    args = (None, None, None, hi_indptr, 8, HQ, HQ, 1, True, -1, 0.0, HD, HD, None, None)  # CUDA-core decode
    assert wrapper._cached_module.plan(*args) == ["info"]
    (call,) = planned
    assert call[3].tolist() == indptr.tolist() and dp.ENGINE.stats.rescues == 1
    assert "device plan raised RuntimeError" in dp.ENGINE.disabled and 2 in dp.ENGINE.stock_sizes
