"""Slot ``flashinfer_certified_plan`` on the CPU.

- The window: a simulation of SGLang's overlap loop (``event_loop_overlap``'s order, SGLang's own
  ``page_aligned_decode_alloc_lens`` for the reserve, ``ReqKvInfo``) never finds a device length outside
  the slot's window, nor a window past the allocated KV, at page sizes 1, 16 and 64; three wrong windows
  (lag ignored, one token short, page-rounded) are each caught by the same search.
- The certificate: on random planner calls the port's key is equal exactly where the full plan is, and
  a certified window plans every length in it as its ``hi``; a weaker certificate (the chunk size alone)
  is caught.
- The hook path on SGLang's objects: the real ``FutureMap`` resolve (stock's D2H + synchronize where the
  window is uncertain, SGLang's GPU-only branch where it is certified), SGLang's real
  ``update_single_wrapper`` / ``call_begin_forward`` / ``fast_prefill_plan`` and
  ``_build_draft_indptr_host`` up to the planner, a stand-in FlashInfer planner (the port, writing its
  plan into the pinned buffer as PrefillPlanImpl does): a skipped step hands FlashInfer exactly the
  plans (plan_info and pinned bytes) the stock step with the exact lengths does; a wrong prediction is
  rescued; a self-check mismatch or a window miss turns the slot off.
- The draft extend's prefix lengths and positions in a skipped step come from the device lengths
  (SGLang's real ``prepare_for_draft_extend``), the same as stock's.

The GPU side (the port against FlashInfer's planner, a real server's outputs and syncs) is
tests/test_gpu_flashinfer_certified_plan.py.
"""

import collections
import inspect
import itertools
import random
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang.srt.layers.attention import flashinfer_backend as fb
from sglang.srt.managers.overlap_utils import FutureMap
from sglang.srt.managers.schedule_batch import ReqKvInfo
from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType, SpeculativeAlgorithm
from sglang_hostsync_plugin import flashinfer_split as fs, registry
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import flashinfer_certified_plan as cert
from test_ngram_accept_readback import FakeEvent, LogStream

W = 4  # --speculative-num-draft-tokens at topk 1 (3 steps)
STEPS = 3
HQ, HKV, HD = 32, 8, 128  # Llama-8B shape: tensor-core draft decode
BUCKETS = (1, 2, 4, 8, 16)
POOL = 40


@pytest.fixture(autouse=True)
def _fresh_engine(monkeypatch):
    monkeypatch.setattr(cert, "ENGINE", cert.Engine())
    cert.ENGINE.device = fs.H100
    # What the two switch slots set in every process (flashinfer_verify_host_plan, flashinfer_draft_host_indptr).
    monkeypatch.setenv("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN", "1")
    monkeypatch.setenv("SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR", "1")


# ---------------------------------------------------------------------------
# Catalogue and rules
# ---------------------------------------------------------------------------
def test_slot_is_opt_in_in_no_preset_and_checks():
    s = registry.catalogue()[cert.NAME]
    assert not s.default and s.presets == () and "experimental" in s.summary and s.requires == ()
    assert check_slot(s) is None


def _facts(**kw):
    base = dict(speculative_algorithm="EAGLE", topk=1, page_size=16, attention_backends=("flashinfer", "flashinfer"),
                speculative_num_steps=3)
    base.update(kw)
    return ServingFacts(**base)


@pytest.mark.parametrize("kw, want", [
    ({}, None),
    ({"speculative_algorithm": "STANDALONE"}, None),
    ({"speculative_algorithm": "EAGLE3", "topk": None}, None),  # decided at the refinement
    ({"topk": 4}, "--speculative-eagle-topk is 4"),
    ({"speculative_algorithm": "NGRAM"}, "--speculative-algorithm is NGRAM"),
    ({"speculative_algorithm": "DFLASH"}, "--speculative-algorithm is DFLASH"),
    ({"attention_backends": ("triton", "triton")}, "not flashinfer"),
    ({"draft_attention_backend": "triton"}, "draft attention backend is triton"),
    ({"disable_cuda_graph": True}, "--disable-cuda-graph"),
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"dp_attention": True}, "attention DP"),
    ({"two_batch_overlap": True}, "two-batch overlap"),
    ({"tp_size": 2}, "--tp-size is 2"),
    ({"speculative_adaptive": True}, "adaptive"),
    ({"speculative_num_steps": 1}, "--speculative-num-steps is 1"),
    ({"draft_window_size": 64}, "draft-window-size"),
    ({"kv_cache_dtype": "fp4_e2m1"}, "--kv-cache-dtype"),
])
def test_inert_rules(kw, want):
    reason = cert.inert(_facts(**kw))
    assert (reason is None) if want is None else (want in reason), reason


def test_precheck_refuses_another_flashinfer_and_a_changed_pinned_source(monkeypatch):
    import importlib.metadata
    import importlib.util

    assert cert.precheck_upstream() is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flashinfer" else None)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.7.3")
    assert "flashinfer 0.7.3 installed" in cert.precheck_upstream()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: fs.FLASHINFER_VERSION)
    assert cert.precheck_upstream() is None
    monkeypatch.setattr(cert, "PINS", ((cert.PINS[0][0], cert.PINS[0][1], "0" * 16),))
    assert "expected 0000000000000000" in cert.precheck_upstream()


def test_the_pinned_sglang_code_says_what_the_window_relies_on():
    """The lag is one verify at most: the loop runs a batch before it processes the previous one's
    result, which adds the accepted run to kv_committed_len; the device adds accept_lens."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    loop = inspect.getsource(Scheduler.event_loop_overlap)
    assert loop.index("get_next_batch_to_run") < loop.index("self.run_batch(batch)") < loop.rindex("pop_and_process()")
    assert "req.kv.kv_committed_len += num_accept_tokens" in inspect.getsource(
        SchedulerBatchResultProcessor._resolve_spec_v2_tokens)
    resolve = inspect.getsource(FutureMap.resolve_seq_lens_cpu)
    assert "if not self.needs_cpu_seq_lens:" in resolve and "batch.seq_lens_cpu = None" in resolve


# ---------------------------------------------------------------------------
# 1. The window never undershoots (SGLang's loop order, its allocation reserve)
# ---------------------------------------------------------------------------
def _req(committed):
    return SimpleNamespace(kv=ReqKvInfo(kv_committed_len=committed, kv_allocated_len=committed), finished=False)


def find_undershoot(window_fn, *, seed: int, page_size: int, steps: int = 400):
    """Run SGLang's overlap loop in miniature and return the first (step, request, lo, real, hi,
    allocated) where ``window_fn`` misses the device length or passes the allocated KV, else None.

    Each iteration, as ``Scheduler.event_loop_overlap``: pick the batch (finished requests filtered,
    new ones merged after their prefill), ``eagle_prepare_for_decode``'s allocation (SGLang's
    ``page_aligned_decode_alloc_lens`` with the reserve of ``get_alloc_reserve_per_decode``: 2 * W at
    topk 1), the decision, ``run_batch`` (the device adds 1..W), then the previous batch's result (the
    host adds the accepted run); sometimes that result is processed before the run
    (``disable_overlap_for_batch``), sometimes the step is a prefill of new requests."""
    rng = random.Random(seed)
    device: dict[int, int] = {}
    running: list = []
    queue: collections.deque = collections.deque()
    last = None

    def process():
        batch, accepted = queue.popleft()
        for r in batch.reqs:
            if batch.forward_mode.is_decode() and not r.finished:
                r.kv.kv_committed_len += accepted[id(r)]
                if rng.random() < 0.05:
                    r.finished = True

    for step in range(steps):
        running = [r for r in running if not r.finished]
        if last is not None and last.forward_mode == ForwardMode.EXTEND:
            running += last.reqs  # merge_batch of the last prefill
        prefill = not running or rng.random() < 0.1
        if prefill:
            new = [_req(rng.randint(1, 3000)) for _ in range(rng.randint(1, 3))]
            for r in new:
                device[id(r)] = r.kv.kv_committed_len  # the prefill publishes batch.seq_lens
            batch = SimpleNamespace(reqs=new, forward_mode=ForwardMode.EXTEND)
        else:
            batch = SimpleNamespace(reqs=list(running), forward_mode=ForwardMode.DECODE)
            _, nxt, _ = page_aligned_decode_alloc_lens(batch.reqs, reserve=2 * W, page_size=page_size)
            for r, n in zip(batch.reqs, nxt):
                r.kv.kv_allocated_len = n
            window = window_fn(batch.reqs, [b for b, _ in queue])
            for i, r in enumerate(batch.reqs):
                real = device[id(r)]
                lo, hi = (window[0][i], window[1][i]) if window else (None, None)
                if window is None or not lo <= real <= hi or hi > r.kv.kv_allocated_len:
                    return step, i, lo, real, hi, r.kv.kv_allocated_len
        if queue and rng.random() < 0.15:
            process()  # disable_overlap_for_batch: the previous result first
        accepted = {}
        if batch.forward_mode.is_decode():
            for r in batch.reqs:
                accepted[id(r)] = rng.choice([1, W, rng.randint(1, W)])
                device[id(r)] += accepted[id(r)]
        queue.append((SimpleNamespace(reqs=list(batch.reqs), forward_mode=batch.forward_mode), accepted))
        last = batch
        if len(queue) > 1:
            process()
    return None


def _slot_window(reqs, pending):
    return cert.step_window(reqs, pending, W)


def _lag_ignored(reqs, pending):
    return cert.step_window(reqs, [], W)


def _one_short(reqs, pending):
    lo, hi = cert.step_window(reqs, pending, W)
    return lo, [h - 1 if h > lo_ else h for h, lo_ in zip(hi, lo)]


def _page_rounded(reqs, pending, page=16):
    """Committed length rounded up to the page instead of + W: what a page-granular bound gives."""
    lo, _ = cert.step_window(reqs, pending, W)
    return lo, [-(-r.kv.kv_committed_len // page) * page for r in reqs]


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("seed", range(6))
def test_the_window_holds_every_device_length_and_stays_inside_the_reserve(page_size, seed):
    assert find_undershoot(_slot_window, seed=seed, page_size=page_size) is None


@pytest.mark.parametrize("wrong", [_lag_ignored, _one_short, _page_rounded])
def test_a_window_that_can_undershoot_is_caught(wrong):
    found = [find_undershoot(wrong, seed=s, page_size=16) for s in range(6)]
    assert any(f is not None and f[3] > f[4] for f in found), found  # real > hi


def test_request_window_cases():
    assert cert.request_window(100, 200, None, W) == (100, 100)  # result processed: exact
    assert cert.request_window(100, 200, "decode", W) == (101, 104)  # one verify in flight: 1..W accepted
    assert cert.request_window(100, 200, "other", W) == (100, 104)
    assert cert.request_window(100, 103, "decode", W) is None  # past the allocated KV: stock's resolve
    pending = [SimpleNamespace(reqs=[], forward_mode=ForwardMode.DECODE)] * 2
    assert cert.step_window([_req(5)], pending, W) is None  # two batches unprocessed: never under overlap


# ---------------------------------------------------------------------------
# 2. The certificate: equal keys are equal plans; a certified window plans every length as hi
# ---------------------------------------------------------------------------
def _random_call(rng, bs=None, cuda_graph=None):
    bs = bs or rng.randint(1, 12)
    qo = rng.choice([1, 1, 2, 4, 8])
    heads = rng.choice([(32, 8, 128), (64, 8, 128), (28, 4, 128), (32, 32, 64), (16, 2, 256)])
    cg = rng.random() < 0.8 if cuda_graph is None else cuda_graph
    fixed = rng.random()
    call = fs.PlannerCall(
        qo_indptr=tuple(i * qo for i in range(bs + 1)), kv_indptr=(0,) * (bs + 1),
        total_num_rows=bs * qo + (rng.randint(0, 8) * qo if cg else 0), batch_size=bs, num_qo_heads=heads[0],
        num_kv_heads=heads[1], page_size=1, enable_cuda_graph=cg, head_dim_qk=heads[2], head_dim_vo=heads[2],
        causal=qo > 1, window_left=rng.choice([-1] * 6 + [255]), fixed_split_size=1024 if fixed < 0.05 else -1,
        disable_split_kv=0.05 <= fixed < 0.1, num_colocated_ctas=0, uniform_q_len=0)
    return call


def _plan(call, lens):
    try:
        return fs.plan_call(call.with_kv_lens(lens))
    except ValueError:
        return None


def test_key_equality_is_plan_equality():
    rng = random.Random(3)
    equal = differ = 0
    for _ in range(1500):
        call = _random_call(rng)
        site = fs.SplitSite(call)
        a = [rng.randint(1, 9000) for _ in range(call.batch_size)]
        b = [x + rng.choice([0, 0, 1, rng.randint(0, 8), rng.randint(0, 600)]) for x in a]
        same_key, same_plan = site.key(a) == site.key(b), _plan(call, a) == _plan(call, b)
        assert same_key == same_plan, (call, a, b)
        assert (site.key(a) is None) == (_plan(call, a) is None)
        equal += same_plan
        differ += not same_plan
    assert equal > 300 and differ > 300


def _certify(call, lo, hi):
    site = fs.SplitSite(call)
    k = site.key(hi)
    return k is not None and k == site.key(lo)


def _box(lo, hi, rng, limit=300):
    sizes = [h - l + 1 for l, h in zip(lo, hi)]
    if np.prod(sizes) <= limit:
        return [list(v) for v in itertools.product(*(range(l, h + 1) for l, h in zip(lo, hi)))]
    return [[rng.randint(l, h) for l, h in zip(lo, hi)] for _ in range(limit)]


def test_a_certified_window_plans_every_length_in_it_as_hi():
    rng = random.Random(11)
    certified = uncertain = 0
    for _ in range(400):
        call = _random_call(rng, bs=rng.choice([1, 1, 2, 3, 4, 8]))
        committed = [rng.randint(1, 8000) for _ in range(call.batch_size)]
        lag = [rng.random() < 0.8 for _ in committed]
        lo = [c + 1 if g else c for c, g in zip(committed, lag)]
        hi = [c + W if g else c for c, g in zip(committed, lag)]
        offset = rng.choice([0, 1, 2, W])
        lo, hi = [x + offset for x in lo], [x + offset for x in hi]
        if not _certify(call, lo, hi):
            uncertain += 1
            continue
        certified += 1
        want = _plan(call, hi)
        for lens in _box(lo, hi, rng):
            assert _plan(call, lens) == want, (call, lo, hi, lens)
    assert certified > 100 and uncertain > 30


def test_a_certificate_on_the_chunk_size_alone_is_caught():
    """Same split flag and chunk at both ends is what the bound-plan investigation called 'certc':
    a longer length can still add a chunk, so the plan (chunk counts, layout) differs inside the box."""
    rng = random.Random(5)

    def weak(call, lo, hi):
        s = fs.SplitSite(call)
        a, b = s.key(lo), s.key(hi)
        return a is not None and b is not None and a[:2] == b[:2]

    found = None
    for _ in range(2000):
        call = _random_call(rng, bs=rng.choice([1, 2, 3]), cuda_graph=True)
        c = [rng.randint(1, 6000) for _ in range(call.batch_size)]
        lo, hi = [x + 1 for x in c], [x + W for x in c]
        if weak(call, lo, hi) and any(_plan(call, lens) != _plan(call, hi) for lens in _box(lo, hi, rng, 64)):
            found = (call, lo, hi)
            break
    assert found is not None
    assert not _certify(*found)


# ---------------------------------------------------------------------------
# The port's own pieces: the call's arguments, and the comparison with FlashInfer's output
# ---------------------------------------------------------------------------
class FakePlanner:
    """FlashInfer's fa2 prefill planner as the port says it behaves: ``plan(*args)`` returns plan_info
    and writes the arrays into the pinned buffer (``args[2]``) at PrefillPlanImpl's offsets
    (scheduler.cuh :764-928, AlignedAllocator). ``tamper`` edits the model first (a wrong planner)."""

    def __init__(self, tamper=None):
        self.tamper = tamper
        self.calls = []

    def plan(self, *args):
        call = fs.PlannerCall.from_args(args)
        self.calls.append(call)
        m = fs.plan_call(call)
        if self.tamper:
            m = self.tamper(m)
        return write_plan(m, call, args[2])


def write_plan(m, call, pinned):
    buf = pinned.numpy()
    cur = [0]

    def alloc(size, align):
        off = -(-cur[0] // align) * align
        cur[0] = off + size
        return off

    def put(off, values, dtype=np.int32):
        arr = np.asarray(values, dtype=dtype).view(np.uint8)
        buf[off: off + arr.size] = arr

    padded, bs = m.padded_batch_size, call.batch_size
    info = dict(padded_batch_size=padded, total_num_rows=call.total_num_rows, cta_tile_q=m.cta_tile_q,
                enable_cuda_graph=int(call.enable_cuda_graph), split_kv=int(m.split_kv), v_offset=0, s_offset=0,
                total_num_rows_offset=0, merge_indptr_offset=0, block_valid_mask_offset=0)
    info["request_indices_offset"] = alloc(4 * padded, 16)
    info["qo_tile_indices_offset"] = alloc(4 * padded, 16)
    info["kv_tile_indices_offset"] = alloc(4 * padded, 16)
    info["o_indptr_offset"] = alloc(4 * (bs + 1), 16)
    info["kv_chunk_size_ptr_offset"] = alloc(4, 1)
    if call.enable_cuda_graph:
        info["total_num_rows_offset"] = alloc(4, 16)
        put(info["total_num_rows_offset"], [m.qo_rows], np.uint32)
    put(info["request_indices_offset"], m.request_indices)
    put(info["qo_tile_indices_offset"], m.qo_tile_indices)
    put(info["kv_tile_indices_offset"], m.kv_tile_indices)
    put(info["o_indptr_offset"], m.o_indptr)
    put(info["kv_chunk_size_ptr_offset"], [m.kv_chunk_size_written])
    if m.split_kv:
        info["merge_indptr_offset"] = alloc(4 * (call.total_num_rows + 1), 16)
        put(info["merge_indptr_offset"], m.merge_indptr)
    if call.enable_cuda_graph:
        info["block_valid_mask_offset"] = alloc(padded, 16)
        put(info["block_valid_mask_offset"], [i < m.new_batch_size for i in range(padded)], np.uint8)
    return [info[f] for f in fs.PLAN_INFO_FIELDS]


def _args(call, pinned):
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    kv = call.kv_lens
    return (None, None, pinned, t(call.qo_indptr), t(call.kv_indptr), t(kv), call.total_num_rows, call.batch_size,
            call.num_qo_heads, call.num_kv_heads, call.page_size, call.enable_cuda_graph, call.head_dim_qk,
            call.head_dim_vo, call.causal, call.window_left, call.fixed_split_size, call.disable_split_kv,
            call.num_colocated_ctas, call.uniform_q_len)


def test_planner_call_parses_the_twenty_arguments_and_compare_reads_the_pinned_buffer():
    rng = random.Random(2)
    for _ in range(200):
        call = _random_call(rng)
        call = call.with_kv_lens([rng.randint(1, 20000) for _ in range(call.batch_size)])
        pinned = torch.zeros(1 << 16, dtype=torch.uint8)
        args = _args(call, pinned)
        assert fs.PlannerCall.from_args(args) == call
        try:
            m = fs.plan_call(call)
        except ValueError:
            continue
        info = write_plan(m, call, pinned)
        assert fs.compare(m, info, pinned, call.batch_size) == []
        wrong = _plan(call, [k + 5000 for k in call.kv_lens])
        if wrong is not None and wrong != m:
            assert fs.compare(wrong, info, pinned, call.batch_size)
    with pytest.raises(ValueError, match="15 arguments"):
        fs.PlannerCall.from_args((None,) * 15)  # the CUDA-core decode planner's call


# ---------------------------------------------------------------------------
# 3. The hook path on SGLang's objects
# ---------------------------------------------------------------------------
def _fi_backend():
    b = object.__new__(fb.FlashInferAttnBackend)
    b.dispatch_reason, b.prefill_backend = None, "fa2"
    return b


def _scheduler(fm):
    draft = object.__new__(fb.FlashInferMultiStepDraftBackend)
    draft.draft_window_size, draft.attn_backends = 0, [_fi_backend()]
    args = SimpleNamespace(enable_mixed_chunk=False, pp_size=1, disaggregation_mode="null", enable_hisparse=False,
                           enable_two_batch_overlap=False, speculative_eagle_topk=1, speculative_adaptive=False,
                           speculative_num_draft_tokens=W)
    runner = SimpleNamespace(model_config=SimpleNamespace(model_is_mrope=False, is_encoder_decoder=False))
    return SimpleNamespace(future_map=fm, server_args=args, enable_overlap=True, result_queue=collections.deque(),
                           req_to_token_pool=SimpleNamespace(), tp_worker=SimpleNamespace(model_runner=runner),
                           draft_worker=SimpleNamespace(spec_v2_attn_backends=(_fi_backend(), draft, _fi_backend())))


def _future_map():
    pool = SimpleNamespace(req_to_token=torch.zeros(POOL, 64, dtype=torch.int32))
    fm = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE, pool, needs_cpu_seq_lens=True)
    log = []
    fm.fwd_prepare_d2h_stream = LogStream(log, fm)
    fm.new_seq_lens_cpu_pinned = torch.empty(POOL, dtype=torch.int64)
    fm.publish_ready = FakeEvent(log, "publish")
    return fm, log


class FakeWrapper(SimpleNamespace):
    """A FlashInfer CUDA-graph wrapper's attributes the plans read and write."""


class World:
    """One EAGLE topk-1 FlashInfer server in miniature: a FutureMap, the scheduler's view, requests, and
    per batch-size bucket the CUDA-graph wrappers of the three plan sites (each planning through a
    ``FakePlanner``). ``step()`` runs the decision, SGLang's resolve and the three sites as the graph
    runners drive them; with ``hooked`` False it is stock (no slot)."""

    def __init__(self, rows, committed, tamper=None):
        self.fm, self.log = _future_map()
        self.sched = _scheduler(self.fm)
        self.rows = rows
        self.reqs = [_req(c) for c in committed]
        for r in self.reqs:
            r.kv.kv_allocated_len = r.kv.kv_committed_len + 64
        self.fm.new_seq_lens_buf[torch.tensor(rows)] = torch.tensor(committed)
        self.tamper = tamper
        self.wrappers: dict = {}

    def device_lens(self):
        return [int(x) for x in self.fm.new_seq_lens_buf[torch.tensor(self.rows)]]

    def bucket(self):
        return next(b for b in BUCKETS if b >= len(self.rows))

    def _wrapper(self, name, bs, planner_kind):
        key = (name, bs)
        if key not in self.wrappers:
            w = FakeWrapper(
                is_cuda_graph_enabled=True, _backend="fa2", _cached_module=FakePlanner(self.tamper),
                _float_workspace_buffer=None, _int_workspace_buffer=None,
                _pin_memory_int_workspace_buffer=torch.zeros(1 << 16, dtype=torch.uint8),
                _max_total_num_rows=bs * (W if name != "draft" else 1), _qo_indptr_buf=torch.zeros(bs + 1),
                _paged_kv_indptr_buf=torch.zeros(bs + 1), _paged_kv_last_page_len_buf=torch.zeros(bs),
                _paged_kv_indices_buf=torch.zeros(1 << 16), _custom_mask_buf=None, device=torch.device("cpu"))
            w.begin_forward = partial(planner_kind, w)
            self.wrappers[key] = w
        return self.wrappers[key]

    def batch(self):
        idx = torch.tensor(self.rows)
        return SimpleNamespace(reqs=list(self.reqs), forward_mode=ForwardMode.DECODE, req_pool_indices_cpu=idx,
                               spec_info=SimpleNamespace(future_indices=idx.clone()), seq_lens=None,
                               seq_lens_cpu=None, seq_lens_sum=None)

    def step(self, hooked: bool, pending: bool):
        """One decode step; returns the batch and every plan FlashInfer made (plan_info, pinned bytes)."""
        batch = self.batch()
        self.sched.result_queue.clear()
        if pending:
            self.sched.result_queue.append((SimpleNamespace(reqs=list(self.reqs), forward_mode=ForwardMode.DECODE),
                                            None))
        if hooked:
            cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=batch), self.sched, None, None)
        self.log.clear()
        self.fm.resolve_seq_lens_cpu(batch)
        plans = []
        bs, raw = self.bucket(), len(self.rows)
        seq_cpu = None if batch.seq_lens_cpu is None else list(batch.seq_lens_cpu.tolist())

        def padded(extra, fill=1):
            return None if seq_cpu is None else torch.tensor([s + extra for s in seq_cpu] + [fill] * (bs - raw))

        # Draft decode: the runner's view (padded), the backend's common_template host indptr, fast_decode_plan.
        draft = self._draft_backend(bs, plans)
        view = SimpleNamespace(batch_size=bs, seq_lens_cpu=padded(0),
                               seq_lens_sum=None if seq_cpu is None else sum(seq_cpu) + (bs - raw))
        (partial(cert.draft_template_hook, _draft_common_template) if hooked else _draft_common_template)(
            draft, view, draft.cuda_graph_kv_indices, None)
        assert view.seq_lens_cpu is None or seq_cpu is not None  # restored to what the runner gave
        # Verify and draft extend: SGLang's own update_single_wrapper -> call_begin_forward -> fast_prefill_plan.
        for name, spec_type, extra in (("verify", SpecInputType.EAGLE_VERIFY, 0),
                                       ("draft_extend", SpecInputType.EAGLE_DRAFT_EXTEND, W)):
            w = self._wrapper(name, bs, fb.fast_prefill_plan)
            updater = _prefill_updater(bs)
            spec = _spec_info(spec_type, bs)
            dev = torch.tensor(self.device_lens() + [1] * (bs - raw)) + extra
            args = (updater, torch.zeros(bs, dtype=torch.int64), dev, padded(extra),
                    None if seq_cpu is None else int(padded(extra).sum()), None, [w], False, None, spec)
            update = fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper
            if hooked:
                cert.prefill_update_hook(update, *args, plan=None)
            else:
                update(*args, plan=None)
            plans.append((name, w._cached_module))
        return batch, plans

    def _draft_backend(self, bs, plans):
        backends = []
        for i in range(STEPS - 1):
            w = self._wrapper(f"draft{i}", bs, fast_decode_plan)
            be = SimpleNamespace(decode_cuda_graph_metadata={bs: [w]},
                                 indices_updater_decode=SimpleNamespace(data_type=torch.bfloat16),
                                 get_cuda_graph_seq_len_fill_value=lambda: 1)
            backends.append(be)
        return SimpleNamespace(attn_backends=backends, cuda_graph_kv_indices=object(), topk=1,
                               speculative_num_steps=STEPS)


def _draft_common_template(self, forward_batch, kv_indices_buffer, call_fn):
    """FlashInferMultiStepDraftBackend.common_template's host part under the draft host indptr: SGLang's
    _build_draft_indptr_host over the runner's host lengths, one fast_decode_plan per draft step."""
    indptr = fb._build_draft_indptr_host(forward_batch.seq_lens_cpu, self.topk, self.speculative_num_steps)
    for i in range(self.speculative_num_steps - 1):
        w = self.attn_backends[i].decode_cuda_graph_metadata[forward_batch.batch_size][0]
        w.begin_forward(None, None, torch.ones(forward_batch.batch_size), HQ, HKV, HD, 1,
                        global_override_indptr_cpu=indptr[i])


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                           global_override_indptr_cpu=None, **_):
    """FlashInfer 0.7.2's fast_decode_plan, tensor cores, CUDA graph, page 1 (flashinfer/decode.py
    :4929-5025): its planner call, the host indptr being the override."""
    bs = len(last_page_len)
    qo = torch.arange(bs + 1, dtype=torch.int32)
    host = global_override_indptr_cpu
    kv_lens = host[1:] - host[:-1]
    self._plan_info = self._cached_module.plan(
        self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer, qo, host,
        kv_lens, bs, bs, num_qo_heads, num_kv_heads, page_size, self.is_cuda_graph_enabled, head_dim, head_dim,
        False, -1, -1, False, 0, 0)


def _prefill_updater(bs):
    u = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    u.num_qo_heads, u.num_kv_heads, u.head_dim = HQ, HKV, HD
    u.q_data_type = u.data_type = torch.bfloat16
    u.prefill_wrapper_ragged = None
    u.kv_indptr = [torch.zeros(bs + 1, dtype=torch.int32)]
    u.qo_indptr = [torch.zeros(bs + 1, dtype=torch.int32)]
    u.kv_last_page_len = torch.ones(bs, dtype=torch.int32)
    u._swa_kv_pool = None
    u.attn_backend = SimpleNamespace(kv_index_translator=SimpleNamespace(reads_are_translated=False),
                                     get_cuda_graph_seq_len_fill_value=lambda: 1)
    return u


class StubSpecInput(SpecInput):
    """A verify / draft-extend input as far as call_begin_forward reads it (its layout tensors are the
    device side, which the planner does not read)."""

    def __init__(self, kind, bs):
        super().__init__(kind)
        self.bs, self.num_tokens_per_req, self.topk = bs, W, 1

    def generate_attn_arg_prefill(self, **_):
        z = torch.zeros(self.bs + 1, dtype=torch.int32)
        return torch.zeros(8, dtype=torch.int32), z, z.clone(), None


def _spec_info(kind, bs):
    return StubSpecInput(kind, bs)


def _accept(world, accepts):
    rows = torch.tensor(world.rows)
    world.fm.new_seq_lens_buf[rows] += torch.tensor(accepts)


def _sync_count(world):
    return sum(1 for e in world.log if e[0] == "sync")


def _plans_of_last_step(world, n_before):
    out = {}
    for (name, _bs), w in world.wrappers.items():
        calls = (w._cached_module.module if isinstance(w._cached_module, cert.PlanProbe) else w._cached_module).calls
        out[name] = calls[n_before.get(name, 0):]
    return out


def _counts(world):
    return {name: len((w._cached_module.module if isinstance(w._cached_module, cert.PlanProbe)
                       else w._cached_module).calls) for (name, _bs), w in world.wrappers.items()}


def _exact_plans(world, committed):
    """What stock SGLang plans at these committed lengths (a stock world, same bucket)."""
    stock = World(world.rows, committed)
    stock.step(hooked=False, pending=False)
    return {name: [fs.plan_call(c) for c in calls] for name, calls in _plans_of_last_step(stock, {}).items()}


def test_a_certified_step_skips_the_read_and_plans_exactly_what_stock_plans():
    rng = random.Random(1)
    world = World(rows=[3, 7], committed=[1000, 2500])
    # Step 1: no template for 2 requests yet: stock's resolve (D2H + synchronize), recorded.
    batch, _ = world.step(hooked=True, pending=False)
    assert _sync_count(world) == 1 and batch.seq_lens_cpu.tolist() == [1000, 2500]
    assert cert.ENGINE.stats.stock["no template"] == 1
    skipped = 0
    for _ in range(30):
        # The step just launched verifies: the device adds 1..W; the host has not processed it yet.
        _accept(world, [rng.randint(1, W) for _ in world.rows])
        before = _counts(world)
        batch, _ = world.step(hooked=True, pending=True)
        exact = world.device_lens()
        got = {k: [fs.plan_call(c) for c in v] for k, v in _plans_of_last_step(world, before).items()}
        assert got == _exact_plans(world, exact)  # every plan FlashInfer made is stock's
        if cert.ENGINE.step.skipped:
            skipped += 1
            assert _sync_count(world) == 0 and batch.seq_lens_cpu is None and batch.seq_lens_sum is None
            assert batch.seq_lens.tolist() == exact  # SGLang's device gather
            assert world.fm.needs_cpu_seq_lens is False
        else:
            assert _sync_count(world) == 1 and batch.seq_lens_cpu.tolist() == exact
        # The host processes the previous verify: the committed lengths catch up.
        for r, e in zip(world.reqs, exact):
            r.kv.kv_committed_len = e
            r.kv.kv_allocated_len = e + 64
    stats = cert.ENGINE.stats
    assert skipped > 15 and stats.stock["uncertain"] > 0 and stats.mismatches == 0 and stats.rescues == 0
    assert stats.checks == stats.decode_steps * (STEPS - 1 + 2) and stats.window_misses == 0


def test_the_uncertain_step_runs_stocks_resolve():
    world = World(rows=[4], committed=[126])
    world.step(hooked=True, pending=False)  # records the template
    world.reqs[0].kv.kv_committed_len = 122  # the verify window 127..130 crosses FlashInfer's 128-token chunk
    world.fm.new_seq_lens_buf[4] = 124
    batch, _ = world.step(hooked=True, pending=True)
    assert not cert.ENGINE.step.skipped and cert.ENGINE.stats.stock["uncertain"] == 1
    assert _sync_count(world) == 1 and batch.seq_lens_cpu.tolist() == [124]
    assert world.fm.needs_cpu_seq_lens is True


def test_a_wrong_prediction_is_rescued_with_the_exact_lengths(monkeypatch):
    world = World(rows=[4], committed=[122])
    world.step(hooked=True, pending=False)
    world.fm.new_seq_lens_buf[4] = 124
    cert.ENGINE.finish_step()  # (what the next decision does first) the template of one request
    monkeypatch.setattr(cert.CallTemplate, "certify", lambda self, lo, hi: True)  # a decision that was wrong,
    for c in cert.ENGINE.templates[1].calls:  # from a template that predicts other rows than the calls get
        c.offset += 1
    before = _counts(world)
    batch, _ = world.step(hooked=True, pending=True)
    assert cert.ENGINE.step.skipped and _sync_count(world) == 0
    got = {k: [fs.plan_call(c) for c in v] for k, v in _plans_of_last_step(world, before).items()}
    assert got == _exact_plans(world, [124])  # the verify's plan was made from the exact lengths
    assert cert.ENGINE.stats.rescues >= 1 and cert.ENGINE.step.exact == [124]


def test_a_self_check_mismatch_turns_the_slot_off():
    def tamper(m):
        return fs.PrefillPlanModel(**{**m.__dict__, "cta_tile_q": m.cta_tile_q * 2})

    world = World(rows=[4], committed=[500], tamper=tamper)
    world.step(hooked=True, pending=False)
    assert cert.ENGINE.stats.mismatches > 0 and cert.ENGINE.disabled == "self-check mismatch"
    world.step(hooked=True, pending=True)
    assert cert.ENGINE.stats.stock["off"] == 1 and _sync_count(world) == 1


def test_a_window_miss_in_a_stock_step_turns_the_slot_off():
    world = World(rows=[4], committed=[126])
    world.step(hooked=True, pending=False)
    world.fm.new_seq_lens_buf[4] = 140  # a device length the host's bookkeeping cannot explain
    world.reqs[0].kv.kv_committed_len = 122  # window 123..126: uncertain (crosses a chunk), so stock's step
    world.step(hooked=True, pending=True)
    assert cert.ENGINE.stats.stock["uncertain"] == 1
    assert cert.ENGINE.stats.window_misses == 1 and cert.ENGINE.disabled.startswith("window miss")


@pytest.mark.parametrize("case, want", [
    ("mixed", "mixed chunked prefill"), ("switches_off", "SGLang's FlashInfer host plans are off"),
    ("mrope", "an M-RoPE"), ("triton_draft", "a draft backend other than"), ("topk", "topk > 1"),
])
def test_runtime_rules_keep_stocks_resolve(case, want, monkeypatch):
    fm, log = _future_map()
    sched = _scheduler(fm)
    if case == "mixed":
        sched.server_args.enable_mixed_chunk = True
    elif case == "switches_off":
        monkeypatch.delenv("SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR")
    elif case == "mrope":
        sched.tp_worker.model_runner.model_config.model_is_mrope = True
    elif case == "triton_draft":
        target, _, extend = sched.draft_worker.spec_v2_attn_backends
        sched.draft_worker.spec_v2_attn_backends = (target, SimpleNamespace(), extend)
    else:
        sched.server_args.speculative_eagle_topk = 4
    batch = World([4], [100]).batch()
    cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=batch), sched, None, None)
    assert cert.ENGINE.reason.startswith(want) and cert.ENGINE.step is None
    assert fm.needs_cpu_seq_lens is True


def test_a_decision_that_raises_is_logged_and_leaves_stocks_resolve(monkeypatch):
    world = World(rows=[4], committed=[100])
    monkeypatch.setattr(cert, "step_window", lambda *a: 1 / 0)
    batch = world.batch()
    plan = cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=batch), world.sched, None, None)
    assert plan.batch_to_run is batch and world.fm.needs_cpu_seq_lens is True
    assert cert.ENGINE.disabled.startswith("decision raised ZeroDivisionError")


def test_prefill_and_idle_batches_are_untouched():
    world = World(rows=[4], committed=[100])
    batch = world.batch()
    batch.forward_mode = ForwardMode.EXTEND
    cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=batch), world.sched, None, None)
    assert cert.ENGINE.step is None and world.fm.needs_cpu_seq_lens is True
    cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=None), world.sched, None, None)
    assert cert.ENGINE.step is None


def test_a_template_whose_wrappers_are_gone_is_recorded_again():
    world = World(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)
    cert.ENGINE.finish_step()
    assert 1 in cert.ENGINE.templates
    world.wrappers.clear()  # the graphs were captured again: new wrappers, the old ones collected
    import gc

    gc.collect()
    world.step(hooked=True, pending=True)
    assert cert.ENGINE.stats.stock["no template"] == 2 and cert.ENGINE.step.recording is not None


def test_the_self_check_runs_on_every_call_then_on_every_eighth():
    world = World(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)
    assert cert.ENGINE.stats.checks == cert.ENGINE.stats.plans == STEPS - 1 + 2
    cert.ENGINE.stats.plans = cert.CHECK_ALL
    for _ in range(4):
        world.step(hooked=True, pending=False)
    assert cert.ENGINE.stats.checks == STEPS - 1 + 2 + 16 // cert.CHECK_EVERY


def test_the_log_line_is_what_the_e2e_benchmark_reads():
    import re

    line = cert.Stats(checks=12, mismatches=0, decode_steps=9, skipped=7, stock=collections.Counter(uncertain=2)).line()
    assert re.search(r"(\d+) checks, (\d+) mismatches; (\d+) of (\d+) decode steps skipped", line), line


def test_the_hooks_go_in_through_sglangs_hook_registry():
    """load_plugins() with the slot and what it requires: applied, and the updater method SGLang binds
    in __init__ (``self.update = self.update_single_wrapper``) is the hooked one."""
    from helpers import out, run_python

    proc = run_python("""
    import inspect, json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()
    runtime.startup_check(rt)
    import sglang.srt.layers.attention.flashinfer_backend as fb
    from sglang.srt.managers.scheduler import Scheduler
    u = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    print("RESULT" + json.dumps({
        "status": rt.state.statuses["flashinfer_certified_plan"].status.value,
        "hooked": [hasattr(f, "__wrapped__") for f in (fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper,
                   fb.FlashInferMultiStepDraftBackend.common_template, Scheduler.get_next_batch_to_run)],
        "bound": u.update_single_wrapper.__func__ is fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper,
        "binds_in_init": "self.update = self.update_single_wrapper" in inspect.getsource(
            fb.FlashInferIndicesUpdaterPrefill.__init__),
    }))
    """, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
        SGLANG_HOSTSYNC_SLOTS="default,flashinfer_verify_host_plan,flashinfer_draft_host_indptr,"
                              "flashinfer_certified_plan")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"status": "applied", "hooked": [True, True, True], "bound": True, "binds_in_init": True}, res


# ---------------------------------------------------------------------------
# 4. Exact-length consumers: the draft extend's prefix lengths come from the device lengths
# ---------------------------------------------------------------------------
def test_the_draft_extend_of_a_skipped_step_reads_device_lengths(ewc):
    """SGLang's real prepare_for_draft_extend: with the host lengths (stock) and without them (a skipped
    step, SGLang's device-length branch) the prefix lengths, positions and start offsets are the same."""
    from test_draft_extend_fused_layout import _case, _run

    rng = random.Random(4)
    for bs in (1, 3, 8):
        stock_case = _case(rng, bs, W, torch.int64)
        skipped_case = (SimpleNamespace(**{**vars(stock_case[0]), "seq_lens_cpu": None}),) + stock_case[1:]
        a, b = _run(ewc.prepare_for_draft_extend, stock_case, W), _run(ewc.prepare_for_draft_extend, skipped_case, W)
        assert torch.equal(torch.as_tensor(a.extend_prefix_lens), torch.as_tensor(b.extend_prefix_lens))
        assert torch.equal(a.positions, b.positions) and torch.equal(a.extend_start_loc, b.extend_start_loc)
        assert torch.equal(a.seq_lens, b.seq_lens) and b.seq_lens_cpu is None


from test_draft_extend_fused_layout import ewc  # noqa: E402,F401 (fixture)
