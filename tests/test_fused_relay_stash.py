"""fused_relay_stash on the CPU: every relay buffer of a real SGLang ``FutureMap`` bit-identical
after the slot's stash and after SGLang's ``FutureMap.stash`` (the slot's kernel under
TRITON_INTERPRET), the cases it leaves to SGLang, its pins and inert rule."""

import random
from types import SimpleNamespace

import pytest
import torch

from hostsync_drivers.relay_stash import (fell_back, indices_for, make_maps, make_payload, run_both,
                                          same)
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import fused_relay_stash as frs

EDGES = [
    dict(bs=1),
    dict(bs=1, topk=1),
    dict(bs=8, topk=4),
    dict(bs=3, topk=8, hidden_dim=40),  # EAGLE: hidden states relayed too
    dict(bs=2, topk=4, hidden_dim=3000),  # several column blocks of a hidden row
    dict(bs=5, topk=4, bonus_dtype=torch.int64),  # no cast
    dict(bs=4, topk=4, topk_p=False),  # a staging transition: only the bonus token
    dict(bs=4, topk=4, hidden_dim=16, hidden_dtype=torch.float32),
    dict(bs=64, topk=4, hidden_dim=64),
]


@pytest.mark.parametrize("case", EDGES, ids=[str(c) for c in EDGES])
def test_edges_bit_identical_to_stock(case, monkeypatch):
    rng = random.Random(str(case))
    payload = make_payload(rng, **case)
    stock, plugin = make_maps(rng, 80, payload, "EAGLE" if case.get("hidden_dim") else "STANDALONE",
                              monkeypatch=monkeypatch)
    indices = indices_for(rng, 80, case["bs"])
    assert same(stock, plugin)
    run_both(stock, plugin, indices, payload)
    assert same(stock, plugin)
    assert torch.equal(stock.output_tokens_buf[indices], payload.bonus_tokens.to(torch.int64))


def test_random_steps_bit_identical_to_stock(monkeypatch):
    """Several stashes into the same maps, as a server's steps do, padding row 0 and int32 indices included."""
    rng = random.Random(7)
    for trial in range(6):
        hidden = rng.choice([None, 24])
        topk = rng.choice([1, 2, 4, 8])
        pool = rng.randint(10, 200)
        first = make_payload(rng, 1, topk, hidden)
        stock, plugin = make_maps(rng, pool, first, "EAGLE" if hidden else "STANDALONE", monkeypatch=monkeypatch)
        for step in range(5):
            bs = rng.randint(1, min(pool, 40))
            payload = make_payload(rng, bs, topk, hidden)
            indices = indices_for(rng, pool, bs, dtype=rng.choice([torch.int64, torch.int32]))
            run_both(stock, plugin, indices, payload)
            assert same(stock, plugin), (trial, step)


def test_the_comparison_catches_a_wrong_row(monkeypatch):
    rng = random.Random(3)
    payload = make_payload(rng, 4, 4, 8)
    stock, plugin = make_maps(rng, 20, payload, "EAGLE", monkeypatch=monkeypatch)
    indices = indices_for(rng, 20, 4)
    run_both(stock, plugin, indices, payload)
    for name in ("output_tokens_buf", "topk_p_buf", "topk_index_buf", "hidden_states_buf"):
        buf = getattr(plugin, name)
        saved = buf.clone()
        buf[indices[1]] = buf[indices[2]]
        assert not same(stock, plugin), name
        buf.copy_(saved)
    assert same(stock, plugin)


def test_a_row_strided_source_is_fused_and_a_column_strided_one_left_to_sglang(monkeypatch):
    rng = random.Random(5)
    wide = make_payload(rng, 6, 8)
    payload = make_payload(rng, 6, 4)
    payload.topk_p = wide.topk_p[:, :4]  # rows 8 apart, columns contiguous
    stock, plugin = make_maps(rng, 30, payload, monkeypatch=monkeypatch)
    indices = indices_for(rng, 30, 6)
    run_both(stock, plugin, indices, payload)
    assert same(stock, plugin)
    payload.topk_p = wide.topk_p.t().contiguous().t()[:, :4]  # a column-major view
    calls = []
    frs.stash(plugin, indices, payload, lambda *a: calls.append(a))
    assert len(calls) == 1


def test_the_published_bonus_is_not_written_again(monkeypatch):
    """A relay that already published the bonus tokens (SGLang's FutureRelayBuffers): stock skips that write."""
    rng = random.Random(9)
    payload = make_payload(rng, 3, 4)
    stock, plugin = make_maps(rng, 12, payload, monkeypatch=monkeypatch)
    stock._relay = SimpleNamespace(published_bonus=payload.bonus_tokens)
    plugin._relay = SimpleNamespace(published_bonus=payload.bonus_tokens)
    indices = indices_for(rng, 12, 3)
    run_both(stock, plugin, indices, payload)
    assert same(stock, plugin) and plugin._relay.published_bonus is None and stock._relay.published_bonus is None
    assert not torch.equal(plugin.output_tokens_buf[indices], payload.bonus_tokens.to(torch.int64))


def test_what_the_kernel_does_not_take_goes_to_sglang(monkeypatch):
    rng = random.Random(4)
    payload = make_payload(rng, 3, 4, 8)
    _, plugin = make_maps(rng, 12, payload, "EAGLE", monkeypatch=monkeypatch)
    indices = indices_for(rng, 12, 3)
    calls = []

    def goes_to_sglang(p, idx=indices, fm=plugin):
        before = len(calls)
        frs.stash(fm, idx, p, lambda i, q: calls.append(q))
        return len(calls) == before + 1

    assert goes_to_sglang(payload, idx=indices[:0])  # DP idle
    cast = make_payload(rng, 3, 4, 8, hidden_dtype=torch.float16)  # a float cast: bf16 buffer
    assert goes_to_sglang(cast)
    payload.draft_probs = torch.rand(3, 5)
    plugin.draft_probs_buf = torch.rand(12, 5)
    assert goes_to_sglang(payload)
    plugin.draft_probs_buf = None
    payload.draft_probs = None
    aliased = make_payload(rng, 3, 4, 8)
    aliased.topk_index = plugin.topk_index_buf[:3]  # reads the buffer it writes
    assert goes_to_sglang(aliased)
    # a source that starts before the buffer and runs into it (one storage, the buffer at an offset)
    shared = torch.zeros(8 + 12 * 4, dtype=torch.int64)
    plugin.topk_index_buf = shared[8:].view(12, 4)
    aliased.topk_index = shared[:12].view(3, 4)
    assert goes_to_sglang(aliased)
    plugin.topk_index_buf = torch.zeros(12, 4, dtype=torch.int64)
    assert goes_to_sglang(make_payload(rng, 3, 4, 8), idx=indices.view(3, 1))
    monkeypatch.setattr(frs, "_INTERPRET", False)  # a CPU tensor outside the interpreter
    assert goes_to_sglang(payload)
    monkeypatch.undo()
    _, ngram = make_maps(rng, 12, make_payload(rng, 1, 4), "NGRAM", monkeypatch=monkeypatch)
    assert goes_to_sglang(payload, fm=ngram)
    frs.stash(plugin, indices, payload, fell_back)  # and the case itself takes the fused path


def test_inert_rule_pins_and_preset():
    assert frs.SLOT.inert(ServingFacts("STANDALONE", topk=4)) is None
    assert frs.SLOT.inert(ServingFacts("EAGLE3", topk=1)) is None
    assert "NGRAM" in frs.SLOT.inert(ServingFacts("NGRAM"))
    assert "unset" in frs.SLOT.inert(ServingFacts())
    assert frs.pinned_sources() is None and check_slot(frs.SLOT) is None
    assert not frs.SLOT.default and "eagle_host" in frs.SLOT.presets


def test_a_changed_pin_refuses_the_slot(monkeypatch):
    owner, attr, _ = frs.PINS[0]
    monkeypatch.setattr(frs, "PINS", ((owner, attr, "0" * 16),) + frs.PINS[1:])
    assert frs.pinned_sources().startswith("upstream shape changed")


def _scheduler(fm, algo="STANDALONE"):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    seen = []
    coordinator = SimpleNamespace(maybe_select_and_relay=lambda b, r, chunked_req: seen.append((b, r, chunked_req)))
    sched = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string(algo), future_map=fm,
                            beam_coordinator=coordinator, chunked_req="chunked")
    return sched, seen


def test_the_relay_hook_stashes_the_draft_input_and_runs_the_beam_coordinator(monkeypatch):
    from sglang.srt.managers.scheduler import Scheduler

    rng = random.Random(12)
    payload = make_payload(rng, 5, 4, 16)
    stock, plugin = make_maps(rng, 30, payload, "EAGLE", monkeypatch=monkeypatch)
    indices = indices_for(rng, 30, 5)
    draft = SimpleNamespace(bonus_tokens=payload.bonus_tokens, topk_p=payload.topk_p, topk_index=payload.topk_index,
                            hidden_states=payload.hidden_states, dsa_topk_indices=None)
    batch, result = SimpleNamespace(beam_tail=None), SimpleNamespace(next_draft_input=draft)
    stock_sched, stock_seen = _scheduler(stock)
    plugin_sched, plugin_seen = _scheduler(plugin)
    plugin.stash = fell_back  # the fused path, not the map's stash
    Scheduler._relay_forward_payload(stock_sched, batch, indices, result)
    frs.relay_hook(fell_back, plugin_sched, batch, indices, result)
    assert same(stock, plugin)
    assert stock_seen == plugin_seen == [(batch, result, "chunked")]


def test_the_relay_hook_leaves_other_steps_to_sglang():
    calls = []

    def original(*args):
        calls.append(args)

    draft = SimpleNamespace()
    for algo, result, tail in (("NGRAM", SimpleNamespace(next_draft_input=draft), None),
                               ("EAGLE", SimpleNamespace(next_draft_input=None), None),  # a non-spec result
                               ("EAGLE", SimpleNamespace(next_draft_input=draft), "tail")):  # beam search
        sched, seen = _scheduler(None, algo)
        batch = SimpleNamespace(beam_tail=tail)
        frs.relay_hook(original, sched, batch, "idx", result)
        assert calls[-1] == (sched, batch, "idx", result) and not seen
    assert len(calls) == 3


def test_the_audit_phase_timer_composes_with_the_slot():
    """``audit_fine`` times the same function (phase relay_payload) as an observer: both apply."""
    from sglang_hostsync_plugin import installer, plan as plans, registry
    from sglang_hostsync_plugin.slot import Status

    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                         attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host,audit,audit_fine"}, facts=facts)
    for name in (frs.NAME, "audit", "audit_fine", "ngram_accept_readback"):
        assert plan.verdict(name).status in (Status.WOULD_APPLY, Status.SKIPPED), plan.verdict(name)
    assert plan.verdict(frs.NAME).status is Status.WOULD_APPLY
    order = []
    installer.install(installer.InstallState(), plan, registry.catalogue(),
                      lambda path, hook, kind: order.append((path, hook.__qualname__)))
    at_target = [name for path, name in order if path == frs.TARGET]
    assert len(at_target) == 1 and at_target[0].startswith("hostsync[audit_fine].")


def test_no_claim_conflict_without_server_facts():
    """Before the server args are known (the env switch exported at launch) no other slot claims the target."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host,ngram_full_mask"})
    failed = [v for v in plan.verdicts if v.status is Status.FAILED]
    assert not failed, failed
