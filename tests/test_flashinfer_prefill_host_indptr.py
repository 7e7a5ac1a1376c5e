"""Slot ``flashinfer_prefill_host_indptr`` on the CPU, through SGLang 0.5.23's own
``FlashInferAttnBackend.init_forward_metadata`` (its extend branch) -> ``update_single_wrapper`` ->
``call_begin_forward`` with stand-ins for FlashInfer 0.7.2's eager prefill wrappers (their ``plan()``: read
the indptrs back, plan from those values, upload them, stage the plan in the pinned buffer).

- Stock hands ``plan()`` SGLang's device indptr buffers (the read-back); with the slot every eager plan of a
  covered batch gets host tensors and none of SGLang's buffers, with the values SGLang computed on the device,
  so FlashInfer plans and uploads exactly what it does in stock (random batches, ragged and paged-only).
- The check: device lengths that differ from the host ones, or an upload that differs, are counted on the
  stream and turn the slot off at a later call, without waiting.
- What it leaves to stock: decode and verify batches, CUDA-graph wrappers, sliding-window dispatch, multi-item
  scoring, masks, dequant indices, encoder lengths, missing or inconsistent host lengths, arguments that are
  not SGLang's buffers, a ``begin_forward`` someone else installed.
- Every plan of a ringed wrapper goes through its pinned-buffer ring, the first one into a new buffer, the
  ring's event recorded after the plan staged its copy.
- It can be selected beside ``flashinfer_device_plan`` (no shared hook).
"""

import random
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.attention import flashinfer_backend as fb
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_hostsync_plugin import registry
from sglang_hostsync_plugin.checks import check_slot, claim_conflicts
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import flashinfer_prefill_host_indptr as hi

HQ, HKV, HD = 32, 8, 128
MAX_BS = 32
LOG: list = []


class Event:
    def __init__(self, fired=True, name="check"):
        self.fired, self.records, self.name = fired, 0, name

    def record(self):
        self.records += 1
        LOG.append(self.name)

    def query(self):
        return self.fired

    def synchronize(self):
        self.fired = True


class EagerWrapper:
    """An eager FlashInfer prefill wrapper's ``plan()`` as far as the slot changes it. ``sglang_buffers``: SGLang's
    device indptr buffers, which a real ``plan()`` reads back with a blocking copy (counted in ``readbacks``)."""

    is_cuda_graph_enabled = False

    def __init__(self, ragged: bool, sglang_buffers):
        self.ragged, self.sglang_buffers, self.corrupt = ragged, sglang_buffers, False
        self._backend = "fa2"
        self._pin_memory_int_workspace_buffer = torch.zeros(16, dtype=torch.uint8)
        self.plans, self.readbacks, self.staged_in = [], 0, []

    def _on_device(self, t):
        return any(t.data_ptr() == b.data_ptr() for b in self.sglang_buffers)  # SGLang's buffers play the device

    def _host(self, t):  # FlashInfer's `t.to("cpu")`: a blocking read-back of a device tensor
        self.readbacks += self._on_device(t)
        return t.clone()

    def _up(self, t):  # FlashInfer's `t.to(self.device, non_blocking=True)`: a device tensor stays itself
        return t if self._on_device(t) else t.clone()

    def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
        if self.ragged:
            qo, kv = self._host(qo_indptr), self._host(kv_indptr)
            self.plans.append((qo.tolist(), kv.tolist(), args[:3]))
            self._qo_indptr_buf, self._kv_indptr_buf = self._up(qo_indptr), self._up(kv_indptr)
            if self.corrupt:
                self._qo_indptr_buf = self._qo_indptr_buf.clone()
                self._qo_indptr_buf[-1] += 1
            self._o_indptr_buf, self._v_indptr_buf = self._qo_indptr_buf, self._kv_indptr_buf
        else:
            indices, last = args[0], args[1]
            qo, kv, last_host = self._host(qo_indptr), self._host(kv_indptr), self._host(last)
            self.plans.append((qo.tolist(), kv.tolist(), last_host.tolist(), len(indices), args[2:6],
                               kwargs.get("non_blocking"), kwargs.get("fixed_split_size")))
            self._qo_indptr_buf, self._paged_kv_indptr_buf = self._up(qo_indptr), self._up(kv_indptr)
            self._paged_kv_last_page_len_buf = self._up(last)
        self.staged_in.append(self._pin_memory_int_workspace_buffer)
        LOG.append("plan")

    begin_forward = plan


def _backend(use_ragged=True):
    """A FlashInfer backend as far as init_forward_metadata's extend branch reads it, with SGLang's own updater."""
    u = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    u.num_qo_heads, u.num_kv_heads, u.head_dim = HQ, HKV, HD
    u.q_data_type = u.data_type = torch.bfloat16
    u.kv_indptr = [torch.zeros(MAX_BS + 1, dtype=torch.int32)]
    u.qo_indptr = [torch.zeros(MAX_BS + 1, dtype=torch.int32)]
    u.kv_last_page_len = torch.ones(MAX_BS, dtype=torch.int32)
    u._swa_kv_pool = None
    b = object.__new__(fb.FlashInferAttnBackend)
    u.attn_backend = b
    u.update = u.update_single_wrapper  # as its __init__ binds it
    buffers = (u.kv_indptr[0], u.qo_indptr[0], u.kv_last_page_len)
    u.prefill_wrapper_ragged = b.prefill_wrapper_ragged = EagerWrapper(True, buffers)
    b.prefill_wrappers_paged = [EagerWrapper(False, buffers)]
    b.indices_updater_prefill = u
    b.kv_index_translator = SimpleNamespace(reads_are_translated=False, pack_read_stream=lambda *a, **k: None)
    b.use_sliding_window_kv_pool = b.is_multimodal = b.enable_mis = b.enable_deterministic = False
    b.use_paged = not use_ragged  # SGLang's reason to plan the paged wrapper alone
    b.prefill_uses_dequant_workspace = False
    b.prefill_split_tile_size = None
    b.num_wrappers = 1
    b.dq_page_table = b.dq_paged_kernel_lens = None
    return b


@pytest.fixture(autouse=True)
def _fresh_engine(monkeypatch):
    monkeypatch.setattr(hi, "ENGINE", hi.Engine(new_event=Event, pin=False))
    LOG.clear()


def _batch(rng, bs):
    prefix = [rng.choice([0, 0, rng.randint(1, 300)]) for _ in range(bs)]
    seq = [p + rng.randint(1, 200) for p in prefix]
    return prefix, seq


def _forward_batch(prefix, seq, device_seq=None, mode=ForwardMode.EXTEND, **over):
    fb_ = SimpleNamespace(
        forward_mode=mode, req_pool_indices=torch.arange(len(seq)),
        seq_lens=torch.tensor(device_seq or seq, dtype=torch.int64), seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
        seq_lens_sum=sum(seq), extend_prefix_lens=torch.tensor(prefix, dtype=torch.int64),
        extend_prefix_lens_cpu=list(prefix), encoder_lens=None, cross_attention_custom_mask=None, kv_loc_plan=None,
        out_cache_loc=None, spec_info=None)
    for k, v in over.items():
        setattr(fb_, k, v)
    return fb_


def _init(backend, batch, hooked=True):
    if hooked:
        return hi.init_metadata_hook(fb.FlashInferAttnBackend.init_forward_metadata, backend, batch)
    return fb.FlashInferAttnBackend.init_forward_metadata(backend, batch)


def _wrappers(b):
    return b.prefill_wrapper_ragged, b.prefill_wrappers_paged[0]


def test_a_catalogue_slot_opt_in_whose_pins_hold_here_and_that_goes_beside_the_device_plan():
    cat = registry.catalogue()
    s = cat[hi.NAME]
    assert s is hi.SLOT and not s.default and s.presets == () and check_slot(s) is None
    assert hi.precheck() is None  # SGLang's pinned sources (no FlashInfer on this box)
    assert s.inert(ServingFacts(attention_backends=("flashinfer", "flashinfer"))) is None
    assert "not flashinfer" in s.inert(ServingFacts(attention_backends=("triton", "triton")))
    together = [cat[n] for n in ("flashinfer_plan_guard", "flashinfer_tree_verify_plan", "flashinfer_device_plan",
                                 hi.NAME)]
    assert claim_conflicts(together) == {}


def test_another_flashinfer_or_a_changed_pinned_source_is_refused(monkeypatch):
    import importlib.metadata
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flashinfer" else None)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.7.3")
    assert "flashinfer 0.7.3 installed" in hi.precheck()
    monkeypatch.undo()
    monkeypatch.setattr(hi, "PINS", ((hi.PINS[1][0], hi.PINS[1][1], "0" * 16),))
    assert "expected 0000000000000000" in hi.precheck()


@pytest.mark.parametrize("use_ragged, ragged_backend", [(True, "fa2"), (True, "auto"), (True, "cutlass"),
                                                        (False, "fa2")])
def test_every_eager_plan_gets_host_indptrs_with_the_values_stock_reads_back(use_ragged, ragged_backend):
    """An uncovered ragged wrapper (``auto`` before its first plan, cutlass) still leaves the paged side the prefix."""
    rng = random.Random(7 + use_ragged)
    covered_ragged = use_ragged and ragged_backend == "fa2"
    for _ in range(40):
        bs = rng.randint(1, MAX_BS)
        prefix, seq = _batch(rng, bs)
        seen = {}
        for hooked in (False, True):
            b = _backend(use_ragged)
            b.prefill_wrapper_ragged._backend = ragged_backend
            _init(b, _forward_batch(prefix, seq), hooked)
            ragged, paged = _wrappers(b)
            bufs = [paged._qo_indptr_buf, paged._paged_kv_indptr_buf, paged._paged_kv_last_page_len_buf]
            if use_ragged:
                bufs += [ragged._qo_indptr_buf, ragged._kv_indptr_buf, ragged._o_indptr_buf, ragged._v_indptr_buf]
            # What the kernels read at run: the same values in the same tensors (SGLang's own, by which buffer).
            u = b.indices_updater_prefill
            own = [x.data_ptr() for x in (u.qo_indptr[0], u.kv_indptr[0], u.kv_last_page_len)]
            seen[hooked] = (paged.plans, ragged.plans, paged.readbacks + ragged.readbacks,
                            [(t.tolist(), own.index(t.data_ptr()) if t.data_ptr() in own else None, t.shape)
                             for t in bufs], b.forward_metadata.use_ragged)
        stock, mine = seen[False], seen[True]
        assert stock[2] == (5 if use_ragged else 3)  # stock reads every indptr back; the slot what it does not cover
        assert mine[2] == (2 if use_ragged and not covered_ragged else 0)
        assert mine[0] == stock[0] and mine[1] == stock[1] and mine[3] == stock[3] and mine[4] == stock[4]
        assert all(which is not None for _, which, _ in mine[3])
        assert len(stock[1]) == use_ragged
    assert hi.ENGINE.stats.extends == 40 and hi.ENGINE.stats.plans == 40 * (2 if covered_ragged else 1)
    hi.ENGINE.take_readback()
    assert hi.ENGINE.off is None and hi.ENGINE.stats.mismatches == 0
    assert hi.ENGINE.stats.unmatched == (40 if use_ragged and not covered_ragged else 0)
    assert hi.ENGINE.call is None


def test_only_backends_whose_run_reads_the_buffers_are_covered_an_auto_wrapper_after_its_first_plan():
    b = _backend()
    ragged, paged = _wrappers(b)
    ragged._backend, paged._backend = "auto", "cutlass"
    _init(b, _forward_batch([0, 4], [3, 9]))
    assert ragged.readbacks == 2 and paged.readbacks == 3 and hi.ENGINE.stats.unmatched == 2
    ragged._backend = "fa3"  # what FlashInfer's first plan resolved "auto" to on Hopper
    _init(b, _forward_batch([0, 4], [3, 9]))
    assert ragged.readbacks == 2 and paged.readbacks == 6 and hi.ENGINE.stats.plans == 1


def test_device_lengths_that_differ_from_the_host_ones_are_counted_and_turn_the_slot_off(caplog):
    b = _backend()
    ragged, paged = _wrappers(b)
    prefix, seq = [0, 10, 0], [5, 17, 9]
    _init(b, _forward_batch(prefix, seq))
    hi.ENGINE.take_readback()
    assert hi.ENGINE.off is None
    _init(b, _forward_batch(prefix, seq, device_seq=[5, 18, 9]))  # the device disagrees with the host
    hi.ENGINE.take_readback()
    assert hi.ENGINE.stats.mismatches > 0 and "differed" in hi.ENGINE.off and "turned off" in caplog.text
    before = paged.readbacks + ragged.readbacks
    _init(b, _forward_batch(prefix, seq))
    assert paged.readbacks + ragged.readbacks == before + 5  # stock's values again


def test_an_upload_that_differs_is_counted_for_the_ragged_wrapper_too():
    b = _backend()
    b.prefill_wrapper_ragged.corrupt = True  # FlashInfer's ragged upload off by one; the paged one right
    _init(b, _forward_batch([0, 4], [3, 9]))
    hi.ENGINE.take_readback()
    assert hi.ENGINE.stats.mismatches == 1 and hi.ENGINE.off


def test_an_upload_of_another_shape_turns_the_slot_off():
    hi.ENGINE.check(((torch.zeros(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)),))
    assert "uploaded (4,) for (3,)" in hi.ENGINE.off and not hi.ENGINE.pending


def test_the_log_line_is_the_one_the_gpu_test_reads(caplog):
    from test_gpu_flashinfer_prefill_host_indptr import CHECK_LINE

    caplog.set_level("INFO", logger="sglang.srt.plugins.hostsync")
    _init(_backend(), _forward_batch([0, 4], [3, 9]))
    (line,) = [r.getMessage() for r in caplog.records if " check: " in r.getMessage()]
    assert CHECK_LINE.search(line).groups() == ("1", "1", "0"), line


def test_every_readback_whose_copy_ran_is_read():
    for bad in (0, 2):
        value = torch.tensor(bad)
        hi.ENGINE.pending.append((value, Event()))
    hi.ENGINE.take_readback()
    assert not hi.ENGINE.pending and hi.ENGINE.stats.mismatches == 2


def test_a_check_that_fails_mid_batch_leaves_the_rest_of_the_batch_to_stock():
    class ShortUpload(EagerWrapper):
        def plan(self, *a, **k):
            EagerWrapper.plan(self, *a, **k)
            self._qo_indptr_buf = self._qo_indptr_buf[:-1]  # an upload of another shape: the check raises

        begin_forward = plan

    b = _backend()
    ragged, paged = _wrappers(b)
    ragged.__class__ = ShortUpload
    _init(b, _forward_batch([0, 4], [3, 9]))
    assert "uploaded" in hi.ENGINE.off and paged.readbacks == 3  # the paged plan got SGLang's buffers


def test_host_indptrs_that_cannot_be_built_leave_the_batch_to_stock(monkeypatch, caplog):
    b = _backend()
    monkeypatch.setattr(hi.ENGINE, "begin", lambda *a: (_ for _ in ()).throw(RuntimeError("no pinned memory")))
    _init(b, _forward_batch([0, 4], [3, 9]))
    assert "no pinned memory" in hi.ENGINE.off and "turned off" in caplog.text and hi.ENGINE.call is None
    assert b.prefill_wrappers_paged[0].readbacks == 3


@pytest.mark.parametrize("gone", ["num_wrappers", "_backend"])
def test_an_upstream_field_gone_turns_the_slot_off_and_leaves_the_batch_to_stock(gone, caplog):
    """Before the batch (the backend's dispatch field) or inside it (the paged wrapper's FlashInfer backend)."""
    b = _backend()
    ragged, paged = _wrappers(b)
    delattr(paged if gone == "_backend" else b, gone)
    _init(b, _forward_batch([0, 4], [3, 9]))
    assert "raised AttributeError" in hi.ENGINE.off and "turned off" in caplog.text and hi.ENGINE.call is None
    assert paged.readbacks == 3  # the paged plan got SGLang's own buffers


def test_a_readback_whose_copy_has_not_run_is_not_waited_for():
    hi.ENGINE.new_event = lambda: Event(fired=False)
    _init(_backend(False), _forward_batch([0], [4]))
    (value, event), = hi.ENGINE.pending
    hi.ENGINE.take_readback()
    assert hi.ENGINE.pending == [(value, event)] and not event.fired  # left for a later call


def _dequant(b, batch):
    b.prefill_uses_dequant_workspace = True  # (stand-in: the NVFP4 workspace's page table set by its prep)
    b._prepare_dequant_workspace_metadata_for_extend = lambda *a, **k: setattr(b, "dq_page_table", torch.zeros(1))


STOCK_CASES = {
    "decode": lambda b, batch: setattr(batch, "forward_mode", ForwardMode.DECODE),
    "verify": lambda b, batch: setattr(batch, "forward_mode", ForwardMode.TARGET_VERIFY),
    "graph_wrapper": lambda b, batch: setattr(b.prefill_wrappers_paged[0], "is_cuda_graph_enabled", True),
    "two_wrappers": lambda b, batch: setattr(b, "num_wrappers", 2),
    "multi_item": lambda b, batch: setattr(b, "enable_mis", True),
    "mask": lambda b, batch: setattr(batch, "cross_attention_custom_mask", torch.ones(4, dtype=torch.bool)),
    "encoder": lambda b, batch: setattr(batch, "encoder_lens", torch.zeros(2, dtype=torch.int64)),
    "no_prefix_cpu": lambda b, batch: setattr(batch, "extend_prefix_lens_cpu", None),
    "no_seq_cpu": lambda b, batch: setattr(batch, "seq_lens_cpu", None),
    "longer_seq_cpu": lambda b, batch: setattr(batch, "seq_lens_cpu", torch.tensor([4, 9, 1])),
    "device_bs": lambda b, batch: setattr(batch, "seq_lens", torch.tensor([4, 9, 1])),
    "someone_elses": lambda b, batch: setattr(b.prefill_wrappers_paged[0], "begin_forward", lambda *a, **k: None),
    "dequant": _dequant,
    "capturing": lambda b, batch: setattr(hi.ENGINE, "capturing", lambda: True),
}


@pytest.mark.parametrize("case", sorted(STOCK_CASES))
def test_what_it_leaves_to_stock(case):
    b = _backend(False)
    batch = _forward_batch([0, 3], [4, 9])
    STOCK_CASES[case](b, batch)
    calls = []

    def original(backend, forward_batch):
        calls.append(hi.ENGINE.call)
        if case == "dequant":  # SGLang's own body, whose dequant prep sets the page table before the plan
            return fb.FlashInferAttnBackend.init_forward_metadata(backend, forward_batch)
        return None

    hi.init_metadata_hook(original, b, batch)
    assert len(calls) == 1 and hi.ENGINE.stats.plans == 0
    if case == "dequant":  # covered, but the paged plan's arguments are the dequant layout's: unmatched, stock's
        assert calls[0] is not None and hi.ENGINE.stats.unmatched == 1
    else:
        assert calls[0] is None
        assert hi.ENGINE.stats.stock == (0 if case in ("decode", "verify", "capturing") else 1)


class QueryForbidden(Event):
    def query(self):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.mark.parametrize("mode", ["capturing", "decode"])
def test_a_capture_or_a_decode_call_leaves_the_pending_checks_alone(mode):
    """The lagged read happens at an extend batch outside a capture: under capture an event query is an error."""
    b = _backend(False)
    batch = _forward_batch([0, 3], [4, 9], mode=ForwardMode.DECODE if mode == "decode" else ForwardMode.EXTEND)
    if mode == "capturing":
        hi.ENGINE.capturing = lambda: True
    hi.ENGINE.pending.append((torch.tensor(0), QueryForbidden()))
    hi.init_metadata_hook(lambda *a: None, b, batch)
    assert len(hi.ENGINE.pending) == 1 and hi.ENGINE.off is None and hi.ENGINE.call is None


def test_arguments_that_are_not_sglangs_buffers_go_through_unchanged():
    b = _backend(False)
    _init(b, _forward_batch([0], [4]))  # installs the slot's begin_forward
    paged = b.prefill_wrappers_paged[0]
    u = b.indices_updater_prefill
    hi.ENGINE.call = hi.ENGINE.begin(b, torch.tensor([4, 9]), [0, 3])
    other = torch.tensor([0, 4, 10], dtype=torch.int32)
    paged.begin_forward(other, u.kv_indptr[0][:3], torch.zeros(8), u.kv_last_page_len[:2], HQ, HKV, HD, 1)
    ones = torch.ones(2, dtype=torch.int32)
    paged.begin_forward(u.qo_indptr[0][:3], u.kv_indptr[0][:3], torch.zeros(8), ones, HQ, HKV, HD, 1)
    hi.ENGINE.call = None
    assert paged.readbacks == 2 + 2 and hi.ENGINE.stats.unmatched == 2 and hi.ENGINE.stats.plans == 1


def test_every_plan_of_a_ringed_wrapper_goes_through_its_ring_and_the_event_follows_the_plan():
    b = _backend(False)
    paged = b.prefill_wrappers_paged[0]
    first_buffer = paged._pin_memory_int_workspace_buffer
    hi.ENGINE.ring.new_event = lambda: Event(fired=False, name="ring")  # no copy has run yet
    _init(b, _forward_batch([0, 2], [6, 8]))  # covered
    _init(b, _forward_batch([0, 2], [6, 8], seq_lens_cpu=None))  # not covered: stock's values, still ringed
    _init(b, _forward_batch([0, 2], [6, 8]))
    one, two, three = paged.staged_in
    assert one is not first_buffer  # a stock plan before the slot may still have its copy queued from that one
    assert two is first_buffer and three is one
    assert hi.ENGINE.ring.host_waits == 2  # the second waited for that stock copy, the third for the first's
    # each ring event behind its plan's copy (the first: behind the copies before the ring)
    assert [x for x in LOG if x != "check"] == ["ring"] + ["plan", "ring"] * 3


def test_the_hook_goes_in_through_sglangs_hook_registry_beside_the_device_plan():
    from helpers import out, run_python

    proc = run_python("""
    import json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()
    runtime.startup_check(rt)
    import sglang.srt.layers.attention.flashinfer_backend as fb
    st = rt.state.statuses
    print("RESULT" + json.dumps({
        "status": [st[n].status.value for n in ("flashinfer_prefill_host_indptr", "flashinfer_device_plan")],
        "hooked": hasattr(fb.FlashInferAttnBackend.init_forward_metadata, "__wrapped__"),
    }))
    """, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
        SGLANG_HOSTSYNC_SLOTS="default,flashinfer,flashinfer_device_plan,flashinfer_prefill_host_indptr")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"status": ["applied", "applied"], "hooked": True}, res
