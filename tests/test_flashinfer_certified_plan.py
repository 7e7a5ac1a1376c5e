"""Slot ``flashinfer_certified_plan`` (not registered) on the CPU.

- Registration: not in the catalogue; ``write_cert_dist`` registers its ``SLOT`` through the third-party
  entry-point group, which is how the GPU test and the hook-registry test here select it; it requires
  ``flashinfer_plan_guard``.
- The window: a simulation of SGLang's overlap loop (``event_loop_overlap``'s order, SGLang's own
  ``page_aligned_decode_alloc_lens`` for the reserve, real ``Req`` objects whose results go through
  SGLang's own ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens``) never finds a device length
  outside the slot's window, nor a window past the allocated KV, at page sizes 1, 16 and 64; three wrong
  windows (lag ignored, one token short, page-rounded) are each caught by the same search. Skipped steps
  check their window without a wait (a pinned copy and an event, read at a later decision).
- The certificate: on random planner calls the port's key is equal exactly where the full plan is, and
  a certified window plans every length in it as its ``hi``; a weaker certificate (the chunk size alone)
  is caught. Hand-derived from the C++ (not from the port): the keys of a few calls, and a planner that
  plans bs-1 calls from the C++ read by hand, which a World runs through the slot (the slot's
  self-check then compares the port with it, and every skipped step must plan what it plans at the
  exact lengths).
- The hook path on SGLang's objects: the real ``FutureMap`` resolve (stock's D2H + synchronize where the
  window is uncertain, SGLang's GPU-only branch where it is certified), SGLang's real
  ``update_single_wrapper`` / ``call_begin_forward`` / ``fast_prefill_plan`` and
  ``_build_draft_indptr_host`` up to the planner, a stand-in FlashInfer planner (the port, writing its
  plan into the pinned buffer as PrefillPlanImpl does): a skipped step hands FlashInfer exactly the
  plans the stock step with the exact lengths does; a wrong prediction is rescued; a self-check
  mismatch or a window miss turns the slot off; an error in the watch plans the call as it came,
  without a read-back; the per-batch-size back-off; the step ends after its draft extend (a recapture
  between steps sees none); forward-pass metrics under STANDALONE keep stock's read (SGLang's own
  ``_build_scheduled_request_metrics`` raises without ``seq_lens_cpu``).
- The draft extend's prefix lengths and positions in a skipped step come from the device lengths
  (SGLang's real ``prepare_for_draft_extend``), the same as stock's.
- The log line goes through the e2e benchmark's own collector (``Server.slot_checks``).

The GPU side (the port against FlashInfer's planner, a real server's outputs and syncs under the
real-traffic mix) is tests/test_gpu_flashinfer_certified_plan.py.
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
# The slot through the third-party entry-point group (registry.SLOT_ENTRY_POINT_GROUP): a package that
# returns the module's SLOT. Put the folder write_cert_dist wrote on PYTHONPATH (tests/test_gpu_...: the e2e).
def write_cert_dist(root) -> str:
    from helpers import write_slot_dist

    return write_slot_dist(root, "flashinfer_certified_plan", "hostsync_cert_slot")


def test_not_registered_opt_in_requires_the_plan_guard_and_checks():
    """Registration waits on the GPU tests (docs/slots.md "Designed, not registered")."""
    from sglang_hostsync_plugin import config

    assert cert.NAME not in registry.catalogue()
    s = cert.SLOT
    assert not s.default and s.presets == () and "not registered" in s.summary
    assert s.requires == ("flashinfer_plan_guard",)
    assert check_slot(s) is None
    catalogue = {**registry.catalogue(), cert.NAME: s}
    with pytest.raises(config.HostsyncConfigError, match="requires slot 'flashinfer_plan_guard'"):
        config.parse_slot_spec("default,-flashinfer_plan_guard,flashinfer,flashinfer_certified_plan", catalogue)
    assert cert.NAME in config.parse_slot_spec("default,flashinfer,flashinfer_certified_plan", catalogue).names


def test_the_plan_guard_acts_wherever_the_slot_does():
    """At EAGLE topk 1 on FlashInfer the guard is inert unless a slot that requires it acts (or the user's
    own SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN): with this slot selected, without the switch slots and
    without that variable, the guard acts."""
    from sglang_hostsync_plugin.plan import inert_reasons

    catalogue = {**registry.catalogue(), cert.NAME: cert.SLOT}
    facts = _facts(env={})
    alone = inert_reasons(catalogue, facts, {"flashinfer_plan_guard"})
    assert alone["flashinfer_plan_guard"] is not None and "topk is 1" in alone["flashinfer_plan_guard"]
    both = inert_reasons(catalogue, facts, {"flashinfer_plan_guard", cert.NAME})
    assert both[cert.NAME] is None and both["flashinfer_plan_guard"] is None


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
# 1. The window never undershoots (SGLang's loop order, its allocation reserve, its result processing)
# ---------------------------------------------------------------------------
def _req(committed):
    return SimpleNamespace(kv=ReqKvInfo(kv_committed_len=committed, kv_allocated_len=committed), finished=False)


def _result_processor():
    """SGLang's SchedulerBatchResultProcessor with what ``_resolve_spec_v2_tokens`` calls besides the
    requests: no metrics snapshot, no adaptive-steps controller."""
    import dataclasses

    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    kw = {f.name: None for f in dataclasses.fields(SchedulerBatchResultProcessor)}
    kw.update(metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=lambda batch, result: None),
              model_worker=SimpleNamespace(on_verify_complete_cpu=lambda *a, **k: None))
    return SchedulerBatchResultProcessor(**kw)


def _real_req(rng, n):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    r = Req(f"r{n}", "", [rng.randint(3, 1000) for _ in range(rng.randint(1, 3000))],
            SamplingParams(max_new_tokens=1 << 20))
    # SGLang's extend allocation (mem_cache/allocation.py alloc_for_extend): both lengths = seq_len.
    r.kv.kv_committed_len = r.kv.kv_allocated_len = len(r.origin_input_ids)
    return r


def find_undershoot(window_fn, *, seed: int, page_size: int, steps: int = 400):
    """Run SGLang's overlap loop in miniature and return the first (step, request, lo, real, hi,
    allocated) where ``window_fn`` misses the device length or passes the allocated KV, else None.

    Each iteration, as ``Scheduler.event_loop_overlap``: pick the batch (finished requests filtered,
    new ones merged after their prefill), ``eagle_prepare_for_decode``'s allocation (SGLang's
    ``page_aligned_decode_alloc_lens`` with the reserve of ``get_alloc_reserve_per_decode``: 2 * W at
    topk 1), the decision, ``run_batch`` (a prefill publishes ``batch.seq_lens``, as
    ``EAGLEWorkerV2._forward_prefill_batch`` does; a decode adds the accepted 1..W on the device), then
    the previous batch's result through SGLang's own ``_resolve_spec_v2_tokens`` (real ``Req``
    objects: the accepted run added to ``kv_committed_len``, nothing for a request that finished while
    its batch ran); sometimes that result is processed before the run (``disable_overlap_for_batch``),
    sometimes the step is a prefill of new requests, sometimes a request is aborted."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from sglang.srt.managers.utils import GenerationBatchResult

    rng = random.Random(seed)
    proc = _result_processor()
    device: dict[int, int] = {}
    running: list = []
    queue: collections.deque = collections.deque()
    last = None
    made = itertools.count()

    def process():
        batch, accepted = queue.popleft()
        if not batch.forward_mode.is_decode():
            return  # a prefill's result changes no committed length (no mixed chunk here)
        ids = torch.zeros(len(batch.reqs) * W, dtype=torch.int64)
        lens = torch.tensor([accepted[id(r)] for r in batch.reqs])
        result = GenerationBatchResult(next_token_ids=ids, accept_lens=lens, speculative_num_draft_tokens=W)
        proc._resolve_spec_v2_tokens(result, SimpleNamespace(reqs=batch.reqs, forward_mode=batch.forward_mode,
                                                             has_grammar=False))
        for r in batch.reqs:
            if rng.random() < 0.05:
                r.finished_reason = FINISH_ABORT()

    for step in range(steps):
        running = [r for r in running if not r.finished()]
        if last is not None and last.forward_mode == ForwardMode.EXTEND:
            running += last.reqs  # merge_batch of the last prefill
        prefill = not running or rng.random() < 0.1
        if prefill:
            new = [_real_req(rng, next(made)) for _ in range(rng.randint(1, 3))]
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
    assert cert.request_window(100, 103, "decode", W) is None  # past the allocated KV: stock's resolve
    pending = [SimpleNamespace(reqs=[], forward_mode=ForwardMode.DECODE)] * 2
    assert cert.step_window([_req(5)], pending, W) is None  # two batches unprocessed: never under overlap
    r = _req(5)
    r.kv.kv_allocated_len = 100
    # The one unprocessed batch: a decode (1..W accepted), a plain prefill (exact), anything else: stock's.
    for mode, want in ((ForwardMode.DECODE, ([6], [9])), (ForwardMode.EXTEND, ([5], [5])), (ForwardMode.MIXED, None),
                       (ForwardMode.IDLE, None)):
        assert cert.step_window([r], [SimpleNamespace(reqs=[r], forward_mode=mode)], W) == want, mode


def test_a_plain_prefill_publishes_the_committed_length():
    """EAGLEWorkerV2._forward_prefill_batch publishes ``batch.seq_lens`` as the new lengths, the lengths
    SGLang's extend allocation wrote into ``kv_committed_len``: the window after it is [c, c]."""
    from sglang.srt.mem_cache import allocation
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    src = inspect.getsource(EAGLEWorkerV2._forward_prefill_batch)
    assert "batch_output.new_seq_lens = batch.seq_lens" in src
    alloc = inspect.getsource(allocation)
    assert "req.kv.kv_allocated_len = seq_len\n        req.kv.kv_committed_len = seq_len" in alloc
    r = _req(700)
    assert cert.step_window([r], [SimpleNamespace(reqs=[r], forward_mode=ForwardMode.EXTEND)], W) == ([700], [700])


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
                           speculative_num_draft_tokens=W, speculative_num_steps=STEPS)
    runner = SimpleNamespace(model_config=SimpleNamespace(model_is_mrope=False, is_encoder_decoder=False))
    return SimpleNamespace(future_map=fm, server_args=args, enable_overlap=True, result_queue=collections.deque(),
                           enable_fpm=False, spec_algorithm=SpeculativeAlgorithm.EAGLE,
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

    def __init__(self, rows, committed, tamper=None, planner=None, slot=cert, topk=1):
        self.slot = slot  # the slot module whose hooks a hooked step runs
        self.topk = topk  # the draft decode plans topk rows per request
        self.fm, self.log = _future_map()
        self.sched = _scheduler(self.fm)
        self.sched.server_args.speculative_eagle_topk = topk
        self.rows = rows
        self.reqs = [_req(c) for c in committed]
        for r in self.reqs:
            r.kv.kv_allocated_len = r.kv.kv_committed_len + 64
        self.fm.new_seq_lens_buf[torch.tensor(rows)] = torch.tensor(committed)
        self.tamper = tamper
        self.planner = planner or (lambda: FakePlanner(self.tamper))
        self.wrappers: dict = {}

    def device_lens(self):
        return [int(x) for x in self.fm.new_seq_lens_buf[torch.tensor(self.rows)]]

    def bucket(self):
        return next(b for b in BUCKETS if b >= len(self.rows))

    def _wrapper(self, name, bs, planner_kind):
        key = (name, bs)
        if key not in self.wrappers:
            w = FakeWrapper(
                is_cuda_graph_enabled=True, _backend="fa2", _cached_module=self.planner(),
                _float_workspace_buffer=None, _int_workspace_buffer=None,
                _pin_memory_int_workspace_buffer=torch.zeros(1 << 16, dtype=torch.uint8),
                _max_total_num_rows=bs * (W if name != "draft" else 1),
                _qo_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32),
                _paged_kv_indptr_buf=torch.zeros(self.rows_of(name, bs) + 1, dtype=torch.int32),
                _paged_kv_last_page_len_buf=torch.zeros(bs),
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
            self.slot.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=batch), self.sched, None, None)
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
                               seq_lens_sum=None if seq_cpu is None else sum(seq_cpu) + (bs - raw),
                               seq_lens=torch.tensor(self.device_lens() + [1] * (bs - raw)))
        (partial(self.slot.draft_template_hook, _draft_common_template) if hooked else _draft_common_template)(
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
                self.slot.prefill_update_hook(update, *args, plan=None)
            else:
                update(*args, plan=None)
            plans.append((name, w._cached_module))
        return batch, plans

    def rows_of(self, name, bs):
        """A wrapper's planner rows: the draft decode's are topk per request."""
        return bs * self.topk if name.startswith("draft") and name != "draft_extend" else bs

    def _draft_backend(self, bs, plans):
        backends = []
        for i in range(STEPS - 1):
            w = self._wrapper(f"draft{i}", bs, fast_decode_plan)
            be = SimpleNamespace(decode_cuda_graph_metadata={bs: [w]},
                                 indices_updater_decode=SimpleNamespace(data_type=torch.bfloat16),
                                 get_cuda_graph_seq_len_fill_value=lambda: 1)
            backends.append(be)
        return SimpleNamespace(attn_backends=backends, cuda_graph_kv_indices=object(), topk=self.topk,
                               speculative_num_steps=STEPS)


def _draft_common_template(self, forward_batch, kv_indices_buffer, call_fn):
    """FlashInferMultiStepDraftBackend.common_template's host part under the draft host indptr: SGLang's
    _build_draft_indptr_host over the runner's host lengths, one fast_decode_plan per draft step. Its kernel's
    part: each step's wrapper's device indptr (the buffer FlashInfer's kernels read) from the device lengths."""
    indptr = fb._build_draft_indptr_host(forward_batch.seq_lens_cpu, self.topk, self.speculative_num_steps)
    on_device = fb._build_draft_indptr_host(forward_batch.seq_lens, self.topk, self.speculative_num_steps)
    for i in range(self.speculative_num_steps - 1):
        w = self.attn_backends[i].decode_cuda_graph_metadata[forward_batch.batch_size][0]
        w._paged_kv_indptr_buf.copy_(on_device[i])
        w.begin_forward(None, None, torch.ones(forward_batch.batch_size * self.topk), HQ, HKV, HD, 1,
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

    def generate_attn_arg_prefill(self, paged_kernel_lens, **_):
        """The device layout: a verify's KV is the committed length plus its draft tokens."""
        extra = self.num_tokens_per_req if self.spec_input_type == SpecInputType.EAGLE_VERIFY else 0
        kv = torch.zeros(self.bs + 1, dtype=torch.int32)
        kv[1:] = torch.cumsum(paged_kernel_lens + extra, dim=0)
        qo = torch.arange(0, (self.bs + 1) * self.num_tokens_per_req, self.num_tokens_per_req, dtype=torch.int32)
        return torch.zeros(8, dtype=torch.int32), kv, qo, None


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
    stock = World(world.rows, committed, topk=world.topk)
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
        if cert.ENGINE.last_step.skipped:
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
    assert not cert.ENGINE.last_step.skipped and cert.ENGINE.stats.stock["uncertain"] == 1
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
    assert cert.ENGINE.last_step.skipped and _sync_count(world) == 0
    got = {k: [fs.plan_call(c) for c in v] for k, v in _plans_of_last_step(world, before).items()}
    assert got == _exact_plans(world, [124])  # the verify's plan was made from the exact lengths
    assert cert.ENGINE.stats.rescues >= 1 and cert.ENGINE.last_step.exact == [124]


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


def _catch_up(world, exact=None):
    """The host processes the previous verify: the committed lengths catch up with the device's."""
    for r, e in zip(world.reqs, exact or world.device_lens()):
        r.kv.kv_committed_len = e
        r.kv.kv_allocated_len = e + 64


class CopyEvent:
    """A CUDA event behind a window copy, as the host sees it: ``query()`` False until the test fires it;
    any wait fails the test."""

    made: list = []

    def __init__(self):
        self.fired = False
        CopyEvent.made.append(self)

    def record(self, stream=None):
        self.fired = False  # recorded again (a recycled event): pending until the test fires it

    def query(self):
        return self.fired

    def synchronize(self):
        raise AssertionError("the host waited on a window copy")

    wait = synchronize


def _skipped_step(world, accepts):
    _accept(world, accepts)
    batch, _ = world.step(hooked=True, pending=True)
    assert cert.ENGINE.last_step.skipped, cert.ENGINE.stats.stock
    return batch


def test_a_skipped_steps_window_is_checked_at_a_later_decision_without_a_wait(monkeypatch):
    CopyEvent.made = []
    monkeypatch.setattr(cert.ENGINE, "make_event", CopyEvent)
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.step(hooked=True, pending=False)  # the template; a stock step checks its window with its own read
    assert cert.ENGINE.stats.window_checks == 1
    _skipped_step(world, [2, 3])
    assert _sync_count(world) == 0 and len(cert.ENGINE.copies) == 1 and len(CopyEvent.made) == 1
    copy = cert.ENGINE.copies[0]
    assert copy.buf[:2].tolist() == world.device_lens() and (copy.lo, copy.hi) == ([1001, 2501], [1004, 2504])
    _catch_up(world)
    _skipped_step(world, [1, 1])  # the first copy still in flight: the decision does not wait for it
    assert len(cert.ENGINE.copies) == 2 and cert.ENGINE.stats.window_checks == 1
    CopyEvent.made[0].fired = True
    _catch_up(world)
    _skipped_step(world, [4, 4])  # now read: the window held
    assert cert.ENGINE.stats.window_checks == 2 and cert.ENGINE.stats.window_misses == 0
    assert len(cert.ENGINE.copies) == 2 and len(cert.ENGINE.spare) == 0  # (its buffer went to the new copy)
    # A device length the host's bookkeeping cannot explain, in a skipped step: caught one decision later.
    for e in CopyEvent.made:
        e.fired = True
    _catch_up(world)
    world.fm.new_seq_lens_buf[torch.tensor(world.rows)] += torch.tensor([9, 1])  # 9 > W accepted
    _skipped_step(world, [0, 0])
    assert cert.ENGINE.stats.window_misses == 0 and cert.ENGINE.disabled is None
    _catch_up(world)
    cert.ENGINE.copies[-1].event.fired = True  # (a recycled event: record() set it pending again)
    world.step(hooked=True, pending=False)  # (its own window [c, c] holds: the miss is the copy's)
    assert cert.ENGINE.stats.window_misses == 1 and cert.ENGINE.disabled.startswith("window miss")
    assert cert.ENGINE.stats.stock["off"] == 1


def test_at_most_window_depth_copies_in_flight(monkeypatch):
    CopyEvent.made = []
    monkeypatch.setattr(cert.ENGINE, "make_event", CopyEvent)
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.step(hooked=True, pending=False)
    for _ in range(cert.WINDOW_DEPTH + 2):
        _skipped_step(world, [1, 1])
        _catch_up(world)
    assert len(cert.ENGINE.copies) == cert.WINDOW_DEPTH and cert.ENGINE.stats.window_unchecked == 2
    # Read copies give their events back: later skipped steps record those, no new event per step.
    for e in CopyEvent.made:
        e.fired = True
    made = len(CopyEvent.made)
    for _ in range(3):
        _skipped_step(world, [1, 1])
        _catch_up(world)
        for e in CopyEvent.made:
            e.fired = True
    assert len(CopyEvent.made) == made == cert.WINDOW_DEPTH


def test_forward_pass_metrics_under_standalone_keep_stocks_read():
    """--enable-forward-pass-metrics: SGLang's _build_scheduled_request_metrics iterates seq_lens_cpu of
    every decode batch without a spec-decode snapshot, and STANDALONE's results have none
    (_SPEC_DECODE_SNAPSHOT_ALGORITHMS). A skipped step's batch (seq_lens_cpu None) would raise there."""
    from sglang.srt.managers.scheduler_components import metrics_reporter as mr

    reporter = object.__new__(mr.SchedulerMetricsReporter)
    assert SpeculativeAlgorithm.STANDALONE not in mr._SPEC_DECODE_SNAPSHOT_ALGORITHMS
    # What the rule prevents: the same batches under EAGLE (which has the snapshot) skip the read, and
    # SGLang's metrics without a snapshot raise on them.
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.sched.enable_fpm = True
    world.step(hooked=True, pending=False)
    batch = _skipped_step(world, [2, 3])
    with pytest.raises(TypeError):
        mr.SchedulerMetricsReporter._build_scheduled_request_metrics(reporter, batch, None)
    # STANDALONE with the metrics on: stock's read every step, SGLang's metrics build on every batch.
    cert.ENGINE.reset()
    cert.ENGINE.device = fs.H100
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.sched.enable_fpm, world.sched.spec_algorithm = True, SpeculativeAlgorithm.STANDALONE
    for i in range(6):
        _accept(world, [2, 3])
        batch, _ = world.step(hooked=True, pending=i > 0)
        metrics = mr.SchedulerMetricsReporter._build_scheduled_request_metrics(reporter, batch, None)
        assert metrics.num_decode_requests == 2
        _catch_up(world)
    assert cert.ENGINE.reason.startswith("forward-pass metrics under STANDALONE")
    assert cert.ENGINE.stats.skipped == 0 and _sync_count(world) == 1
    # Without the metrics STANDALONE skips as EAGLE does.
    cert.ENGINE.reset()
    cert.ENGINE.device = fs.H100
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.sched.spec_algorithm = SpeculativeAlgorithm.STANDALONE
    world.step(hooked=True, pending=False)
    _skipped_step(world, [2, 3])


def test_the_backoff_stops_computing_keys_where_nothing_certifies(monkeypatch):
    """After BACKOFF_AFTER uncertain decisions at one batch size no key is computed there for
    BACKOFF_FIRST decisions, then one is tried; a certified one ends the back-off."""
    world = World(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)  # the template (bs 1)
    tried = []
    verdict = [False]
    monkeypatch.setattr(cert.CallTemplate, "certify", lambda self, lo, hi: tried.append(1) or verdict[0])

    def decide():
        cert.next_batch_hook(lambda s, rb, lb: SimpleNamespace(batch_to_run=world.batch()), world.sched, None, None)

    for _ in range(cert.BACKOFF_AFTER):
        decide()
    assert len(tried) == cert.BACKOFF_AFTER and cert.ENGINE.stats.backoffs == 1
    for _ in range(cert.BACKOFF_FIRST):
        decide()
    assert len(tried) == cert.BACKOFF_AFTER and cert.ENGINE.stats.stock["back-off"] == cert.BACKOFF_FIRST
    decide()  # one try after the pause; uncertain again: the next pause is twice as long
    assert len(tried) == cert.BACKOFF_AFTER + 1 and cert.ENGINE.backoff[1].skip == 2 * cert.BACKOFF_FIRST
    assert cert.ENGINE.stats.backoffs == 2
    cert.ENGINE.backoff[1].skip = 0
    verdict[0] = True
    decide()
    assert cert.ENGINE.last_step.skipped and 1 not in cert.ENGINE.backoff
    # The pause doubles up to BACKOFF_MAX.
    for _ in range(cert.BACKOFF_AFTER):
        cert.ENGINE._uncertain(2)
    pauses = [cert.ENGINE.backoff[2].skip]
    for _ in range(8):  # each try after a pause that is uncertain again
        cert.ENGINE.backoff[2].skip = 0
        cert.ENGINE._uncertain(2)
        pauses.append(cert.ENGINE.backoff[2].skip)
    assert pauses == [16, 32, 64, 128, 256, 512, 1024, 1024, 1024] and cert.BACKOFF_MAX == 1024


def test_the_step_ends_after_its_draft_extend_so_a_recapture_between_steps_sees_none():
    """A weight update with recapture_cuda_graph runs between two steps (process_input_requests, before
    the next decision): SGLang's capture plans its fresh wrappers through update_single_wrapper with its
    own host lengths. It must see no step: not a skipped step's lengths, not a recording step's site."""
    world = World(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)  # a stock step that records the template
    assert cert.ENGINE.step is None and cert.ENGINE.ended.recording is not None
    seen = []

    def update(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, *rest, plan):
        seen.append((seq_lens_cpu, seq_lens_sum))

    capture = FakeWrapper(is_cuda_graph_enabled=True, begin_forward=lambda *a, **k: None)  # plan(), not fast
    host = torch.tensor([1])
    cert.prefill_update_hook(update, _prefill_updater(1), torch.zeros(1, dtype=torch.int64), torch.ones(1), host, 1,
                             None, [capture], False, None, _spec_info(SpecInputType.EAGLE_VERIFY, 1), plan=None)
    assert seen == [(host, 1)]
    world.step(hooked=True, pending=False)  # the next decision: the recorded step became a template
    assert 1 in cert.ENGINE.templates and cert.ENGINE.stats.stock["no template"] == 1


def test_an_error_in_the_watch_plans_the_call_as_it_came_without_a_read_back(monkeypatch):
    world = World(rows=[3, 7], committed=[1000, 2500])
    world.step(hooked=True, pending=False)
    _accept(world, [2, 3])
    monkeypatch.setattr(cert.Engine, "_certified", lambda *a: 1 / 0)

    def no_read(self, step):
        if step.skipped:
            raise AssertionError("a blocking read-back in the forward")
        return orig_exact(self, step)

    orig_exact = cert.Engine.exact
    monkeypatch.setattr(cert.Engine, "exact", no_read)
    before = _counts(world)
    world.step(hooked=True, pending=True)
    step = cert.ENGINE.last_step
    assert step.skipped and _sync_count(world) == 0 and cert.ENGINE.stats.rescues == 0
    assert cert.ENGINE.disabled.startswith("the planner watch raised ZeroDivisionError")
    got = {k: [fs.plan_call(c) for c in v] for k, v in _plans_of_last_step(world, before).items()}
    assert got == _exact_plans(world, step.hi)  # every call planned with the arguments it came with (hi)


# ---------------------------------------------------------------------------
# A planner that is not the port: bs-1 plans derived by hand from FlashInfer 0.7.2's C++
# ---------------------------------------------------------------------------
class HandPlanner(FakePlanner):
    """FlashInfer's fa2 prefill planner for the calls of a bs-1 World (32/8 heads, head_dim 128, page 1,
    CUDA graph, H100), from scheduler.cuh / utils.cuh read by hand, not from flashinfer_split:

    - :603 max_seq_len = total_num_rows - bs + 1 = total_num_rows (1 for the draft, W = 4 for the
      verify and the draft extend): packed at most 4 * 4 = 16 rows, so utils.cuh:411 gives cta_tile_q
      16 on cc 9 (16*128*2 + 256*16*4*2 = 36864 bytes <= 232448); one q tile per request.
    - :611 total_num_tiles_q = ceil(total_num_rows*4/16) + 0 = 1; :672 padded = max(33, 1) = 33, the
      split budget 2*132 // 8 = 33 (:788-791).
    - :101-130 the chunk: min 128 (:579, page 1); one q tile, so 128 fits while ceil(kv/128) <= 33, i.e.
      kv <= 4224: chunk 128, split (CUDA graph), n = ceil(kv/128) chunks (kv 0 counts as 1).
    - written (:855-928): request_indices n zeros, qo_tile_indices n zeros, kv_tile_indices 0..n-1,
      merge_indptr n per query row, o_indptr [0, q*n], kv_chunk_size 128, total_num_rows_h = q,
      block_valid_mask n ones then zeros up to 33."""

    def plan(self, *args):
        qo, kv = [int(x) for x in args[3].tolist()], [int(x) for x in args[4].tolist()]
        rows, bs = int(args[6]), int(args[7])
        assert bs == 1 and tuple(int(a) for a in args[8:11]) == (HQ, HKV, 1) and bool(args[11])
        assert (int(args[12]), int(args[13]), int(args[15]), int(args[16]), bool(args[17])) == (HD, HD, -1, -1, False)
        q, n_kv = qo[1] - qo[0], kv[1] - kv[0]
        assert q * (HQ // HKV) <= 16 and rows * (HQ // HKV) <= 16 and n_kv <= 33 * 128, (q, rows, n_kv)
        n = -(-max(n_kv, 1) // 128)
        self.calls.append((q, n))
        hand = SimpleNamespace(padded_batch_size=33, cta_tile_q=16, split_kv=True, new_batch_size=n, qo_rows=q,
                               request_indices=[0] * n, qo_tile_indices=[0] * n, kv_tile_indices=list(range(n)),
                               o_indptr=[0, q * n], kv_chunk_size_written=128, merge_indptr=[n * i for i in range(q + 1)])
        return write_plan(hand, SimpleNamespace(batch_size=1, total_num_rows=rows, enable_cuda_graph=True), args[2])


def test_hand_derived_keys_from_the_cpp():
    """SplitSite.key against chunk sizes and counts worked out from scheduler.cuh by hand
    (tests/test_flashinfer_split_model.py's cases), not from the port."""
    verify2 = fs.PlannerCall((0, 4, 8), (0,) * 3, 8, 2, HQ, HKV, 1, True, HD, HD, True, -1, -1, False, 0, 0)
    site = fs.SplitSite(verify2)
    # bs 2, 4 tokens each, gqa 4: 2 * ceil(4000/250) = 32 <= 33 and 2 * ceil(4000/249) = 34 > 33.
    assert site.key([4000, 4000]) == (True, 250, 16, 16)
    assert site.key([4001, 4000]) == (True, 250, 17, 16)  # 17 + 16 = 33 still fits
    assert site.key([4001, 4001]) == (True, 251, 16, 16)  # 34 > 33: the chunk moves
    verify1 = fs.PlannerCall((0, 4), (0, 0), 4, 1, HQ, HKV, 1, True, HD, HD, True, -1, -1, False, 0, 0)
    one = cert.CallTemplate(None, verify1, 0, (), fs.SplitSite(verify1))
    assert one.certify([105], [108]) and not one.certify([127], [130]) and one.certify([129], [132])


def test_skipped_steps_plan_what_a_hand_derived_planner_plans_at_the_exact_lengths():
    """The World with HandPlanner in FlashInfer's place: the slot's self-check compares the port with it on
    every call (no mismatch), and every step, skipped or not, hands it calls that it plans exactly as
    the stock step at the exact lengths (chunk counts from the C++, not the port)."""
    rng = random.Random(8)
    world = World(rows=[4], committed=[100], planner=HandPlanner)
    world.step(hooked=True, pending=False)
    skipped = uncertain = 0
    for _ in range(150):
        _accept(world, [rng.randint(1, W)])
        before = _counts(world)
        world.step(hooked=True, pending=True)
        exact = world.device_lens()
        got = _plans_of_last_step(world, before)
        stock = World(world.rows, exact, planner=HandPlanner)
        stock.step(hooked=False, pending=False)
        assert got == _plans_of_last_step(stock, {}), (exact, cert.ENGINE.last_step.skipped)
        skipped += cert.ENGINE.last_step.skipped
        _catch_up(world, exact)
    stats = cert.ENGINE.stats
    uncertain = stats.stock["uncertain"]
    assert stats.checks == stats.plans > 200 and stats.mismatches == 0 and cert.ENGINE.disabled is None
    assert skipped > 100 and uncertain >= 5, (skipped, stats.stock)
    assert world.reqs[0].kv.kv_committed_len > 384  # the run crossed three 128-token chunk boundaries


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
    assert cert.ENGINE.stats.stock["no template"] == 2 and cert.ENGINE.last_step.recording is not None


def test_the_self_check_runs_on_every_call_then_on_every_eighth():
    world = World(rows=[4], committed=[500])
    world.step(hooked=True, pending=False)
    assert cert.ENGINE.stats.checks == cert.ENGINE.stats.plans == STEPS - 1 + 2
    cert.ENGINE.stats.plans = cert.CHECK_ALL
    for _ in range(4):
        world.step(hooked=True, pending=False)
    assert cert.ENGINE.stats.checks == STEPS - 1 + 2 + 16 // cert.CHECK_EVERY


# What tests/test_gpu_flashinfer_certified_plan.py reads from the e2e's slot_checks.
CHECK_LINE = r"check: (\d+) checks, (\d+) mismatches; (\d+) of (\d+) decode steps skipped"


def test_the_log_line_goes_through_the_e2e_benchmarks_collector(tmp_path, caplog):
    """The slot's own log records, written as a server log, read back by the e2e benchmark's
    ``Server.slot_checks`` (what e2e.json's ``slot_checks`` holds), parsed as the GPU test parses it."""
    import logging
    import re

    from sglang_hostsync_plugin.e2e.run import Server

    world = World(rows=[3, 7], committed=[1000, 2500])
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins.hostsync"):
        world.step(hooked=True, pending=False)
        for _ in range(3):
            _accept(world, [2, 3])
            world.step(hooked=True, pending=True)
            for r, e in zip(world.reqs, world.device_lens()):
                r.kv.kv_committed_len, r.kv.kv_allocated_len = e, e + 64
    log = tmp_path / "server.log"
    log.write_text("".join(f"[2026-12-07 00:00:0{i % 10} TP0] {r.getMessage()}\n" for i, r in enumerate(caplog.records)))
    lines = Server.slot_checks(SimpleNamespace(_flush=lambda: None, launch=SimpleNamespace(log=str(log))))
    (line,) = [x for x in lines if x.startswith(cert.NAME)]
    m = re.search(CHECK_LINE, line)
    assert m, line
    checks, mismatches, skipped, steps = map(int, m.groups())
    assert (checks, mismatches) == (10, 0) and 0 < skipped <= steps <= 4, line  # the line logged at check 10


def test_the_hooks_go_in_through_sglangs_hook_registry(tmp_path):
    """load_plugins() with the slot (registered through the entry-point group, ``write_cert_dist``) and
    what it requires: applied, and the updater method SGLang binds in __init__
    (``self.update = self.update_single_wrapper``) is the hooked one."""
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
    """, pythonpath=write_cert_dist(tmp_path), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
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
