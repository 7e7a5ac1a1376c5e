"""The FlashInfer plan slots on the CPU: the guard's ring and waits with stand-in
events, which wrappers its hooks guard, and which verify captures the tree-verify
slot gives SGLang's host plan (real ForwardMode / SpecInputType / fast_prefill_plan).
The plans themselves are compared on real FlashInfer in test_gpu_flashinfer_plans.py."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.layers.attention.flashinfer_backend as fb
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpecInputType
from sglang_hostsync_plugin import config, registry
from sglang_hostsync_plugin.checks import source_sha
from sglang_hostsync_plugin.slots import flashinfer_plan_guard as guard_mod
from sglang_hostsync_plugin.slots import flashinfer_tree_verify_plan as tree


class FakeEvent:
    """Fires when the test says the GPU passed it."""

    def __init__(self, log):
        self.log, self.records, self.fired = log, 0, True

    def record(self):
        self.records += 1
        self.fired = False
        self.log.append(("record", self))

    def query(self):
        return self.fired

    def synchronize(self):
        self.log.append(("wait", self))
        self.fired = True


class Wrapper:
    def __init__(self, graph=True):
        self.is_cuda_graph_enabled = graph
        self._pin_memory_int_workspace_buffer = torch.zeros(16, dtype=torch.uint8)


def _guard(log):
    return guard_mod.PlanGuard(new_event=lambda: FakeEvent(log), new_buffer=torch.zeros_like)


def test_ring_alternates_buffers_and_waits_only_for_an_unfinished_copy():
    log = []
    g = _guard(log)
    w = Wrapper()
    original = w._pin_memory_int_workspace_buffer
    used = []
    for _ in range(5):
        g.before_plan(w)
        used.append(w._pin_memory_int_workspace_buffer)
        g.after_plan(w)
    # The first plan keeps the wrapper's buffer; the second makes one more; then they alternate.
    assert used[0] is original and used[2] is original and used[4] is original
    assert used[1] is used[3] and used[1] is not original and g.allocations == 1
    # Nothing fired in between: each reuse waited for the copy two plans back.
    assert g.host_waits == 3 and [k for k, _ in log].count("wait") == 3
    # Copies that already ran cost no wait.
    for _, ev in log:
        ev.fired = True
    g.before_plan(w)
    assert g.host_waits == 3


def test_the_wait_is_for_the_buffer_being_rewritten():
    log = []
    g = _guard(log)
    w = Wrapper()
    for _ in range(2):
        g.before_plan(w)
        g.after_plan(w)
    ring = g.rings[w]
    first, second = ring.events
    second.fired = False
    first.fired = False
    g.before_plan(w)  # back to buffer 0: waits on its event, not on the newer one
    assert log[-1] == ("wait", first) and second.fired is False


def test_rings_are_per_wrapper_and_die_with_it():
    g = _guard([])
    a, b = Wrapper(), Wrapper()
    for w in (a, b, a):
        g.before_plan(w)
        g.after_plan(w)
    assert a._pin_memory_int_workspace_buffer is not b._pin_memory_int_workspace_buffer
    assert len(g.rings) == 2
    del a, w
    import gc

    gc.collect()
    assert len(g.rings) == 1


def test_hooks_guard_graph_wrappers_and_pass_every_argument(monkeypatch):
    log = []
    g = _guard(log)
    monkeypatch.setattr(guard_mod, "_guard", g)
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))
        return "planned"

    graph, eager = Wrapper(), Wrapper(graph=False)
    assert guard_mod.decode_begin_forward_hook(original, "updater", graph, 1, 2, plan="p", req_pool_indices="r") == "planned"
    assert seen[-1] == (("updater", graph, 1, 2), {"plan": "p", "req_pool_indices": "r"})
    assert guard_mod.prefill_begin_forward_hook(original, "updater", eager, graph, 3, plan="p") == "planned"
    assert seen[-1] == (("updater", eager, graph, 3), {"plan": "p"})
    assert graph in g.rings and eager not in g.rings  # eager plan() syncs by itself
    assert guard_mod.prefill_begin_forward_hook(original, "updater", None, graph, plan="p") == "planned"
    assert [k for k, _ in log] == ["record", "record", "wait", "record"]


def _verify_batch(topk=4, spec_type=SpecInputType.EAGLE_VERIFY, mode=ForwardMode.TARGET_VERIFY, seq_lens_cpu=True, bs=2):
    spec = SimpleNamespace(spec_input_type=spec_type, topk=topk, draft_token_num=NDT)
    return SimpleNamespace(forward_mode=mode, spec_info=spec, batch_size=bs,
                           seq_lens_cpu=torch.tensor([5] * bs) if seq_lens_cpu else None)


def _backend(**over):
    wrappers = {2: [SimpleNamespace(begin_forward="plan()")]}  # the wrapper's own plan()
    fields = dict(prefill_backend="fa2", dispatch_reason=None, flashinfer_kv_cache_dtype=torch.bfloat16,
                  prefill_cuda_graph_metadata=wrappers)
    fields.update(over)
    return SimpleNamespace(**fields)


def _captured(backend, batch, in_capture=True):
    calls = []
    tree.capture_hook(lambda *a: calls.append(a), backend, batch, in_capture)
    assert calls == [(backend, batch, in_capture)]
    return backend.prefill_cuda_graph_metadata[batch.batch_size][0].begin_forward


def test_topk_above_one_verify_capture_installs_sglangs_host_plan():
    backend = _backend()
    bf = _captured(backend, _verify_batch(topk=4))
    assert isinstance(bf, partial) and bf.func is fb.fast_prefill_plan
    # bound to its own wrapper; .func is what call_begin_forward tests to take the host path
    assert bf.args == (backend.prefill_cuda_graph_metadata[2][0],) and not bf.keywords


NGRAM = dict(topk=-1, spec_type=SpecInputType.NGRAM_VERIFY)


@pytest.mark.parametrize("case", [
    dict(batch=dict(topk=1)),  # the upstream switch's case, left to it
    dict(batch=dict(mode=ForwardMode.DECODE)),
    *(dict(batch=dict(verify, **c.get("batch", {})), **{k: v for k, v in c.items() if k != "batch"})
      for verify in (dict(topk=4), NGRAM) for c in (
          dict(batch=dict(seq_lens_cpu=False)),
          dict(backend=dict(prefill_backend="fa3")),
          dict(backend=dict(dispatch_reason="swa")),
          dict(backend=dict(flashinfer_kv_cache_dtype=torch.float32)),
          dict(in_capture=False),
      )),
])
def test_other_captures_keep_stock_plan(case):
    backend = _backend(**case.get("backend", {}))
    assert _captured(backend, _verify_batch(**case.get("batch", {})), case.get("in_capture", True)) == "plan()"


def test_ngram_verify_capture_installs_a_host_plan_over_the_wrappers_plan():
    backend = _backend()
    w = backend.prefill_cuda_graph_metadata[2][0]
    bf = _captured(backend, _verify_batch(**NGRAM))
    # No .func: call_begin_forward takes its plain branch and calls it with plan()'s arguments.
    assert isinstance(bf, tree.NgramHostPlan) and not hasattr(bf, "func")
    assert bf.wrapper is w and bf.stock == "plan()" and bf.host is None
    assert _captured(backend, _verify_batch(**NGRAM)) is bf  # no double wrap


def test_ngram_replay_hands_its_host_lengths_to_the_plan_for_that_call_only():
    backend = _backend()
    capture = _verify_batch(topk=-1, spec_type=SpecInputType.NGRAM_VERIFY)
    bf = _captured(backend, capture)
    replay = _verify_batch(topk=-1, spec_type=SpecInputType.NGRAM_VERIFY)
    seen = []
    tree.capture_hook(lambda *a: seen.append(bf.host), backend, replay, False)
    assert seen[0][0] is replay.seq_lens_cpu and seen[0][1] == NDT and bf.host is None
    # No host lengths this replay: the plan gets none (it runs plan()).
    tree.capture_hook(lambda *a: seen.append(bf.host), backend,
                      _verify_batch(topk=-1, spec_type=SpecInputType.NGRAM_VERIFY, seq_lens_cpu=False), False)
    assert seen[1] is None

    def boom(*a):
        raise RuntimeError("replay failed")

    with pytest.raises(RuntimeError):
        tree.capture_hook(boom, backend, replay, False)
    assert bf.host is None  # never left behind for a later, unrelated plan


# --- NGRAM verify through SGLang's real call_begin_forward, on the CPU ------------

NDT = 8


class CpuWrapper:
    """The fields SGLang's fast_prefill_plan reads and writes on a CUDA-graph
    BatchPrefillWithPagedKVCacheWrapper; the FlashInfer module's plan() records its arguments."""

    is_cuda_graph_enabled = True
    _backend = "fa2"

    def __init__(self, bs: int, pool: int):
        self.device = torch.device("cpu")
        self.module_plans, self.stock_plans = [], []
        self._cached_module = SimpleNamespace(plan=lambda *a: self.module_plans.append(a) or ("info", len(self.module_plans)))
        self._max_total_num_rows = None
        self._qo_indptr_buf = torch.zeros(bs + 1, dtype=torch.int32)
        self._paged_kv_indptr_buf = torch.zeros(bs + 1, dtype=torch.int32)
        self._paged_kv_last_page_len_buf = torch.zeros(bs, dtype=torch.int32)
        self._paged_kv_indices_buf = torch.zeros(pool, dtype=torch.int32)
        self._custom_mask_buf = torch.zeros(pool * NDT // 8 + 64, dtype=torch.uint8)
        self._mask_indptr_buf = torch.zeros(bs + 1, dtype=torch.int32)
        self._float_workspace_buffer = torch.zeros(8, dtype=torch.uint8)
        self._int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)

    def plan(self, *args, **kwargs):
        self.stock_plans.append((args, kwargs))

    begin_forward = plan


def _ngram_mask(rng, seq_lens):
    """USE_FULL_MASK's layout: per request [NDT, seq_len] ones, then the NDT x NDT tree."""
    rows = []
    for s in seq_lens:
        tree_part = torch.tril(torch.ones(NDT, NDT, dtype=torch.bool))
        tree_part &= torch.rand(NDT, NDT, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) < 0.6
        tree_part |= torch.eye(NDT, dtype=torch.bool)
        rows.append(torch.cat([torch.ones(NDT, s, dtype=torch.bool), tree_part], dim=1).flatten())
    return torch.cat(rows)


def _updater(bs):
    translator = SimpleNamespace(
        reads_are_translated=False,
        pack_read_stream=lambda plan, *, out, indptr, **kw: out[: int(indptr[-1])].copy_(
            torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(7)).to(out.dtype)))
    return SimpleNamespace(attn_backend=SimpleNamespace(kv_index_translator=translator), num_qo_heads=32,
                           num_kv_heads=8, head_dim=128, q_data_type=torch.bfloat16, data_type=torch.bfloat16,
                           kv_last_page_len=torch.ones(16, dtype=torch.int32), _swa_kv_pool=None)


def _call_begin_forward(wrapper, spec, seq_lens):
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    fb.FlashInferIndicesUpdaterPrefill.call_begin_forward(
        _updater(bs), None, wrapper, torch.arange(bs), seq, int(seq.sum()), seq, None, None,
        torch.zeros(bs + 1, dtype=torch.int32), torch.zeros(bs + 1, dtype=torch.int32), False, spec,
        seq_lens_cpu=seq.to(torch.int64), plan="kv-loc-plan")


def _ngram_spec(mask, eagle_typed=False):
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    spec = NgramVerifyInput(custom_mask=mask, draft_token_num=NDT)
    if eagle_typed:  # the same arrays, typed EAGLE: SGLang's own host branch plans it
        spec.spec_input_type = SpecInputType.EAGLE_VERIFY
    return spec


def _ngram_planned(bs, pool, lens, mask):
    """A wrapper with the slot's NGRAM plan, after SGLang's call_begin_forward planned an
    NGRAM verify of ``lens`` through it (the replay hook's host lengths handed over)."""
    w = CpuWrapper(bs, pool)
    w.begin_forward = tree.NgramHostPlan(w, w.plan)
    w.begin_forward.host = (torch.tensor(lens, dtype=torch.int64), NDT)
    _call_begin_forward(w, _ngram_spec(mask), lens)
    return w


EDGE_LENS = [1, 15, 16, 17, 31, 32, 33, 255, 256, 257]


def _lens(rng, bs):
    return [rng.choice(EDGE_LENS) if rng.random() < 0.5 else rng.randint(1, 300) for _ in range(bs)]


def test_ngram_host_layout_is_what_sglangs_eagle_host_branch_builds(monkeypatch):
    """Through SGLang's call_begin_forward: an NGRAM verify reaches fast_prefill_plan via the
    slot with exactly the host kwargs (and the same device arrays) that SGLang's own EAGLE
    branch passes for the same lengths."""
    import random

    calls = []
    monkeypatch.setattr(fb, "fast_prefill_plan", lambda w, *a, **k: calls.append((w, a, k)))
    rng = random.Random(15)
    for bs in (1, 2, 3, 5, 8, 16):
        lens = _lens(rng, bs)
        mask = _ngram_mask(rng, lens)
        ours = _ngram_planned(bs, 4096, lens, mask)
        sglangs = CpuWrapper(bs, 4096)
        sglangs.begin_forward = partial(fb.fast_prefill_plan, sglangs)
        _call_begin_forward(sglangs, _ngram_spec(mask, eagle_typed=True), lens)
        (w1, a1, k1), (w2, a2, k2) = calls[-2:]
        assert w1 is ours and w2 is sglangs and not ours.stock_plans
        assert k1.keys() == k2.keys() and "qo_indptr_host" in k1 and "custom_mask" in k1
        for key in k1:
            v1, v2 = k1[key], k2[key]
            assert torch.equal(v1, v2) if isinstance(v1, torch.Tensor) else v1 == v2, key
        assert len(a1) == len(a2) == 8
        for v1, v2 in zip(a1, a2):
            assert torch.equal(v1, v2) if isinstance(v1, torch.Tensor) else v1 == v2


def _packbits_little(bits: torch.Tensor) -> bytes:
    import numpy as np

    return np.packbits(bits.numpy().astype(np.uint8), bitorder="little").tobytes()


def test_ngram_host_plan_equals_what_plan_computes_from_the_device_arrays():
    """SGLang's real fast_prefill_plan (mask packed by its Triton kernel) behind the slot's
    NGRAM plan: the host arrays FlashInfer's module is planned with are the ones plan()
    reads back (qo/kv indptr, kv lens, rows), and the packed mask is plan()'s
    segment_packbits(bitorder="little") of every request's qo x kv mask segment."""
    import random

    rng = random.Random(16)
    for bs in (1, 2, 3, 8, 16):
        lens = _lens(rng, bs)
        mask = _ngram_mask(rng, lens)
        w = _ngram_planned(bs, 8192, lens, mask)
        assert w.begin_forward.host_plans == 1 and not w.stock_plans and len(w.module_plans) == 1
        args = w.module_plans[0]
        qo_host, kv_indptr_host, kv_lens_host, rows, plan_bs = args[3], args[4], args[5], args[6], args[7]
        kv_lens = torch.tensor(lens, dtype=torch.int32) + NDT
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(kv_lens, 0).to(torch.int32)])
        assert torch.equal(qo_host, torch.arange(0, (bs + 1) * NDT, NDT, dtype=torch.int32))
        assert torch.equal(kv_indptr_host, kv_indptr) and torch.equal(kv_lens_host, kv_lens)
        assert rows == bs * NDT and plan_bs == bs
        assert torch.equal(w._qo_indptr_buf, qo_host) and torch.equal(w._paged_kv_indptr_buf, kv_indptr)
        assert (w._max_q_len, w._max_kv_len) == (NDT, int(kv_lens.max()))
        # plan(): mask_indptr = qo_len * kv_len per request, then segment_packbits.
        seg = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(kv_lens.to(torch.int64) * NDT, 0)])
        packed, indptr = b"", [0]
        for i in range(bs):
            chunk = _packbits_little(mask[int(seg[i]): int(seg[i + 1])])
            packed += chunk
            indptr.append(indptr[-1] + len(chunk))
        assert w._mask_indptr_buf.tolist() == indptr
        assert bytes(w._custom_mask_buf[: indptr[-1]].tolist()) == packed


def test_ngram_plan_without_host_lengths_is_the_wrappers_own_plan():
    w = CpuWrapper(2, 1024)
    w.begin_forward = tree.NgramHostPlan(w, w.plan)
    lens = [16, 17]
    _call_begin_forward(w, _ngram_spec(_ngram_mask(__import__("random").Random(1), lens)), lens)
    assert len(w.stock_plans) == 1 and not w.module_plans and w.begin_forward.host_plans == 0
    args, kwargs = w.stock_plans[0]
    assert len(args) == 8 and kwargs["custom_mask"] is not None and "qo_indptr_host" not in kwargs


def test_call_begin_forward_still_refuses_a_non_eagle_mask_on_its_host_branch():
    # Why NGRAM gets its own plan object: SGLang's host branch asserts the mask is EAGLE's.
    src = __import__("inspect").getsource(fb.FlashInferIndicesUpdaterPrefill.call_begin_forward)
    assert "assert use_custom_mask is None or eagle_verify" in src
    assert 'hasattr(wrapper_paged.begin_forward, "func")' in src


def test_upstream_topk1_install_is_still_the_one_extended():
    # If SGLang changes these conditions (e.g. covers topk > 1 itself), the pinned sha fails
    # the slot; this names what the slot mirrors.
    src = __import__("inspect").getsource(fb.FlashInferAttnBackend.init_forward_metadata_out_graph)
    for cond in ("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN", "spec_info.topk == 1", 'self.prefill_backend == "fa2"',
                 "self.dispatch_reason is None", "self.flashinfer_kv_cache_dtype", "seq_lens_cpu is not None",
                 "partial(fast_prefill_plan, w)"):
        assert cond in src, cond
    assert source_sha(fb.FlashInferAttnBackend.init_forward_metadata_out_graph) == tree.SLOT.targets[0].source_sha


def test_selection_rules():
    catalogue = registry.catalogue()
    default = config.parse_slot_spec("default", catalogue).names
    assert {"flashinfer_plan_guard", "flashinfer_tree_verify_plan"} <= set(default)
    fi = config.parse_slot_spec("flashinfer", catalogue).names
    assert set(fi) == {"flashinfer_plan_guard", "flashinfer_tree_verify_plan",
                       "flashinfer_verify_host_plan", "flashinfer_draft_host_indptr", "draft_extend_fused_layout"}
    with pytest.raises(config.HostsyncConfigError, match="requires slot 'flashinfer_plan_guard'"):
        config.parse_slot_spec("default,-flashinfer_plan_guard", catalogue)


def test_trace_sites_summarizes_every_decode_step(tmp_path):
    """benchmarks/trace_sites.py, which the FlashInfer results' site tables come from."""
    import importlib.util
    import lzma
    import math
    import os

    from helpers import REPO
    from sglang_hostsync_plugin.slots.audit import TraceStep, format_trace_line

    spec = importlib.util.spec_from_file_location("trace_sites", os.path.join(REPO, "benchmarks", "trace_sites.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    steps = [TraceStep(0, 0.0, 0.001, False, math.nan, ("prefill.py:1 (plan)",))]
    steps += [TraceStep(i, 0.01 * i, 0.01 * i + 0.012, True, 9000.0 + i,
                        ("streams.py:108 (synchronize)",) + (("fb.py:2594 (common_template)",) if i % 2 else ()))
              for i in range(1, 11)]
    path = tmp_path / "x.trace.tsv.xz"
    with lzma.open(path, "wt") as f:
        f.write("#hostsync-audit-trace v2\n" + "".join(format_trace_line(s) for s in steps))
    text = mod.summarize(str(path), skip=2)
    # 8 decode steps after the skip (steps 3..10): 8 synchronize, 4 common_template, no prefill
    # site; each step launched 2 ms before the previous one finished.
    assert "8 decode steps, syncs/step 1.50" in text and "run-ahead 1.000" in text
    assert "lead ms median 2.00" in text and "host us/step median 9006" in text
    assert "1.00  streams.py:108 (synchronize)" in text and "0.50  fb.py:2594 (common_template)" in text
    assert "prefill.py" not in text


def test_guard_precheck_refuses_a_flashinfer_that_stages_plans_elsewhere(monkeypatch):
    import importlib.machinery
    import sys
    import types

    class Stages:
        is_cuda_graph_enabled = False

        def __init__(self):
            self._pin_memory_int_workspace_buffer = None

    class Elsewhere:
        is_cuda_graph_enabled = False

        def __init__(self):
            self._plan_staging = None

    class NoGraphFlag:
        def __init__(self):
            self._pin_memory_int_workspace_buffer = None

    fake = types.ModuleType("flashinfer")
    fake.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    fake.__version__ = "9.9"
    fake.BatchPrefillWithPagedKVCacheWrapper = fake.BatchPrefillWithRaggedKVCacheWrapper = Stages
    fake.BatchDecodeWithPagedKVCacheWrapper = Elsewhere
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    reason = guard_mod.precheck()
    assert reason.startswith("flashinfer 9.9: Elsewhere no longer set _pin_memory_int_workspace_buffer")
    fake.BatchDecodeWithPagedKVCacheWrapper = NoGraphFlag
    assert guard_mod.precheck().startswith("flashinfer 9.9: NoGraphFlag no longer set")
    fake.BatchDecodeWithPagedKVCacheWrapper = Stages
    assert guard_mod.precheck() is None


def test_without_flashinfer_the_guard_applies_and_waits_for_nothing():
    import importlib.util

    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("flashinfer is installed here")
    assert guard_mod.precheck() is None


def test_a_refused_guard_refuses_the_host_plan_that_needs_it(monkeypatch):
    from sglang_hostsync_plugin import checks, plan
    from sglang_hostsync_plugin.slot import Status

    real = checks.check_slot
    monkeypatch.setattr(checks, "check_slot",
                        lambda slot: "upstream shape changed: x" if slot.name == "flashinfer_plan_guard" else real(slot))
    p = plan.resolve({config.ENV_ENABLE: "1", config.ENV_STRICT: "0"})
    guard, tree = p.verdict("flashinfer_plan_guard"), p.verdict("flashinfer_tree_verify_plan")
    assert guard.status is Status.FAILED and tree.status is Status.FAILED
    assert tree.reason == "requires slot 'flashinfer_plan_guard', which cannot apply: upstream shape changed: x"
    assert p.verdict("event_ring").status is Status.WOULD_APPLY  # the others are unaffected


def test_refused_dependents_follow_chains_and_leave_the_rest():
    from sglang_hostsync_plugin.checks import refused_dependents
    from sglang_hostsync_plugin.slot import Slot, SlotKind

    def s(name, *requires):
        return Slot(name=name, kind=SlotKind.OWNED, origin="t", summary="t", default=True, requires=requires)

    catalogue = {n.name: n for n in (s("c", "b"), s("b", "a"), s("a"), s("d"), s("e", "d"))}
    got = refused_dependents(catalogue, {"a": "broken", "b": None, "c": None, "d": None, "e": None})
    assert got == {"b": "requires slot 'a', which cannot apply: broken",
                   "c": "requires slot 'b', which cannot apply: requires slot 'a', which cannot apply: broken"}
