"""Slot ``ngram_late_wait`` on the CPU, on SGLang's real ``FutureMap`` and its real NGRAM verify
prep: the resolve queues SGLang's copies and does not synchronize; the draft prep's wait does, and
then the batch holds stock's seq lens, their sum and the accepted tokens, in the very tensors the
batch got at the resolve (the forward isolation's snapshot keeps those); nothing SGLang runs
between the two reads them. The GPU case is tests/test_gpu_ngram_late_wait.py."""

import inspect
import random
import types

import numpy as np
import pytest
import torch

from sglang.srt.managers import overlap_utils, scheduler
from sglang.srt.managers.overlap_utils import FutureMap
from sglang_hostsync_plugin import registry
from sglang_hostsync_plugin.checks import check_slot, read_source
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import ngram_accept_readback as readback
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm
from sglang_hostsync_plugin.slots import ngram_late_wait as late
from test_ngram_accept_readback import NDT, POOL, FakeEvent, _future_map, _stash, random_stash
from test_ngram_full_mask import _fake_worker, ngram_worker, stock_full_mask  # noqa: F401 (fixture)

DECODE = types.SimpleNamespace(is_decode=lambda: True)
EXTEND = types.SimpleNamespace(is_decode=lambda: False)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(readback, "new_event", lambda fm: FakeEvent(fm.fwd_prepare_d2h_stream.log, "stash"))
    monkeypatch.setattr(late, "_live", False)
    monkeypatch.setattr(late, "_pending", None)
    monkeypatch.setattr(late, "deferred", 0)
    # ngram_full_mask's verify-prep edit has run (the tests that drive it run the real one)
    monkeypatch.setattr(nfm.PREPARE_ONCE, "live", lambda: True)


def _batch(indices, mode=DECODE):
    idx = torch.tensor(indices, dtype=torch.int64)
    return types.SimpleNamespace(
        spec_info=types.SimpleNamespace(future_indices=idx.clone(), accept_tokens=None, accept_lens=None),
        req_pool_indices_cpu=idx, seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None, forward_mode=mode)


def _resolve(fm, batch, hooked):
    if hooked:
        readback.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
        readback.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
    else:
        fm.resolve_seq_lens_cpu(batch)
        fm._resolve_spec_extras(batch)


def _draft_prep(batch):
    """What NGRAMWorker._prepare_draft_tokens reads, through the slot's hook."""
    seen = {}

    def original(self, b):
        info = b.spec_info
        seen.update(tokens=info.accept_tokens.cpu(), lens=info.accept_lens.cpu(), seq_lens_cpu=b.seq_lens_cpu,
                    seq_lens_sum=b.seq_lens_sum)
        return "drafts"

    assert late.draft_tokens_hook(original, None, batch) == "drafts"
    return seen


def test_slot_is_catalogued_opt_in_requires_the_readback_and_the_mask_and_its_pins_match():
    s = registry.catalogue()[late.NAME]
    assert not s.default and s.requires == ("ngram_accept_readback", "ngram_full_mask")
    assert check_slot(s) is None and late.check_pins() is None
    assert late.SLOT.inert(ServingFacts(speculative_algorithm="NGRAM")) is None
    assert "only NGRAM" in late.SLOT.inert(ServingFacts(speculative_algorithm="STANDALONE", topk=4))


def test_pins_name_a_changed_source(monkeypatch):
    monkeypatch.setattr(late, "PINS", ((late.PINS[0][0], "0" * 16),))
    assert "expected 0000000000000000" in late.check_pins()


def test_the_wait_moves_to_the_draft_prep_and_the_values_are_stocks():
    rng = random.Random(7)
    stock, _ = _future_map(stream=False)
    fm, log = _future_map()
    late._live = True  # the wait point's hook ran on an earlier step
    steps = 0
    for _ in range(60):
        rows, lens = random_stash(rng, ((stock, False), (fm, True)))
        stock.new_seq_lens_buf[rows] += torch.tensor(lens.tolist())  # the publish of the step's new lengths
        fm.new_seq_lens_buf[rows] += torch.tensor(lens.tolist())
        if rng.random() < 0.3:
            continue
        batch_rows = rng.sample(range(1, POOL), rng.randint(1, 8))
        want = _batch(batch_rows)
        _resolve(stock, want, hooked=False)
        got = _batch(batch_rows)
        log.clear()
        _resolve(fm, got, hooked=True)
        assert not [e for e in log if e[0] == "sync"]  # no wait at the resolve
        assert [e[0] for e in log] == ["wait", "stream_wait", "wait"] and log[2] == ("wait", "publish")
        held = got.seq_lens_cpu
        assert got.seq_lens_sum is None and torch.equal(got.seq_lens, want.seq_lens)
        seen = _draft_prep(got)
        assert [e[0] for e in log][-1] == "sync"  # SGLang's synchronize, at the draft prep
        assert seen["seq_lens_cpu"] is held  # filled in place: the isolation snapshot holds this tensor
        assert torch.equal(held, want.seq_lens_cpu) and held.dtype == want.seq_lens_cpu.dtype
        assert seen["seq_lens_sum"] == want.seq_lens_sum
        assert torch.equal(seen["tokens"], want.spec_info.accept_tokens.cpu())
        assert torch.equal(seen["lens"], want.spec_info.accept_lens.cpu())
        assert seen["tokens"].dtype == want.spec_info.accept_tokens.dtype
        steps += 1
    assert late.deferred == steps > 20 and late._pending is None


def test_the_first_step_waits_where_sglang_does_and_arms_the_deferral():
    fm, log = _future_map()
    _stash(fm, True, [3], torch.ones(1, NDT, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    batch = _batch([3])
    _resolve(fm, batch, hooked=True)
    assert [e[0] for e in log][-1] == "sync" and late.deferred == 0  # not live yet: stock's place
    _draft_prep(batch)
    assert late._live
    _stash(fm, True, [3], torch.ones(1, NDT, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    log.clear()
    _resolve(fm, _batch([3]), hooked=True)
    assert late.deferred == 1 and "sync" not in [e[0] for e in log]


@pytest.mark.parametrize("case", ["extend", "debug_assert", "stream_ordered", "no_stream"])
def test_the_wait_stays_where_sglang_has_it(case, monkeypatch):
    late._live = True
    fm, log = _future_map(stream=case != "no_stream")
    _stash(fm, True, [2, 5], torch.ones(2, NDT, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    if case == "debug_assert":
        monkeypatch.setattr(overlap_utils, "_DEBUG_ASSERT", True)
        monkeypatch.setattr(overlap_utils, "_assert_nonneg_and_invalidate", lambda *a: None)
        fm._publish_fresh = True  # SGLang's consume-once check: a forward published
    batch = _batch([2, 5], EXTEND if case == "extend" else DECODE)
    readback.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch,
                                       stream_ordered=case == "stream_ordered")
    assert late.deferred == 0 and late._pending is None
    if case in ("extend", "debug_assert"):
        assert [e[0] for e in log][-1] == "sync" and batch.seq_lens_sum == int(batch.seq_lens_cpu.sum())


def test_a_wait_left_over_completes_before_the_next_resolve_and_stops_the_deferral(caplog):
    late._live = True
    fm, log = _future_map()
    _stash(fm, True, [4], torch.full((1, NDT), 9, dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    first = _batch([4])
    _resolve(fm, first, hooked=True)
    assert late._pending is not None
    _stash(fm, True, [6], torch.ones(1, NDT, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    log.clear()
    _resolve(fm, _batch([6]), hooked=True)
    assert log[0][0] == "sync"  # the left-over wait, before this resolve queues anything
    assert first.spec_info.accept_tokens.tolist() == [9] * NDT and first.seq_lens_sum == 104
    assert first.spec_info.accept_lens.tolist() == [2] and first.seq_lens_cpu.tolist() == [104]
    # No draft prep took it: this resolve waited where SGLang does, and so will the next ones.
    assert late.deferred == 1 and not late._live and late._pending is None and log[-1][0] == "sync"
    assert "was not taken by the draft prep" in caplog.text


def test_sglang_reads_neither_between_the_resolve_and_the_worker():
    """run_batch from the resolve to the worker call, and resolve_forward_inputs, read neither the
    host seq lens nor their sum (the forward isolation snapshots the references, not the values)."""
    src = inspect.getsource(scheduler.Scheduler.run_batch)
    start = src.index("self.future_map.resolve_seq_lens_cpu(batch)")
    between = src[start + len("self.future_map.resolve_seq_lens_cpu(batch)"):src.index(
        "self.model_worker.forward_batch_generation(", start)]
    between = between.replace("resolve_seq_lens_cpu(batch, stream_ordered=True)", "")  # ROCm's branch
    assert "seq_lens_cpu" not in between and "seq_lens_sum" not in between
    assert "self._confidence_budget_prepare(batch, self.future_map)" in between  # DSpark only:
    assert "is_dspark()" in inspect.getsource(overlap_utils.decide_needs_confidence_relay)
    assert "seq_lens_cpu" not in inspect.getsource(overlap_utils.resolve_forward_inputs)
    fwd = read_source(late.PINS[0][0])
    before = fwd[:fwd.index("self._prepare_for_speculative_decoding(batch)")]
    assert "seq_lens" not in before and "accept_" not in before


def test_sglangs_verify_prep_reads_nothing_of_step_n_minus_1_before_the_draft_prep(ngram_worker, monkeypatch):
    """SGLang's real _prepare_for_speculative_decoding (as ngram_full_mask edits it) on a batch whose
    host seq lens hold garbage until the draft prep's wait fills them: the verify mask is stock's."""
    w = ngram_worker
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    for bs, d in ((1, 8), (3, 4)):
        self, batch, seen, (tree, mask, lens) = _fake_worker(w, monkeypatch, d, bs, None, seed=bs + d)
        true_lens = batch.seq_lens_cpu.clone()
        batch.seq_lens_cpu.fill_(1 << 40)  # what a read before the wait would see
        fake_draft = self._prepare_draft_tokens
        fm = types.SimpleNamespace(fwd_prepare_d2h_stream=types.SimpleNamespace(synchronize=lambda: None),
                                   new_seq_lens_cpu_pinned=true_lens)
        rb = types.SimpleNamespace(tokens=torch.zeros(bs, NDT, dtype=torch.int32), lens=torch.zeros(bs, dtype=torch.int32))
        late._pending = late.Pending(fm, batch, torch.arange(bs), rb, batch.seq_lens_cpu,
                                     torch.empty(bs * NDT, dtype=torch.int32), torch.empty(bs, dtype=torch.int32))
        self._prepare_draft_tokens = lambda b: late.draft_tokens_hook(lambda _s, bb: fake_draft(bb), self, b)
        nfm.edited(original)(self, batch)
        assert late._pending is None and batch.seq_lens_sum == int(true_lens.sum())
        assert torch.equal(seen[-1]["custom_mask"], stock_full_mask(tree, mask, true_lens.tolist(), d))


def test_the_readback_hands_the_tensors_the_wait_fills():
    late._live = True
    fm, _ = _future_map()
    _stash(fm, True, [1, 2], torch.arange(2 * NDT, dtype=torch.int32).view(2, NDT), torch.tensor([3, 1], dtype=torch.int32))
    batch = _batch([2, 1])
    _resolve(fm, batch, hooked=True)
    tokens = batch.spec_info.accept_tokens
    assert tokens is late._pending.tokens and batch.spec_info.accept_lens is late._pending.lens
    assert readback._states[fm].staged == 1
    _draft_prep(batch)
    assert tokens.tolist() == list(range(NDT, 2 * NDT)) + list(range(NDT))
    assert np.array_equal(batch.spec_info.accept_lens.numpy(), [1, 3])


def test_the_audit_times_the_moved_wait_as_the_resolves_wait_not_as_draft_prep(monkeypatch):
    """The e2e's host-work figure leaves the seq-lens resolve out (the wait for step N-1): the moved
    wait must land there, nested in (and cut out of) the draft prep's phase."""
    import threading

    from sglang_hostsync_plugin.e2e import stats
    from sglang_hostsync_plugin.slots import audit_phases as ph

    late._live = True
    fm, _ = _future_map()
    _stash(fm, True, [1, 2], torch.arange(2 * NDT, dtype=torch.int32).view(2, NDT), torch.tensor([3, 1], dtype=torch.int32))
    batch = _batch([2, 1])
    _resolve(fm, batch, hooked=True)
    clock = ph.PhaseClock(thread_id=threading.get_ident())
    monkeypatch.setattr(ph, "_armed", clock)
    monkeypatch.setattr(ph, "_clock", clock)
    synced = []
    monkeypatch.setattr(fm.fwd_prepare_d2h_stream, "synchronize",
                        lambda: synced.append([p for p in clock.stack]))
    ph.make_hook("ngram_draft")(lambda: _draft_prep(batch))
    assert synced == [["ngram_draft", stats.SEQ_LENS_PHASE]]
    assert [p for p, _, _ in clock.segments] == ["ngram_draft", stats.SEQ_LENS_PHASE, "ngram_draft"]
    # Untimed (another thread's clock, or none): the same wait, nothing recorded.
    for other in (ph.PhaseClock(thread_id=threading.get_ident() + 1), None):
        synced.clear()
        _resolve(fm, batch, hooked=True)
        monkeypatch.setattr(ph, "_clock", other)
        _draft_prep(batch)
        assert synced == [[]] and (other is None or not other.segments)


def test_a_batch_left_to_stocks_mask_loop_takes_the_wait_before_it_reads_the_lengths(ngram_worker, monkeypatch):
    """Where ngram_full_mask's kernel does not fit (here: a tree-mask buffer that is not bool), the edited
    verify prep runs stock's per-request loop, which reads the host lengths before the draft prep."""
    w = ngram_worker
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    bs, d = 2, 4
    self, batch, seen, (tree, mask, lens) = _fake_worker(w, monkeypatch, d, bs, None, seed=7)
    self.tree_mask = self.tree_mask.to(torch.uint8)
    true_lens = batch.seq_lens_cpu.clone()
    batch.seq_lens_cpu.fill_(1 << 40)  # ones((D, 2**40)) if read before the wait
    fm = types.SimpleNamespace(fwd_prepare_d2h_stream=types.SimpleNamespace(synchronize=lambda: None),
                               new_seq_lens_cpu_pinned=true_lens)
    rb = types.SimpleNamespace(tokens=torch.zeros(bs, NDT, dtype=torch.int32), lens=torch.zeros(bs, dtype=torch.int32))
    late._pending = late.Pending(fm, batch, torch.arange(bs), rb, batch.seq_lens_cpu,
                                 torch.empty(bs * NDT, dtype=torch.int32), torch.empty(bs, dtype=torch.int32))
    fake_draft = self._prepare_draft_tokens
    self._prepare_draft_tokens = lambda b: late.draft_tokens_hook(lambda _s, bb: fake_draft(bb), self, b)
    nfm.edited(original)(self, batch)
    assert late._pending is None and torch.equal(batch.seq_lens_cpu, true_lens)
    assert torch.equal(seen[-1]["custom_mask"], stock_full_mask(tree, mask, true_lens.tolist(), d))


def test_no_deferral_while_the_verify_prep_runs_sglangs_unedited_function(monkeypatch):
    """A failed first-call edit of ngram_full_mask leaves SGLang's function, which reads the host lengths
    before the draft prep: the resolve then keeps stock's wait."""
    late._live = True
    monkeypatch.delattr(nfm.PREPARE_ONCE, "live")  # the fixture's stand-in: PinnedEdit.live itself
    monkeypatch.setattr(nfm.NGRAM_PREPARE_SITE, "_variants", {(nfm.NAME,): lambda *a: None})
    monkeypatch.setattr(nfm.NGRAM_PREPARE_SITE, "_failed", {(nfm.NAME,)})  # the site ran SGLang's function
    assert not nfm.PREPARE_ONCE.live()
    fm, _ = _future_map()
    _stash(fm, True, [1], torch.arange(NDT, dtype=torch.int32).view(1, NDT), torch.tensor([2], dtype=torch.int32))
    batch = _batch([1])
    _resolve(fm, batch, hooked=True)
    assert late.deferred == 0 and late._pending is None and batch.seq_lens_cpu is not None
    assert fm.fwd_prepare_d2h_stream.log[-1][0] == "sync"
