"""decode_lens_lazy_h2d on the CPU: SGLang's ``eagle_prepare_for_decode`` and the edited one over
a run of decode steps (page 16 and page 1, several requests, steps that allocate and steps that do
not) hand the allocation the same host lengths and the same request state; the edited one makes
the two device copies exactly on the steps that allocate. SGLang's ``alloc_for_spec_decode`` on a
step that allocates nothing reads no device length; pins, inert rules; through SGLang's
HookRegistry in a fresh interpreter, the decode prep's caller reaches the edit."""

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import decode_lens_lazy_h2d as lazy

RESERVE = 8  # get_alloc_reserve_per_decode at 4 draft tokens


def make_batch(committed, page_size, device="meta"):
    """What eagle_prepare_for_decode reads of a ScheduleBatch (``device`` meta: each H2D shows)."""
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=c, kv_allocated_len=c), decode_batch_idx=0)
            for c in committed]
    return SimpleNamespace(
        reqs=reqs, device=device, seq_lens_cpu=None, maybe_evict_swa=lambda: None,
        sampling_info=SimpleNamespace(penalizer_orchestrator=SimpleNamespace(is_required=False)),
        token_to_kv_pool_allocator=SimpleNamespace(page_size=page_size), tree_cache=object(),
        req_to_token_pool=object(), req_pool_indices=object())


def advance(batch, accepted):
    for r, n in zip(batch.reqs, accepted):
        r.kv.kv_committed_len += n


class Allocation:
    """Stands in for ``alloc_for_spec_decode``: records each call, then updates the requests as the
    real one does after allocating (``kv_allocated_len``)."""

    def __init__(self):
        self.calls = []

    def __call__(self, tree_cache, req_to_token_pool, **kw):
        self.calls.append(kw)
        for req, n in zip(kw["reqs"], kw["nxt_kv_lens_cpu"].tolist()):
            req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, n)


@pytest.fixture
def utils(monkeypatch):
    from sglang.srt.speculative import eagle_utils

    monkeypatch.setattr(eagle_utils, "get_alloc_reserve_per_decode", lambda: RESERVE)
    monkeypatch.setattr(eagle_utils, "get_spec", lambda: SimpleNamespace(speculative_eagle_topk=1))
    return eagle_utils


def _run(utils, monkeypatch, fn, page_size, steps):
    alloc = Allocation()
    monkeypatch.setattr(utils, "alloc_for_spec_decode", alloc)
    batch = make_batch([5, 17, 31], page_size)
    for accepted in steps:
        fn(batch)
        advance(batch, accepted)
    return batch, alloc.calls


STEPS = [(3, 1, 4), (2, 3, 3), (4, 4, 1), (1, 2, 3), (3, 3, 3), (4, 1, 2)] * 4


@pytest.mark.parametrize("page_size", [1, 16])
def test_same_allocation_and_copies_only_where_it_allocates(utils, monkeypatch, page_size):
    stock_fn = utils.eagle_prepare_for_decode
    edited = lazy.PREPARE_ONCE(stock_fn)
    assert edited is not stock_fn
    stock_batch, stock_calls = _run(utils, monkeypatch, stock_fn, page_size, STEPS)
    batch, calls = _run(utils, monkeypatch, edited, page_size, STEPS)
    assert len(calls) == len(stock_calls) == len(STEPS)
    allocating = 0
    for mine, theirs in zip(calls, stock_calls):
        assert mine["num_needed_tokens"] == theirs["num_needed_tokens"]
        for key in ("cur_kv_lens_cpu", "nxt_kv_lens_cpu"):
            assert torch.equal(mine[key], theirs[key])
        assert theirs["cur_kv_lens"].is_meta and theirs["nxt_kv_lens"].is_meta  # stock copies every step
        if theirs["num_needed_tokens"] > 0:
            allocating += 1
            assert mine["cur_kv_lens"].is_meta and mine["nxt_kv_lens"].is_meta
            assert mine["cur_kv_lens"].shape == theirs["cur_kv_lens"].shape
        else:
            assert mine["cur_kv_lens"] is None and mine["nxt_kv_lens"] is None
    assert [(r.kv.kv_allocated_len, r.decode_batch_idx) for r in batch.reqs] == \
        [(r.kv.kv_allocated_len, r.decode_batch_idx) for r in stock_batch.reqs]
    assert batch.max_seq_len_host == stock_batch.max_seq_len_host
    if page_size == 1:
        assert allocating == len(STEPS)  # every step allocates: nothing changes
    else:
        assert 0 < allocating < len(STEPS) // 2  # most page-16 steps allocate nothing


def test_sglangs_allocation_reads_no_device_length_when_it_allocates_nothing():
    from sglang.srt.mem_cache.allocation import alloc_for_spec_decode

    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=32)), SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=16))]
    alloc_for_spec_decode(object(), object(), reqs=reqs, req_pool_indices=object(), cur_kv_lens=None,
                          cur_kv_lens_cpu=torch.tensor([32, 16], dtype=torch.int32), nxt_kv_lens=None,
                          nxt_kv_lens_cpu=torch.tensor([32, 16], dtype=torch.int32), num_needed_tokens=0)
    assert [r.kv.kv_allocated_len for r in reqs] == [32, 16]


def test_target_pins_and_preset(monkeypatch):
    assert check_slot(lazy.SLOT) is None
    (target,) = lazy.SLOT.targets
    assert target.path == lazy.PREPARE and target.needs_upstream_original
    assert not lazy.SLOT.default and "eagle_host" in lazy.SLOT.presets
    monkeypatch.setattr(lazy, "PINS", (("sglang.srt.mem_cache.allocation", "alloc_for_spec_decode", "0" * 16),))
    assert "upstream shape changed" in check_slot(lazy.SLOT)


def test_inert_rules():
    for algo in ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM"):
        assert lazy.SLOT.inert(ServingFacts(algo, topk=1)) is None
    assert "DFLASH" in lazy.SLOT.inert(ServingFacts("DFLASH"))
    assert "unset" in lazy.SLOT.inert(ServingFacts())


def test_installs_beside_the_audits_observer():
    from helpers import install_eagle_host_with_audit

    paths = [path for path, _ in install_eagle_host_with_audit(lazy.NAME)]
    assert paths.count(lazy.PREPARE) == 1


def test_installed_where_the_decode_prep_looks_it_up():
    """Through the real HookRegistry with the preset and the audit: SGLang's dispatcher
    (``spec_prepare_for_decode``, which imports the function at call time) runs the edit."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + f"""
import json
from types import SimpleNamespace
from sglang.srt.speculative import eagle_utils, spec_utils
from test_decode_lens_lazy_h2d import Allocation, advance, make_batch
eagle_utils.get_alloc_reserve_per_decode = lambda: {RESERVE}
eagle_utils.alloc_for_spec_decode = alloc = Allocation()
eagle_utils.get_spec = lambda: SimpleNamespace(speculative_eagle_topk=1)
spec_utils.get_exec = lambda: SimpleNamespace(mamba=SimpleNamespace(enable_mamba_extra_buffer_lazy=False))
batch = make_batch([5], 16)
batch.spec_algorithm = SimpleNamespace(is_dflash_family=lambda: False, is_uno=lambda: False)
for _ in range(6):
    spec_utils.spec_prepare_for_decode(batch)
    advance(batch, [3])
print("RESULT" + json.dumps({{"err": err, "status": rt.state.statuses["decode_lens_lazy_h2d"].status.value,
      "needed": [c["num_needed_tokens"] for c in alloc.calls],
      "copied": [c["cur_kv_lens"] is not None for c in alloc.calls]}}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["copied"] == [n > 0 for n in res["needed"]] and 0 < sum(res["copied"]) < 6, res
