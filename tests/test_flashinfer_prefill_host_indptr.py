"""Slot ``flashinfer_prefill_host_indptr`` on the CPU, through SGLang 0.5.23's own
``FlashInferIndicesUpdaterPrefill.update_single_wrapper`` -> ``call_begin_forward`` with stand-ins for
FlashInfer 0.7.2's eager prefill wrappers (their ``plan()``: read the indptrs back, plan from those values,
upload them, stage the plan in the pinned buffer).

- Stock hands ``plan()`` SGLang's device indptr buffers (the read-back); with the slot every eager plan gets host
  tensors and not one of SGLang's buffers, with the values SGLang computed on the device, so FlashInfer plans
  and uploads exactly what it does in stock (random batches, ragged and paged-only).
- The check: device lengths that differ from the host ones are counted from FlashInfer's uploads and turn the
  slot off at the next call, without waiting on the stream.
- What it leaves to stock: speculative batches, CUDA-graph wrappers, multi-item scoring, masks, custom KV
  indices, missing host lengths, arguments that are not SGLang's buffers.
- Each eager wrapper's pinned plan buffer is ringed (a plan whose copy has not run is waited for, counted).
"""

import random
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.attention import flashinfer_backend as fb
from sglang_hostsync_plugin import registry
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import flashinfer_prefill_host_indptr as hi

HQ, HKV, HD = 32, 8, 128
MAX_BS = 32


class Event:
    def __init__(self, fired=True):
        self.fired, self.records = fired, 0

    def record(self):
        self.records += 1

    def query(self):
        return self.fired

    def synchronize(self):
        self.fired = True


class EagerWrapper:
    """An eager FlashInfer prefill wrapper's ``plan()`` as far as the slot changes it. ``sglang_buffers``: SGLang's
    device indptr buffers, which a real ``plan()`` reads back with a blocking copy (counted in ``readbacks``)."""

    is_cuda_graph_enabled = False

    def __init__(self, ragged: bool, sglang_buffers):
        self.ragged, self.sglang_buffers = ragged, sglang_buffers
        self._pin_memory_int_workspace_buffer = torch.zeros(16, dtype=torch.uint8)
        self.plans, self.readbacks, self.staged_in = [], 0, []

    def _host(self, t):  # FlashInfer's `t.to("cpu")`
        self.readbacks += any(t.data_ptr() == b.data_ptr() for b in self.sglang_buffers)
        return t.clone()

    def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
        if self.ragged:
            qo, kv = self._host(qo_indptr), self._host(kv_indptr)
            self.plans.append((qo.tolist(), kv.tolist(), args[:3]))
            self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr.clone(), kv_indptr.clone()
        else:
            indices, last = args[0], args[1]
            qo, kv, last_host = self._host(qo_indptr), self._host(kv_indptr), self._host(last)
            self.plans.append((qo.tolist(), kv.tolist(), last_host.tolist(), len(indices), args[2:6],
                               kwargs.get("non_blocking"), kwargs.get("fixed_split_size")))
            self._qo_indptr_buf, self._paged_kv_indptr_buf = qo_indptr.clone(), kv_indptr.clone()
            self._paged_kv_last_page_len_buf = last.clone()
        self.staged_in.append(self._pin_memory_int_workspace_buffer)

    begin_forward = plan


def _updater():
    u = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    u.num_qo_heads, u.num_kv_heads, u.head_dim = HQ, HKV, HD
    u.q_data_type = u.data_type = torch.bfloat16
    u.kv_indptr = [torch.zeros(MAX_BS + 1, dtype=torch.int32)]
    u.qo_indptr = [torch.zeros(MAX_BS + 1, dtype=torch.int32)]
    u.kv_last_page_len = torch.ones(MAX_BS, dtype=torch.int32)
    u._swa_kv_pool = None
    u.attn_backend = SimpleNamespace(kv_index_translator=SimpleNamespace(reads_are_translated=False,
                                                                         pack_read_stream=lambda *a, **k: None),
                                     dq_paged_kernel_lens=None)
    buffers = (u.kv_indptr[0], u.qo_indptr[0], u.kv_last_page_len)
    u.prefill_wrapper_ragged = EagerWrapper(True, buffers)
    return u, EagerWrapper(False, buffers)


@pytest.fixture(autouse=True)
def _fresh_engine(monkeypatch):
    monkeypatch.setattr(hi, "ENGINE", hi.Engine(new_event=Event, pin=False))


def _batch(rng, bs):
    prefix = [rng.choice([0, 0, rng.randint(1, 300)]) for _ in range(bs)]
    seq = [p + rng.randint(1, 200) for p in prefix]
    return prefix, seq


def _extend(u, paged, prefix, seq, use_ragged, hooked, device_seq=None, **over):
    """One extend batch's metadata, as FlashInferAttnBackend.init_forward_metadata calls the updater."""
    seq_dev = torch.tensor(device_seq or seq, dtype=torch.int64)
    kw = dict(req_pool_indices=torch.arange(len(seq)), seq_lens=seq_dev,
              seq_lens_cpu=torch.tensor(seq, dtype=torch.int64), seq_lens_sum=sum(seq),
              prefix_lens=torch.tensor(prefix, dtype=torch.int64), prefill_wrappers=[paged], use_ragged=use_ragged,
              encoder_lens=None, spec_info=None, fixed_split_size=None, multi_item_params=fb.MultiItemScoringParams(),
              cross_attention_custom_mask=None, extend_prefix_lens_cpu=list(prefix), custom_kv_indices=None)
    kw.update(over)
    update = fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper
    if hooked:
        return hi.prefill_update_hook(update, u, **kw, plan=None)
    return update(u, **kw, plan=None)


def test_a_catalogue_slot_opt_in_whose_pins_hold_here():
    s = registry.catalogue()[hi.NAME]
    assert s is hi.SLOT and not s.default and s.presets == () and check_slot(s) is None
    assert hi.precheck() is None  # SGLang's pinned call_begin_forward (no FlashInfer on this box)
    assert s.inert(ServingFacts(attention_backends=("flashinfer", "flashinfer"))) is None
    assert "not flashinfer" in s.inert(ServingFacts(attention_backends=("triton", "triton")))


@pytest.mark.parametrize("use_ragged", [True, False])
def test_every_eager_plan_gets_host_indptrs_with_the_values_stock_reads_back(use_ragged):
    rng = random.Random(7 + use_ragged)
    for _ in range(40):
        bs = rng.randint(1, MAX_BS)
        prefix, seq = _batch(rng, bs)
        plans = {}
        for hooked in (False, True):
            u, paged = _updater()
            _extend(u, paged, prefix, seq, use_ragged, hooked)
            ragged = u.prefill_wrapper_ragged
            plans[hooked] = (paged.plans, ragged.plans, paged.readbacks + ragged.readbacks,
                             [paged._qo_indptr_buf.tolist(), paged._paged_kv_indptr_buf.tolist(),
                              paged._paged_kv_last_page_len_buf.tolist()])
            assert "begin_forward" not in vars(paged) and "begin_forward" not in vars(ragged)  # put back
        stock, mine = plans[False], plans[True]
        assert stock[2] == (5 if use_ragged else 3)  # stock reads every indptr back
        assert mine[2] == 0
        assert mine[0] == stock[0] and mine[1] == stock[1] and mine[3] == stock[3]
        assert len(stock[1]) == use_ragged
    assert hi.ENGINE.stats.plans == 40 * (2 if use_ragged else 1) and hi.ENGINE.stats.mismatches == 0
    hi.ENGINE.take_readback()
    assert hi.ENGINE.off is None and hi.ENGINE.stats.mismatches == 0


def test_device_lengths_that_differ_from_the_host_ones_are_counted_and_turn_the_slot_off(caplog):
    u, paged = _updater()
    prefix, seq = [0, 10, 0], [5, 17, 9]
    _extend(u, paged, prefix, seq, True, True)
    hi.ENGINE.take_readback()
    assert hi.ENGINE.off is None
    _extend(u, paged, prefix, seq, True, True, device_seq=[5, 18, 9])  # the device disagrees with the host
    hi.ENGINE.take_readback()
    assert hi.ENGINE.stats.mismatches > 0 and "differed" in hi.ENGINE.off
    assert "turned off" in caplog.text
    before = paged.readbacks
    _extend(u, paged, prefix, seq, True, True)
    assert paged.readbacks == before + 3  # stock's read again


def test_a_readback_whose_copy_has_not_run_is_not_waited_for():
    u, paged = _updater()
    hi.ENGINE.new_event = lambda: Event(fired=False)
    _extend(u, paged, [0], [4], False, True)
    value, event = hi.ENGINE.readback
    hi.ENGINE.take_readback()
    assert hi.ENGINE.readback == (value, event) and not event.fired  # left for a later call


@pytest.mark.parametrize("change", ["spec", "graph", "multi_item", "mask", "custom_kv", "no_prefix_cpu",
                                    "no_seq_cpu", "encoder"])
def test_what_it_leaves_to_stock(change):
    u, paged = _updater()
    over = {
        "spec": {},  # below: a speculative batch
        "graph": {},
        "multi_item": {"multi_item_params": SimpleNamespace(is_enabled=lambda: True)},
        "mask": {"cross_attention_custom_mask": torch.ones(4, dtype=torch.bool)},
        "custom_kv": {"custom_kv_indices": torch.zeros(64, dtype=torch.int32)},
        "no_prefix_cpu": {"extend_prefix_lens_cpu": None},
        "no_seq_cpu": {"seq_lens_cpu": None},
        "encoder": {"encoder_lens": torch.zeros(2, dtype=torch.int64)},
    }[change]
    if change == "graph":
        paged.is_cuda_graph_enabled = True
    args = dict(u=u, paged=paged, prefix=[0, 3], seq=[4, 9], use_ragged=False, hooked=True, **over)
    if change == "spec":
        calls = []
        hi.prefill_update_hook(lambda *a, **k: calls.append(k), u, torch.arange(2), torch.tensor([4, 9]),
                               torch.tensor([4, 9]), 13, None, [paged], False, None, object(), plan=None)
        assert len(calls) == 1 and hi.ENGINE.stats.stock == 0  # not an extend: not counted either
        return
    try:
        _extend(**args)
    except Exception:  # noqa: BLE001 (SGLang's own path may refuse what the stand-ins lack; stock is the point)
        pass
    assert hi.ENGINE.stats.plans == 0 and hi.ENGINE.stats.stock == 1
    assert "begin_forward" not in vars(paged)


def test_arguments_that_are_not_sglangs_buffers_go_through_unchanged():
    u, paged = _updater()
    seen = []
    host = hi.ENGINE.indptrs(u, torch.tensor([4, 9]), [0, 3], False)
    other = torch.tensor([0, 4, 10], dtype=torch.int32)
    plan = partial(hi._paged_plan, hi.ENGINE, paged, lambda *a, **k: seen.append(a), host)
    plan(other, u.kv_indptr[0][:3], torch.zeros(8), u.kv_last_page_len[:2], HQ)
    assert seen[0][0] is other and hi.ENGINE.stats.unmatched == 1 and hi.ENGINE.stats.plans == 0


def test_each_eager_wrappers_pinned_plan_buffer_is_ringed():
    u, paged = _updater()
    hi.ENGINE.ring.new_event = lambda: Event(fired=False)  # no copy has run yet
    for _ in range(3):
        _extend(u, paged, [0, 2], [6, 8], False, True)
    first, second, third = paged.staged_in
    assert first is not second and third is first  # two buffers in turn
    assert hi.ENGINE.ring.host_waits == 1  # the third plan waited for the first one's copy


def test_the_hook_goes_in_through_sglangs_hook_registry():
    from helpers import out, run_python

    proc = run_python("""
    import json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()
    runtime.startup_check(rt)
    import sglang.srt.layers.attention.flashinfer_backend as fb
    print("RESULT" + json.dumps({
        "status": rt.state.statuses["flashinfer_prefill_host_indptr"].status.value,
        "hooked": hasattr(fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper, "__wrapped__"),
    }))
    """, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,flashinfer_prefill_host_indptr")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"status": "applied", "hooked": True}, res
