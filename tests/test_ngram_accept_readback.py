"""Slot ``ngram_accept_readback`` on the CPU, on SGLang's real ``FutureMap``: the host
accept tokens/lens it hands NGRAM's draft prep equal what stock's gathers + ``.cpu()``
give, over random stash/resolve sequences; its copies are queued on SGLang's private
stream behind the last stash, before SGLang's synchronize; and it steps aside wherever
that synchronize would not cover them. The GPU ordering (a delayed stash) is
tests/test_gpu_ngram_accept_readback.py."""

import ast
import importlib.util
import inspect
import random
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.managers import overlap_utils, scheduler
from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang_hostsync_plugin import registry
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slots import ngram_accept_readback as slot

POOL, NDT = 24, 4


class FakeEvent:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self):
        self.log.append(("record", self.name))

    def wait(self):  # the current (schedule) stream waits on it
        self.log.append(("stream_wait", self.name))


class LogStream(torch.cpu.Stream):
    """SGLang's private D2H stream, as seen by the host: what waited on what, and what the
    mirrors held when SGLang synchronized it."""

    def __init__(self, log, fm):
        super().__init__()
        self.log, self.fm = log, fm

    def wait_event(self, event):
        self.log.append(("wait", event.name))

    def synchronize(self):
        st = slot._states.get(self.fm)
        self.log.append(("sync", None if st is None or st.tokens is None else st.tokens.clone()))


def _future_map(algo=SpeculativeAlgorithm.NGRAM, stream=True):
    pool = SimpleNamespace(req_to_token=torch.zeros(POOL, 64, dtype=torch.int32))
    fm = FutureMap(torch.device("cpu"), algo, pool, needs_cpu_seq_lens=True)
    fm.new_seq_lens_buf.copy_(torch.arange(POOL) + 100)
    log = []
    if stream:  # what SGLang sets up under CUDA (_is_cuda), with stand-ins
        fm.fwd_prepare_d2h_stream = LogStream(log, fm)
        fm.new_seq_lens_cpu_pinned = torch.empty(POOL, dtype=torch.int64)
        fm.publish_ready = FakeEvent(log, "publish")
    return fm, log


@pytest.fixture(autouse=True)
def _events(monkeypatch):
    monkeypatch.setattr(slot, "new_event", lambda fm: FakeEvent(fm.fwd_prepare_d2h_stream.log, "stash"))


def _batch(indices):
    idx = torch.tensor(indices, dtype=torch.int64)
    return SimpleNamespace(spec_info=SimpleNamespace(future_indices=idx.clone(), accept_tokens=None, accept_lens=None),
                           req_pool_indices_cpu=idx, seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def _stash(fm, hooked, indices, tokens, lens):
    payload = RelayPayload(bonus_tokens=None, accept_tokens=tokens, accept_lens=lens)
    idx = torch.tensor(indices, dtype=torch.int64)
    if hooked:
        slot.stash_hook(FutureMap.stash, fm, idx, payload)
    else:
        fm.stash(idx, payload)


def random_stash(rng, maps):
    """One step's relay stash of random rows into each ``(future_map, hooked)``; its rows and lens."""
    k = rng.randint(1, 6)
    rows = rng.sample(range(1, POOL), k)
    tokens = torch.randint(0, 32000, (k, NDT), dtype=torch.int32)
    lens = torch.tensor([rng.randint(1, NDT) for _ in rows], dtype=torch.int32)
    for fm, hooked in maps:
        _stash(fm, hooked, rows, tokens, lens)
    return rows, lens


def _resolve(fm, hooked, batch, stream_ordered=False):
    if hooked:
        slot.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch, stream_ordered=stream_ordered)
        slot.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
    else:
        fm.resolve_seq_lens_cpu(batch, stream_ordered=stream_ordered)
        fm._resolve_spec_extras(batch)
    # What NGRAMWorker._prepare_draft_tokens reads: .cpu() unless already on the host.
    info = batch.spec_info
    return info.accept_tokens.cpu(), info.accept_lens.cpu(), batch.seq_lens_cpu


def test_slot_is_catalogued_default_and_its_targets_match_sglang():
    s = registry.catalogue()[slot.NAME]
    assert s.default and check_slot(s) is None


def test_host_accept_tokens_equal_stock_over_random_steps():
    rng = random.Random(5)
    stock, _ = _future_map(stream=False)  # SGLang's own path, untouched
    hooked, log = _future_map()
    steps = 0
    for _ in range(60):
        random_stash(rng, ((stock, False), (hooked, True)))
        if rng.random() < 0.7:
            batch_rows = rng.sample(range(1, POOL), rng.randint(1, 8))
            want = _resolve(stock, False, _batch(batch_rows))
            b = _batch(batch_rows)
            got = _resolve(hooked, True, b)
            for w, g in zip(want, got):
                assert g.dtype == w.dtype and torch.equal(g, w)
            assert b.spec_info.accept_tokens.device.type == "cpu"
            steps += 1
    assert slot._states[hooked].staged == steps > 20


def test_copies_wait_on_the_last_stash_and_land_before_sglangs_synchronize():
    fm, log = _future_map()
    _stash(fm, True, [3, 5], torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32),
           torch.tensor([2, 4], dtype=torch.int32))
    _stash(fm, True, [7], torch.tensor([[9, 9, 9, 9]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32))
    log.clear()
    tokens, lens, _ = _resolve(fm, True, _batch([7, 3]))
    assert [e[0] for e in log] == ["wait", "stream_wait", "wait", "sync"]
    assert log[0] == ("wait", "stash") and log[2] == ("wait", "publish")
    # The mirror rows the host gathers were already copied when SGLang synchronized.
    assert torch.equal(log[3][1][:8], fm.accept_tokens_buf[:8])
    assert tokens.tolist() == [9, 9, 9, 9, 1, 2, 3, 4] and lens.tolist() == [1, 2]


def test_stash_event_is_recorded_after_the_stash_wrote_and_only_for_ngram():
    fm, log = _future_map()
    _stash(fm, True, [], torch.zeros(0, NDT, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    assert log == [] and fm not in slot._states  # DP idle: nothing stashed
    _stash(fm, True, [2], torch.ones(1, NDT, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    assert log == [("record", "stash")]
    eagle, elog = _future_map(SpeculativeAlgorithm.EAGLE)
    batch = _batch([2])
    slot.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, eagle, batch)
    assert eagle not in slot._states and ("wait", "stash") not in elog


@pytest.mark.parametrize("case", ["no_stream", "stream_ordered", "no_stash", "other_draft_input", "no_indices"])
def test_sglangs_path_runs_where_its_synchronize_would_not_cover_the_copies(case):
    stock, _ = _future_map(stream=False)
    fm, log = _future_map(stream=case != "no_stream")
    for m, h in ((stock, False), (fm, case != "no_stash")):  # no_stash: no event recorded
        _stash(m, h, [4, 6], torch.tensor([[1, 1, 1, 1], [2, 2, 2, 2]], dtype=torch.int32),
               torch.tensor([1, 3], dtype=torch.int32))
    batch = _batch([6, 4])
    if case == "no_indices":
        batch.spec_info.future_indices = None
        batch.spec_info.accept_tokens = "untouched"
        slot.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
        slot.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
        assert batch.spec_info.accept_tokens == "untouched"
        return
    if case == "other_draft_input":
        slot.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
        batch.spec_info = SimpleNamespace(**vars(batch.spec_info))  # replaced in between
        slot.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
        assert slot._states[fm].staged == 0 and slot._states[fm].ready is None
        return
    got = _resolve(fm, True, batch, stream_ordered=case == "stream_ordered")
    st = slot._states.get(fm)
    assert st is None or (st.staged == 0 and ("wait", "stash") not in log)
    want = _resolve(stock, False, _batch([6, 4]))
    assert all(torch.equal(g, w) for g, w in zip(got[:2], want[:2]))


def _method_source(module: str, cls: str, name: str) -> str:
    path = importlib.util.find_spec(module).origin  # read, not imported (ngram_worker needs sgl_kernel)
    tree = ast.parse(open(path).read())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(open(path).read(), fn)


def test_ngram_draft_prep_skips_its_copies_for_host_tensors():
    src = _method_source("sglang.srt.speculative.ngram_worker", "NGRAMWorker", "_prepare_draft_tokens")
    assert ("if not prev_token_ids.is_cpu:\n                prev_token_ids = prev_token_ids.cpu()\n"
            "                prev_accept_lens = prev_accept_lens.cpu()") in src
    assert "batch.spec_info.accept_tokens" in src and "batch.spec_info.accept_lens" in src


def test_scheduler_resolves_seq_lens_before_the_spec_extras():
    """The mirrors are staged in resolve_seq_lens_cpu and taken in _resolve_spec_extras:
    SGLang's run_batch calls them in that order, and only resolve_forward_inputs calls the latter."""
    src = inspect.getsource(scheduler.Scheduler.run_batch)
    assert src.index("self.future_map.resolve_seq_lens_cpu(batch)") < src.index(
        "resolve_forward_inputs(batch, self.future_map)")
    assert inspect.getsource(overlap_utils).count("._resolve_spec_extras(") == 1
