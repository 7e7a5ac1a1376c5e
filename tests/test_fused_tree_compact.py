"""fused_tree_compact on the CPU: predict, hidden states, the (tgt, src) slot lists handed to
``move_kv_cache`` and the KV pool after it, all bit-identical to SGLang's real
``_finalize_accept_tree_path`` (its Triton kernels and the slot's under TRITON_INTERPRET)."""

import random

import pytest
import torch

from hostsync_drivers.tree_compact import make_case, run_both, same
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc

EDGES = [
    dict(bs=1, topk=2, steps=1),
    dict(bs=1, topk=4, steps=3, path_lens=[1]),  # only the root accepted: nothing moves
    dict(bs=1, topk=4, steps=3, path_lens=[4]),  # the whole depth accepted
    dict(bs=3, topk=4, steps=3, path_lens=[1, 4, 2]),
    dict(bs=2, topk=8, steps=7, hidden_dim=None),  # no hidden states to move
    dict(bs=4, topk=2, steps=5, hidden_dim=40, hidden_dtype=torch.float32),
    dict(bs=5, topk=4, steps=3, hidden_dim=3000),  # several hidden column blocks
    dict(bs=64, topk=8, steps=7),  # 512 accepted positions
    dict(bs=6, topk=4, steps=4, scatter_pads=True),  # -1 inside a path: stock's packing still holds
    dict(bs=3, topk=1, steps=3, nd=4),  # a chain: the path is its own front
]


@pytest.mark.parametrize("case", EDGES, ids=[str(c) for c in EDGES])
def test_edges_bit_identical_to_stock(case):
    rng = random.Random(str(case))
    inputs = make_case(rng, **case)
    stock, plugin = run_both(inputs)
    assert same(stock, plugin)


def test_random_batches_bit_identical_to_stock():
    rng = random.Random(11)
    moved = 0
    for i in range(30):
        topk, steps = rng.choice([2, 3, 4, 8]), rng.randint(1, 7)
        inputs = make_case(rng, rng.randint(1, 12), topk, steps, hidden_dim=rng.choice([None, 8, 64]))
        stock, plugin = run_both(inputs, seed=i)
        assert same(stock, plugin), (i, topk, steps)
        moved += int(not torch.equal(stock["predict"], inputs["predict"]))
    assert moved > 20  # most batches really compact something (the comparison is not vacuous)


def test_the_comparison_catches_a_wrong_row():
    inputs = make_case(random.Random(5), 4, 4, 3, path_lens=[2, 3, 4, 1])
    stock, plugin = run_both(inputs)
    assert same(stock, plugin)
    for key in ("predict", "hidden"):
        broken = dict(plugin, **{key: plugin[key].clone()})
        broken[key][1] += 1
        assert not same(stock, broken), key
    tgt, src = plugin["moves"][0]
    assert not same(stock, dict(plugin, moves=[(tgt, src.flip(0))]))


def test_padded_path_rows_hold_node_zero_as_stock():
    inputs = make_case(random.Random(2), 2, 4, 3, path_lens=[1, 2])
    stock, plugin = run_both(inputs)
    assert same(stock, plugin)
    nd = inputs["nd"]
    # request 1, positions 2..3 of its path are -1: stock's clamp gathers node 0 there
    assert bool((plugin["predict"][nd + 2: nd + 4] == inputs["predict"][0]).all())


def test_steps_aside_for_what_the_kernel_does_not_take(monkeypatch):
    inputs = make_case(random.Random(3), 2, 4, 3)
    calls = []

    def original(*args, **kwargs):
        calls.append(1)
        return "stock"

    from types import SimpleNamespace

    batch = SimpleNamespace(out_cache_loc=inputs["out_cache_loc"], seq_lens=torch.zeros(2))
    hidden_t = inputs["hidden"].t().contiguous().t()  # same shape, not contiguous
    logits = SimpleNamespace(hidden_states=hidden_t)
    got = ftc.finalize_hook(original, batch, inputs["accept_index"], inputs["accept_lens"], inputs["predict"], logits,
                            2, token_to_kv_pool_allocator=None, num_draft_tokens=inputs["nd"])
    assert got == "stock" and calls == [1]
    monkeypatch.setattr(ftc, "MAX_WINDOW", inputs["out_cache_loc"].numel() - 1)  # a batch past the bound
    logits = SimpleNamespace(hidden_states=inputs["hidden"])
    got = ftc.finalize_hook(original, batch, inputs["accept_index"], inputs["accept_lens"], inputs["predict"], logits,
                            2, token_to_kv_pool_allocator=None, num_draft_tokens=inputs["nd"])
    assert got == "stock" and calls == [1, 1]
    monkeypatch.undo()
    monkeypatch.setattr(ftc, "_INTERPRET", False)  # a CPU tensor outside the interpreter: SGLang's CPU path
    logits = SimpleNamespace(hidden_states=inputs["hidden"])
    got = ftc.finalize_hook(original, batch, inputs["accept_index"], inputs["accept_lens"], inputs["predict"], logits,
                            2, token_to_kv_pool_allocator=None, num_draft_tokens=inputs["nd"])
    assert got == "stock" and calls == [1, 1, 1]


def test_inert_rule_and_pins():
    eagle = dict(speculative_algorithm="EAGLE")
    assert ftc.inert(ServingFacts(**eagle, topk=4)) is None
    assert "topk is 1" in ftc.inert(ServingFacts(**eagle, topk=1))
    assert "NGRAM" in ftc.inert(ServingFacts(speculative_algorithm="NGRAM", topk=4))
    assert ftc.pinned_sources() is None and check_slot(ftc.SLOT) is None
    assert {attr for _, attr, _ in ftc.PINS} >= {"_compact_accept_to_front", "move_accept_tokens_to_target_kvcache"}


def test_a_changed_pin_refuses_the_slot(monkeypatch):
    owner, attr, _ = ftc.PINS[0]
    monkeypatch.setattr(ftc, "PINS", ((owner, attr, "0" * 16),) + ftc.PINS[1:])
    reason = ftc.pinned_sources()
    assert reason.startswith("upstream shape changed") and attr in reason


def test_in_the_eagle_host_preset_not_default():
    from sglang_hostsync_plugin.slots.upstream_switches import HOST_PRESET

    assert HOST_PRESET in ftc.SLOT.presets and not ftc.SLOT.default


def test_the_audit_phase_timer_composes_with_the_slot_from_outside():
    """The audit's sub-phases (``audit_fine``) time the same function (phase tree_compact): an
    observer target, so selecting both applies both, and the installer registers one hook there
    with the timer outside the slot's hook (SGLang's HookRegistry sees no stacked hooks)."""
    from sglang_hostsync_plugin import installer, plan as plans, registry
    from sglang_hostsync_plugin.slot import Status

    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                         attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "fused_tree_compact,audit,audit_fine"}, facts=facts)
    for name in (ftc.NAME, "audit", "audit_fine"):
        assert plan.verdict(name).status is Status.WOULD_APPLY, plan.verdict(name)
    order = []
    installer.install(installer.InstallState(), plan, registry.catalogue(),
                      lambda path, hook, kind: order.append((path, hook.__qualname__)))
    at_target = [name for path, name in order if path == ftc.TARGET]
    assert len(at_target) == 1 and len(order) == len({p for p, _ in order})
    assert at_target[0].startswith("hostsync[audit_fine].") and f"(hostsync[{ftc.NAME}]." in at_target[0]


def test_composed_hook_runs_the_observer_around_the_claiming_hook():
    from sglang_hostsync_plugin import installer

    seen = []

    def claim(original, x):
        seen.append("claim")
        return x * 10  # never calls original (as a fused path does)

    def observe(original, *args, **kwargs):
        seen.append("enter")
        try:
            return original(*args, **kwargs)
        finally:
            seen.append("exit")

    state = installer.InstallState(active={"c", "o"})
    hook = installer.compose_function(state, [("o", observe, True), ("c", claim, False)])
    assert hook(lambda x: -1, 3) == 30 and seen == ["enter", "claim", "exit"]
    state.active.discard("c")  # a refused claiming slot: SGLang's function, still observed
    seen.clear()
    assert hook(lambda x: -1, 3) == -1 and seen == ["enter", "exit"]


def test_claimants_from_different_auto_picks_run_one_at_a_time_observers_around():
    """A plan made before the facts chose an auto pick installs each pick's claimant of a shared function
    (plan.claim_conflicts): the first active one runs alone, none runs SGLang's function."""
    from sglang_hostsync_plugin import installer

    seen = []

    def claimant(name, k):
        def hook(original, x):
            seen.append(name)
            return original(x) * k
        return hook

    def observe(original, x):
        seen.append("observe")
        return original(x)

    state = installer.InstallState(active={"a", "b", "o"})
    hook = installer.compose_function(state, [("a", claimant("a", 10), False), ("o", observe, True),
                                              ("b", claimant("b", 100), False)])
    assert hook(lambda x: x + 1, 1) == 20 and seen == ["observe", "a"]  # never both
    for active, want, ran in (({"b", "o"}, 200, ["observe", "b"]), ({"o"}, 2, ["observe"]), (set(), 2, [])):
        state.active = set(active)
        seen.clear()
        assert hook(lambda x: x + 1, 1) == want and seen == ran, active


def test_two_claiming_slots_on_one_function_are_still_refused():
    from sglang_hostsync_plugin.checks import claim_conflicts
    from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

    def slot(name, observer=False):
        return Slot(name=name, kind=SlotKind.OWNED, origin="t", summary="t", default=False,
                    targets=(HookTarget(ftc.TARGET, TargetKind.FUNCTION, hook=lambda o, *a, **k: o(*a, **k),
                                        observer=observer),))

    assert set(claim_conflicts([slot("a"), slot("b")])) == {"a", "b"}
    assert claim_conflicts([slot("a"), slot("b", observer=True)]) == {}
    with pytest.raises(ValueError, match="observer"):
        HookTarget(ftc.TARGET, TargetKind.FUNCTION, hook=lambda o: o, observer=True, needs_upstream_original=True)
