"""Owned slots that the server arguments never reach are skipped before their targets are
checked or hooked: each owned slot's inert rule, the launcher's plan resolved with the
facts (inert targets never checked, bad input still an error), and the scheduler's
install from that plan registering only the reachable slots' hooks (every hook target
costs SGLang's HookRegistry a scan of sys.modules, the start-up cost measured in
benchmarks/results/2026-12-01-h200-startup-rerun/)."""

import pytest

from sglang_hostsync_plugin import checks, installer, plan as plans, registry
from sglang_hostsync_plugin.slot import ServingFacts, SlotKind, Status, inert_reason

CATALOGUE = registry.catalogue()
OWNED = [n for n, s in CATALOGUE.items() if s.kind is SlotKind.OWNED]


def facts(algo=None, topk=1, page=1, backend=None, draft=None, env=None):
    return ServingFacts(speculative_algorithm=algo, topk=topk, page_size=page, attention_backends=(backend, backend),
                        draft_attention_backend=draft, env=env or {})


STANDALONE_T4P16_TRITON = facts("STANDALONE", 4, 16, "triton")
# slot -> the facts under which it does something (None: never inert).
REACHED = {
    "dspark_dp_meta": {"DSPARK"},
    "accept_lens_snapshot": {"DSPARK"},
    "draft_input_reuse": {"DFLASH", "DSPARK"},
    "ngram_accept_readback": {"NGRAM"},
}


@pytest.mark.parametrize("algo", [None, "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"])
@pytest.mark.parametrize("slot", sorted(REACHED))
def test_algorithm_bound_slots_are_inert_for_every_other_algorithm(slot, algo):
    reason = inert_reason(CATALOGUE[slot], facts(algo, 4, 16, "flashinfer"))
    if algo in REACHED[slot]:
        assert reason is None
    else:
        assert reason.startswith("inert because --speculative-algorithm is ") and (algo or "unset") in reason


@pytest.mark.parametrize("f, expected", [
    (facts("EAGLE", 4, 16), None),
    (facts("STANDALONE", 4, 16, "triton"), None),
    (facts("EAGLE", 1, 16), "--speculative-eagle-topk is 1"),
    (facts("EAGLE", 4, 1), "--page-size is 1"),
    (facts("NGRAM", 4, 16), "--speculative-algorithm is NGRAM"),
    (facts("DSPARK", 4, 16), "--speculative-algorithm is DSPARK"),
])
def test_eagle_tail_is_reached_exactly_where_its_kernel_is_prebuilt(f, expected):
    slot = CATALOGUE["eagle_fixed_shape_tail"]
    reason = inert_reason(slot, f)
    assert (reason is None) if expected is None else (expected in reason), reason
    from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as tail

    assert tail._path_used(f) == (reason is None)  # the kernel prebuild and prepare use the same rule


@pytest.mark.parametrize("f, guard, tree", [
    (facts("EAGLE", 4, 16, "flashinfer"), None, None),
    (facts("EAGLE", 4, 16, None), None, None),  # backend not resolved yet: never guessed inert
    (facts("EAGLE", 4, 16, "triton", draft="flashinfer"), None, None),  # a FlashInfer draft is reached
    (facts("EAGLE", 4, 16, "triton"), "not flashinfer", "not flashinfer"),
    (facts("EAGLE", 4, 16, "fa3"), "not flashinfer", "not flashinfer"),
    # A backend no draft supports: SGLang gives an unnamed draft FlashInfer instead.
    (facts("DFLASH", 4, 16, "flashmla"), None, "is DFLASH"),
    (facts("DFLASH", 4, 16, "flashmla", draft="triton"), "not flashinfer", "is DFLASH"),
    # Stock's topk-1 verify plan() reads back every step: nothing to guard, unless that read is off.
    (facts("EAGLE", 1, 16, "flashinfer"), "topk is 1", "topk is 1"),
    (facts("EAGLE3", 1, 16, "flashinfer", env={"SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN": "1"}), None, "topk is 1"),
    (facts("EAGLE", None, 16, "flashinfer"), None, None),  # topk not resolved yet
    (facts("DFLASH", 1, 16, "flashinfer"), None, "is DFLASH"),
    (facts("NGRAM", 1, 1, "flashinfer"), None, None),  # NGRAM verify is planned on the host too
    (facts("NGRAM", 1, 1, "triton"), "not flashinfer", "not flashinfer"),
    (facts(None, 1, 1, "fa3"), "not flashinfer", "is unset"),
])
def test_flashinfer_slots_are_inert_only_when_no_backend_is_flashinfer(f, guard, tree):
    for name, expected in (("flashinfer_plan_guard", guard), ("flashinfer_tree_verify_plan", tree)):
        reason = inert_reason(CATALOGUE[name], f)
        assert (reason is None) if expected is None else (expected in reason), (name, reason)


@pytest.mark.parametrize("spec, guard", [
    ("default", Status.SKIPPED),
    ("default,flashinfer", Status.WOULD_APPLY),  # flashinfer_verify_host_plan removes the read: it keeps the guard
    ("default,flashinfer,-flashinfer_verify_host_plan", Status.SKIPPED),
])
def test_the_plan_guard_applies_at_topk_1_only_beside_a_slot_that_requires_it(spec, guard):
    topk1 = facts("STANDALONE", 1, 16, "flashinfer")
    assert "flashinfer_plan_guard" in CATALOGUE["flashinfer_verify_host_plan"].requires
    env = {"SGLANG_HOSTSYNC_SLOTS": spec}
    for plan in (plans.resolve(env, facts=topk1),
                 plans.resolve(env, facts=facts("STANDALONE", None, 16, None)).with_facts(CATALOGUE, topk1)):
        assert plan.verdict("flashinfer_plan_guard").status is guard, plan.verdict("flashinfer_plan_guard")
    # A requiring slot that is itself inert (topk 4: the switch covers topk 1 only) keeps nothing.
    reasons = plans.inert_reasons(CATALOGUE, facts("STANDALONE", 4, 16, "flashinfer"),
                                  {"flashinfer_verify_host_plan", "flashinfer_plan_guard"})
    assert reasons["flashinfer_verify_host_plan"] and reasons["flashinfer_plan_guard"] is None
    reasons = plans.inert_reasons(CATALOGUE, facts("STANDALONE", 1, 16, "triton"),
                                  {"flashinfer_verify_host_plan", "flashinfer_plan_guard"})
    assert reasons["flashinfer_verify_host_plan"] and "not flashinfer" in reasons["flashinfer_plan_guard"]


def test_slots_reached_by_every_configuration_have_no_rule():
    for name in ("event_ring", "pinned_d2h_ring"):
        assert CATALOGUE[name].inert is None, name


def test_resolve_with_facts_never_checks_an_inert_slots_targets(monkeypatch):
    checked = []
    real = checks.check_slot
    monkeypatch.setattr(checks, "check_slot", lambda slot: checked.append(slot.name) or real(slot))
    plan = plans.resolve({}, facts=STANDALONE_T4P16_TRITON)
    inert = {n for n in CATALOGUE if inert_reason(CATALOGUE[n], STANDALONE_T4P16_TRITON)}
    assert inert >= {"dspark_dp_meta", "draft_input_reuse", "accept_lens_snapshot", "flashinfer_plan_guard",
                     "flashinfer_tree_verify_plan", "ngram_accept_readback"}
    assert not inert & set(checked) and set(checked) == set(CATALOGUE) - inert
    assert plan.facts_applied
    for name in inert:
        v = plan.verdict(name)
        assert v.status is Status.SKIPPED and v.reason.startswith("inert because"), v
    assert plan.verdict("eagle_fixed_shape_tail").status is Status.WOULD_APPLY
    # The same verdicts as resolving first and applying the facts after (the env-var path).
    late = plans.resolve({}).with_facts(CATALOGUE, STANDALONE_T4P16_TRITON)
    assert [(v.name, v.status, v.reason) for v in late.verdicts] == [(v.name, v.status, v.reason) for v in plan.verdicts]


def test_an_inert_slot_that_would_fail_its_target_check_does_not_stop_startup(monkeypatch):
    real = checks.check_slot
    monkeypatch.setattr(checks, "check_slot",
                        lambda slot: "target missing: renamed" if slot.name == "ngram_accept_readback" else real(slot))
    plans.resolve({}, facts=STANDALONE_T4P16_TRITON).check_startup()  # strict: nothing refused
    with pytest.raises(plans.HostsyncStartupError, match="ngram_accept_readback: target missing"):
        plans.resolve({}, facts=facts("NGRAM", 1, 1, "triton")).check_startup()


def test_bad_input_of_an_inert_slot_is_still_an_error(monkeypatch):
    monkeypatch.setenv("SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL", "bogus")  # prechecks read the process env
    plan = plans.resolve(facts=facts("NGRAM", 1, 1, "triton"))  # the tail is inert for NGRAM
    assert plan.verdict("eagle_fixed_shape_tail").bad_config
    assert plan.config_errors() and "SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL" in plan.config_errors()[0]


def test_scheduler_installs_only_the_reached_slots_hooks():
    def registered(plan):
        paths = []
        installer.install(installer.InstallState(), plan, CATALOGUE, lambda path, hook, kind: paths.append(path))
        return paths

    everything = registered(plans.resolve({}))
    reached = registered(plans.resolve({}, facts=STANDALONE_T4P16_TRITON))
    assert set(reached) < set(everything)
    assert not [p for p in reached if "dspark" in p or "dflash" in p or "flashinfer" in p or "FutureMap" in p]
    assert any("duplicate_prefix_tail_to_draft_branches" in p for p in reached)
    print(f"\nhook targets registered by a scheduler: {len(everything)} without the server facts, "
          f"{len(reached)} for STANDALONE topk 4 page 16 triton")


# The slots whose rules read topk or the page size, and the facts that make each inert once known.
KNOWN_INERT = {
    "eagle_fixed_shape_tail": [dict(topk=1, page=16), dict(topk=4, page=1)],
    "fused_draft_page_locs": [dict(topk=1, page=16), dict(topk=4, page=1)],
    "fused_tree_compact": [dict(topk=1, page=16)],
    "draft_vocab_topk": [dict(topk=1, page=16)],
    "draft_extend_topk_graph": [dict(topk=1, page=16)],
    "chain_tree_full_mask": [dict(topk=4, page=16)],
    "flashinfer_tree_verify_plan": [dict(topk=1, page=16)],
    "flashinfer_verify_host_plan": [dict(topk=4, page=16)],
}


@pytest.mark.parametrize("slot", sorted(KNOWN_INERT))
def test_a_topk_or_page_size_not_resolved_yet_never_makes_a_slot_inert(slot):
    """The launcher reads the args before SGLang resolves them (an EAGLE-family topk the user
    left out is SGLang's choice, 4 for a Llama target): unknown (None) is never guessed inert;
    a fact still known keeps its own rule."""
    for known in KNOWN_INERT[slot]:
        reason = inert_reason(CATALOGUE[slot], facts("EAGLE", known["topk"], known["page"], "flashinfer"))
        assert reason, (slot, known)
        by_page = "--page-size" in reason
        assert inert_reason(CATALOGUE[slot], facts("EAGLE", None, known["page"], "flashinfer")) == (reason if by_page else None)
        assert inert_reason(CATALOGUE[slot], facts("EAGLE", known["topk"], None, "flashinfer")) == (None if by_page else reason)
    assert inert_reason(CATALOGUE[slot], facts("EAGLE", None, None, "flashinfer")) is None


def test_a_plan_is_refined_by_resolved_facts_never_widened():
    early = plans.resolve({}, facts=facts("EAGLE", None, 16, "triton"))
    assert early.verdict("eagle_fixed_shape_tail").status is Status.WOULD_APPLY
    chain = early.with_facts(CATALOGUE, facts("EAGLE", 1, 16, "triton"))  # SGLang chose topk 1
    assert chain.verdict("eagle_fixed_shape_tail").status is Status.SKIPPED and chain.facts["topk"] == 1
    tree = early.with_facts(CATALOGUE, facts("EAGLE", 4, 16, "triton"))
    assert tree.verdict("eagle_fixed_shape_tail").status is Status.WOULD_APPLY and tree.facts["topk"] == 4
    assert chain.with_facts(CATALOGUE, facts("EAGLE", 4, 16, "triton")) is chain  # other args: not this plan's
    assert chain.with_facts(CATALOGUE, facts("EAGLE", None, 16, "triton")) is chain  # less known: kept
    assert tree.with_facts(CATALOGUE, facts("EAGLE", 4, 16, "triton")) is tree  # the same: kept
    assert plans.refines({"a": None, "b": [None, "x"]}, {"a": 4, "b": ["triton", "x"]})
    assert not plans.refines({"a": 1}, {"a": 4}) and not plans.refines({"a": 4}, {"a": None})
    assert not plans.refines({"a": 4}, {"a": 4}) and not plans.refines({"a": None}, {"b": None})


def test_the_plan_guard_stays_at_topk_1_where_the_verify_may_not_be_flashinfers():
    # A FlashInfer draft beside another target backend: no FlashInfer verify plan() drains the stream.
    for f in (facts("EAGLE", 1, 16, "fa3", draft="flashinfer"),
              ServingFacts(speculative_algorithm="EAGLE", topk=1, page_size=16,
                           attention_backends=("fa3", "flashinfer"))):
        assert inert_reason(CATALOGUE["flashinfer_plan_guard"], f) is None, f
