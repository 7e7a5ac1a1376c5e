"""``SGLANG_HOSTSYNC_SLOTS=auto``: the pick per configuration class, the conflicts no pick may hold,
a configuration nobody measured, the plan narrowing once SGLang resolves the arguments, and the
line that pins the pick."""

import dataclasses
import json
import sys

import pytest

from sglang_hostsync_plugin import choice, config, doctor, plan as plans, registry
from sglang_hostsync_plugin.slot import ServingFacts, Status

CATALOGUE = registry.catalogue()


def facts(algo="STANDALONE", topk=1, page=16, backend="triton", **kw):
    return ServingFacts(speculative_algorithm=algo, topk=topk, page_size=page, attention_backends=(backend, backend),
                        **kw)


def acting(plan):
    return {v.name for v in plan.verdicts if v.selected and v.status in (Status.WOULD_APPLY, Status.UPSTREAM)}


FI_TREE = "default,flashinfer,eagle_host,-metadata_glue_graph,flashinfer_device_plan"
CLASSES = [
    (facts("EAGLE3", 1), "default,eagle_step_graph"),
    (facts("STANDALONE", 1), "default,eagle_step_graph"),
    (facts("EAGLE3", 4), "default,eagle_host"),
    (facts("STANDALONE", 4), "default,eagle_host"),
    (facts("STANDALONE", 4, 1), "default,eagle_host"),  # page 1 (2026-12-06-h100-final)
    (facts("EAGLE3", 3, 1), "default,eagle_host"),
    (facts("STANDALONE", 1, backend="flashinfer"), "default,flashinfer,eagle_host,-metadata_glue_graph"),
    (facts("EAGLE", 4, backend="flashinfer"), FI_TREE),
    (facts("EAGLE3", 2, backend="flashinfer"), FI_TREE),  # the device plan from topk 2 on (2026-12-07-h100-f)
    (facts("NGRAM", 1, 1), "default,eagle_host,ngram_host"),
    (facts("STANDALONE", 1, 1), "default,eagle_step_graph"),  # topk 1, page 1 (2026-12-07-h100-c)
    (facts("EAGLE3", 1, 1), "default,eagle_step_graph"),
    (facts("NGRAM", 1, 1, backend="flashinfer"), "default"),  # measured: default is the fastest at c1
    (facts("DFLASH", None), "default,dflash_step_graph"),  # 2026-12-07-h100-b and -c
    (facts("DSPARK", None), "default,dspark_step_graph"),
]
UNMEASURED = [
    facts("STANDALONE", 4, 1, backend="flashinfer"),  # page 1 on FlashInfer
    facts("EAGLE", 4, backend="fa3"),
    facts("EAGLE", 1, tp_size=2),
    facts("EAGLE", 1, dp_attention=True),
    facts("EAGLE", 1, pp_size=2),
    facts("EAGLE", 4, disaggregation_mode="decode"),
    facts("EAGLE", 1, disable_overlap_schedule=True),
    facts("EAGLE", 1, disable_cuda_graph=True),
    facts("EAGLE", 4, draft_attention_backend="flashinfer"),
    facts("FROZEN_KV_MTP", 1),
    facts("DFLASH", None, 1),  # page 1
    facts("DSPARK", None, backend="flashinfer"),
    facts("NGRAM", 1, 16),
    facts("NGRAM", 1, 16, backend="flashinfer"),
    ServingFacts(),  # no speculative decoding
]


@pytest.mark.parametrize("f, spec", CLASSES)
def test_each_measured_class_gets_its_fastest_verified_set_and_acts_as_that_set_pinned(f, spec):
    picked = choice.pick(f)
    assert picked.spec == spec and picked.evidence, picked
    auto = plans.resolve({config.ENV_SLOTS: "auto"}, facts=f)
    pinned = plans.resolve({config.ENV_SLOTS: spec}, facts=f)
    assert not auto.refused() and not pinned.refused(), (auto.refused(), pinned.refused())
    assert acting(auto) == acting(pinned)
    assert auto.choice.endswith(f"pin it with SGLANG_HOSTSYNC_SLOTS={spec}") and picked.label in auto.choice
    # Each slot the pick leaves out says so (an inert one says that first).
    for v in auto.verdicts:
        if v.selected and v.name not in set(config.parse_slot_spec(spec, CATALOGUE).names):
            assert v.status is Status.SKIPPED, v
            assert "not picked by auto" in v.reason or v.reason.startswith("inert because"), v


@pytest.mark.parametrize("f", UNMEASURED)
def test_a_configuration_nobody_measured_gets_default_and_says_so(f):
    picked = choice.pick(f)
    assert picked.spec == "default" and picked.evidence is None and picked.label.startswith("not measured"), picked
    auto = plans.resolve({config.ENV_SLOTS: "auto"}, facts=f)
    assert acting(auto) == acting(plans.resolve({}, facts=f))
    assert "the conservative set" in auto.choice and auto.choice.endswith("SGLANG_HOSTSYNC_SLOTS=default")


def test_no_pick_holds_a_conflicting_or_unsafe_pair():
    from sglang_hostsync_plugin import checks

    for row in choice.ROWS:
        names = set(config.parse_slot_spec(row.choice.spec, CATALOGUE).names)  # raises on a conflict
        for name in names:
            assert not set(CATALOGUE[name].conflicts) & names, (row.choice.spec, name)
        assert not checks.claim_conflicts([CATALOGUE[n] for n in names]), row.choice.spec  # two hooks on one target


def test_picks_that_hook_one_target_wait_for_the_facts_behind_their_gates():
    """eagle_step_graph, dflash_step_graph and dspark_step_graph all hook the graph runner's capture and
    replay. Before the facts choose a pick (a process that hooks at load_plugins()), all three are
    installed, and the facts leave one acting; named together by the user, they are refused as before."""
    from sglang_hostsync_plugin import checks

    graphs = {"eagle_step_graph", "dflash_step_graph", "dspark_step_graph"}
    assert checks.claim_conflicts([CATALOGUE[n] for n in graphs]).keys() == graphs
    bare = plans.resolve({config.ENV_SLOTS: "auto"})
    assert bare.choice is None and graphs <= acting(bare), [bare.verdict(n) for n in graphs]
    for f, graph in ((facts("EAGLE3", 1), "eagle_step_graph"), (facts("DFLASH", None), "dflash_step_graph"),
                     (facts("DSPARK", None), "dspark_step_graph"), (facts("EAGLE3", 4), None)):
        late = bare.with_facts(CATALOGUE, f)
        assert acting(late) & graphs == ({graph} if graph else set()), (f.speculative_algorithm, acting(late) & graphs)
        assert acting(late) == acting(plans.resolve({config.ENV_SLOTS: "auto"}, facts=f))
    # A step graph the user names beside auto waits with the rest, and acts on its own server.
    for graph, f in (("eagle_step_graph", facts("EAGLE3", 1)), ("dflash_step_graph", facts("DFLASH", None)),
                     ("dspark_step_graph", facts("DSPARK", None))):
        named = plans.resolve({config.ENV_SLOTS: f"auto,{graph}"})
        assert graphs <= acting(named), [named.verdict(n) for n in graphs]
        for other in (facts("EAGLE3", 1), facts("DFLASH", None), facts("DSPARK", None)):
            late = named.with_facts(CATALOGUE, other)
            late.check_startup()  # strict: nothing refused
            assert acting(late) == acting(plans.resolve({config.ENV_SLOTS: f"auto,{graph}"}, facts=other))
            assert len(acting(late) & graphs) == 1
        named.settle_auto(CATALOGUE).check_startup()  # no facts ever came: default and the user's graph
        assert acting(named.settle_auto(CATALOGUE)) & graphs == {graph}
    # Named together without auto: refused as before, facts or not.
    pinned = plans.resolve({config.ENV_SLOTS: "default,eagle_step_graph,dflash_step_graph"})
    assert {v.status for v in pinned.verdicts if v.name in ("eagle_step_graph", "dflash_step_graph")} == {Status.FAILED}
    assert "conflicts with slot(s)" in pinned.verdict("eagle_step_graph").reason
    # Once the pick is made, two acting claimants are both refused (as a plan made with the facts refuses them).
    both = tuple(dataclasses.replace(v, status=Status.WOULD_APPLY, reason="") if v.name in graphs - {"dspark_step_graph"}
                 else v for v in bare.verdicts)
    refused = {v.name: v for v in plans.refuse_claims(both, CATALOGUE) if v.status is Status.FAILED}
    assert {"eagle_step_graph", "dflash_step_graph"} <= refused.keys()
    assert "both hook" in refused["eagle_step_graph"].reason


def test_every_pick_names_results_folders_that_exist_with_a_readme():
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for row in choice.ROWS:
        folders = [p.strip() for p in row.choice.evidence.split(",")]
        assert folders and row.choice.gain, row.choice
        for folder in folders:
            assert folder.startswith("benchmarks/results/"), (row.choice.label, folder)
            assert os.path.isfile(os.path.join(repo, folder, "README.md")), (row.choice.label, folder)


def test_the_conflict_cases_are_left_to_the_pick():
    # FlashInfer topk 4: eagle_host's glue graph would freeze the host-planned verify.
    fi4 = facts("EAGLE", 4, backend="flashinfer")
    assert plans.resolve({config.ENV_SLOTS: "default,eagle_host"}, facts=fi4).config_errors()
    auto = plans.resolve({config.ENV_SLOTS: "auto"}, facts=fi4)
    assert not auto.config_errors() and "metadata_glue_graph" not in acting(auto)
    assert {"flashinfer_tree_verify_plan", "flashinfer_plan_guard"} <= acting(auto)
    # Topk 1 triton: the step graph cannot run beside eagle_host's glue graphs.
    t1 = facts("EAGLE3", 1)
    assert plans.resolve({config.ENV_SLOTS: "default,eagle_host,eagle_step_graph"}, facts=t1).config_errors()
    auto = plans.resolve({config.ENV_SLOTS: "auto"}, facts=t1)
    assert "eagle_step_graph" in acting(auto) and not acting(auto) & {
        "metadata_glue_graph", "draft_extend_glue_graph", "draft_decode_glue_graph"}
    assert "not picked by auto for EAGLE family, topk 1" in auto.verdict("metadata_glue_graph").reason


def test_claimants_of_different_picks_wait_only_as_plain_function_hooks():
    """An edit site's parts or a class override compose with no other claimant (installer): across picks
    they are refused as before, the plain hooks of the same two slots are not."""
    pair = [CATALOGUE["eagle_step_graph"], CATALOGUE["dflash_step_graph"]]
    assert plans.claim_conflicts(pair, "auto", CATALOGUE, open_pick=True) == {}
    assert plans.claim_conflicts(pair, "auto", CATALOGUE, open_pick=False).keys() == {s.name for s in pair}
    as_site = [dataclasses.replace(s, targets=tuple(dataclasses.replace(t, site=object(), needs_upstream_original=True)
                                                    if t.path.endswith("capture_one")
                                                    else t for t in s.targets)) for s in pair]  # a site each
    assert plans.claim_conflicts(as_site, "auto", CATALOGUE, open_pick=True).keys() == {s.name for s in pair}


@pytest.mark.parametrize("f, graph", [(facts("EAGLE3", 1), "eagle_step_graph"), (facts("DFLASH", None), "dflash_step_graph"),
                                      (facts("DSPARK", None), "dspark_step_graph"), (facts("EAGLE3", 4), None),
                                      (None, None)], ids=["eagle3-t1", "dflash", "dspark", "eagle3-t4", "no-facts"])
def test_a_bare_plan_installs_the_step_graphs_behind_one_exclusive_hook_and_the_pick_leaves_one(f, graph):
    """A process that hooks before the facts (no launcher plan): one registration per shared target with
    the three step graphs behind it, and once the plan settles at most the pick's own acts."""
    from sglang_hostsync_plugin import installer, runtime

    graphs = {"eagle_step_graph", "dflash_step_graph", "dspark_step_graph"}
    bare = plans.resolve({config.ENV_SLOTS: "auto"})
    rt = runtime.Runtime()
    registered = {}
    installer.install(rt.state, bare, CATALOGUE, lambda path, hook, kind: registered.setdefault(path, hook))
    for target in ("capture_one", "replay"):
        (hook,) = [h for p, h in registered.items() if p.endswith(f"FullCudaGraphBackend.{target}")]
        assert hook.__qualname__.endswith(".exclusive") and all(g in hook.__qualname__ for g in graphs), hook
    assert graphs <= rt.state.active
    rt.plan = bare.with_facts(CATALOGUE, f) if f is not None else bare
    runtime._settle(rt, bare)
    assert rt.state.active & graphs == ({graph} if graph else set())


def test_auto_waits_for_sglangs_resolution_then_narrows_to_the_same_plan():
    env = {config.ENV_SLOTS: "auto"}
    resolved = facts("EAGLE3", 1)
    early = plans.resolve(env, facts=facts("EAGLE3", None, 16, None))  # topk and backend left to SGLang
    assert early.choice is None and not early.refused()  # the unsafe pairs of the union wait too
    assert {"eagle_step_graph", "metadata_glue_graph"} <= acting(early)
    assert "decided once SGLang has resolved" in doctor.auto_line(early)
    late = plans.Plan.from_json(early.to_json()).with_facts(CATALOGUE, resolved)
    direct = plans.resolve(env, facts=resolved)
    assert [(v.name, v.status) for v in late.verdicts] == [(v.name, v.status) for v in direct.verdicts]
    assert late.choice == direct.choice and "eagle_step_graph" in late.choice
    # Once decided, the pick stays (a refinement only resolves values that were unknown).
    assert plans.Plan.from_json(late.to_json()).choice == late.choice
    # Without any facts (a process that hooks at load_plugins()): every slot auto may pick is selected.
    bare = plans.resolve(env)
    assert set(bare.selected) == choice.row_names(CATALOGUE, config.parse_slot_spec) and bare.choice is None


def test_the_users_other_tokens_stay_and_are_in_the_pinned_line():
    env = {config.ENV_SLOTS: "auto,-event_ring"}
    auto = plans.resolve(env, facts=facts("EAGLE3", 1))
    assert "event_ring" not in acting(auto) and "eagle_step_graph" in acting(auto)
    assert auto.choice.endswith("SGLANG_HOSTSYNC_SLOTS=default,eagle_step_graph,-event_ring")
    pinned = plans.resolve({config.ENV_SLOTS: "default,eagle_step_graph,-event_ring"}, facts=facts("EAGLE3", 1))
    assert acting(pinned) == acting(auto)


def test_without_auto_nothing_changes():
    plan = plans.resolve({config.ENV_SLOTS: "default,eagle_host"}, facts=facts("EAGLE3", 1))
    assert plan.choice is None and doctor.auto_line(plan) is None
    assert not any("auto" in v.reason for v in plan.verdicts)


def test_the_doctor_prints_the_pick(monkeypatch, capsys):
    monkeypatch.setenv(config.ENV_SLOTS, "auto")
    argv = ["doctor", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4", "--page-size", "16",
            "--attention-backend", "triton"]
    assert doctor.main(argv) == 0
    text = capsys.readouterr().out
    assert "auto: EAGLE family, topk > 1, triton, page > 1" in text
    assert "SGLANG_HOSTSYNC_SLOTS=default,eagle_host" in text.replace("\n  ", " ")
    assert doctor.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["choice"].endswith("SGLANG_HOSTSYNC_SLOTS=default,eagle_host")


def test_the_doctor_names_autos_pick_to_a_selection_without_auto(monkeypatch, capsys):
    argv = ["doctor", "--speculative-algorithm", "DFLASH", "--page-size", "16", "--attention-backend", "triton"]
    monkeypatch.setenv(config.ENV_SLOTS, "default")
    assert doctor.main(argv) == 0
    text = capsys.readouterr().out.replace("\n  ", " ")
    assert "hint: SGLANG_HOSTSYNC_SLOTS=auto (or unset) picks default,dflash_step_graph here (DFlash, triton" in text
    for spec, f in (("auto", facts("DFLASH", None)), ("default,dflash_step_graph", facts("DFLASH", None)),
                    ("default", facts("EAGLE", 4, backend="fa3")), ("default", None)):  # unmeasured: nothing to say
        assert doctor.auto_hints(plans.resolve({config.ENV_SLOTS: spec}, facts=f), f) == [], spec


@pytest.mark.parametrize("extra, label", [(["--pp-size", "2"], "pipeline parallel"),
                                          (["--disaggregation-mode", "decode"], "PD disaggregation (decode)")])
def test_pipeline_parallel_and_pd_servers_are_unmeasured_in_sglangs_args_and_the_doctors(monkeypatch, capsys, extra,
                                                                                         label):
    from sglang.srt.server_args import prepare_server_args

    argv = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4", "--page-size", "16",
            "--attention-backend", "triton"]
    f = ServingFacts.from_server_args(prepare_server_args(["--model-path", "dummy", "--speculative-draft-model-path",
                                                           "dummy", *argv, *extra]), {})
    assert choice.pick(f).label == f"not measured ({label})"
    assert choice.pick(ServingFacts.from_server_args(prepare_server_args(
        ["--model-path", "dummy", "--speculative-draft-model-path", "dummy", *argv]), {})).spec == "default,eagle_host"
    monkeypatch.setenv(config.ENV_SLOTS, "auto")
    assert doctor.main(["doctor", *argv, *extra, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"].startswith(f"auto: not measured ({label})")


@pytest.mark.parametrize("algorithm, picks, left_out", [
    ("STANDALONE", "default,eagle_step_graph", "draft_extend_glue_graph"),  # SGLang resolves topk 1
    ("EAGLE", "default,eagle_host", "eagle_step_graph"),  # SGLang resolves topk 4
])
def test_the_launcher_decides_auto_once_sglang_resolved_the_topk_and_a_scheduler_applies_the_pick(
        algorithm, picks, left_out):
    """The user leaves the topk to SGLang: the launcher's plan (prepare_server_args) cannot decide
    the class, selects every slot a pick may hold and refuses no pair; the gate refines it with the
    resolved topk, and a scheduler child installs exactly the pick."""
    from helpers import REPO, clean_env, out, run_process
    from test_pipeline import AUTO_TOPK_LAUNCH, CHILD

    proc = run_process([sys.executable, "-c", AUTO_TOPK_LAUNCH, algorithm, CHILD], cwd=REPO, timeout=600,
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="auto",
                                     PYTHONPATH=f"{REPO}/tests"))
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["before"][0] is None  # the topk was unknown to the first plan
    child = json.loads(res["child"])
    assert child["err"] is None, res["child_err"]
    assert child["plan"]["choice"].endswith(f"pin it with SGLANG_HOSTSYNC_SLOTS={picks}"), child["plan"]["choice"]
    status = child["status"]
    assert status[left_out][0] == "skipped", status[left_out]
    if algorithm == "STANDALONE":
        assert "not picked by auto" in status[left_out][1]
        assert status["eagle_step_graph"][0] == "applied", status["eagle_step_graph"]
    else:
        assert status["draft_extend_glue_graph"][0] == "applied" and status["eagle_fixed_shape_tail"][0] == "applied"
    assert "hostsync: auto: EAGLE family" in proc.stderr, out(proc)
    # The launcher's first plan lists no union as its slots.
    assert "hostsync: enabled; slots: auto, picked once SGLang has resolved the server arguments" in proc.stderr


def test_the_users_positive_tokens_stay_beside_the_pick():
    f = facts("EAGLE3", 1)
    auto = plans.resolve({config.ENV_SLOTS: "auto,pinned_d2h_ring"}, facts=f)
    assert {"pinned_d2h_ring", "eagle_step_graph"} <= acting(auto)
    assert auto.choice.endswith("SGLANG_HOSTSYNC_SLOTS=default,eagle_step_graph,pinned_d2h_ring")
    pinned = plans.resolve({config.ENV_SLOTS: "default,eagle_step_graph,pinned_d2h_ring"}, facts=f)
    assert acting(pinned) == acting(auto)


def test_negating_a_slot_some_pick_requires_is_checked_on_the_pick_only():
    env = {config.ENV_SLOTS: "auto,-ngram_accept_readback"}  # ngram_host's slots require it
    assert plans.resolve(env, facts=facts("EAGLE3", 4)).choice.endswith("default,eagle_host,-ngram_accept_readback")
    with pytest.raises(config.HostsyncConfigError, match="requires slot 'ngram_accept_readback'"):
        plans.resolve(env, facts=facts("NGRAM", 1, 1))
    # As pinned: what the pinning value would refuse, auto refuses (default's FlashInfer verify needs the guard).
    with pytest.raises(config.HostsyncConfigError, match="requires slot 'flashinfer_plan_guard'"):
        plans.resolve({config.ENV_SLOTS: "auto,-flashinfer_plan_guard"}, facts=facts("EAGLE3", 4))


def test_a_slot_only_auto_brings_in_never_stops_a_strict_startup(monkeypatch):
    from sglang_hostsync_plugin import checks

    real = checks.check_slot
    monkeypatch.setattr(checks, "check_slot",
                        lambda slot: "source of its target changed" if slot.name == "eagle_step_graph" else real(slot))
    env = {config.ENV_SLOTS: "auto"}
    early = plans.resolve(env, facts=facts("EAGLE3", 1, None, None))  # page size and backend left to SGLang
    assert early.verdict("eagle_step_graph").status is Status.FAILED and early.strict
    early.check_startup()  # the pick may not hold it: no refusal yet
    on_flashinfer = early.with_facts(CATALOGUE, facts("EAGLE3", 1, backend="flashinfer"))
    assert on_flashinfer.verdict("eagle_step_graph").status is Status.SKIPPED  # inert there, and not picked
    on_flashinfer.check_startup()
    # A FlashInfer draft beside a triton target: not measured, default.
    draft_fi = early.with_facts(CATALOGUE, facts("EAGLE3", 1, draft_attention_backend="flashinfer"))
    assert "not picked by auto" in draft_fi.verdict("eagle_step_graph").reason
    draft_fi.check_startup()
    # Picked, but only the pick brought it in (not default, not named): reported, never a strict stop,
    # so an unset SGLANG_HOSTSYNC_SLOTS never stops a startup that `default` would have started.
    on_triton = early.with_facts(CATALOGUE, facts("EAGLE3", 1))
    assert on_triton.verdict("eagle_step_graph").status is Status.FAILED and on_triton.strict
    assert on_triton.waived_by_auto(["eagle_step_graph", "event_ring"]) == {"eagle_step_graph"}
    on_triton.check_startup()
    # Named by the user beside auto, it stops a strict startup as any selected slot does.
    named = plans.resolve({config.ENV_SLOTS: "auto,eagle_step_graph"}, facts=facts("EAGLE3", 1))
    with pytest.raises(plans.HostsyncStartupError, match="eagle_step_graph"):
        named.check_startup()


def test_a_pick_still_open_where_the_plan_must_be_final_is_default_and_says_so():
    env = {config.ENV_SLOTS: "auto,-event_ring"}
    open_ = plans.resolve(env, facts=facts("EAGLE3", 1, None, None))
    assert open_.auto_pending and "metadata_glue_graph" in acting(open_)
    settled = open_.settle_auto(CATALOGUE)
    assert not settled.auto_pending and "left the configuration open" in settled.choice
    assert settled.choice.endswith("SGLANG_HOSTSYNC_SLOTS=default,-event_ring")
    assert acting(settled) <= set(config.parse_slot_spec("default,-event_ring", CATALOGUE).names)
    assert "metadata_glue_graph" not in acting(settled) and "event_ring" not in acting(settled)
    assert settled.settle_auto(CATALOGUE) is settled


def test_the_refinement_reads_the_users_environment_not_the_flags_the_plugin_set(monkeypatch):
    """The launcher's first (undecided) plan turned on every switch auto may pick; refining it must not
    read those flags as the user's (a FlashInfer guard kept, a glue-graph warning about our own flag)."""
    import os

    from sglang_hostsync_plugin import runtime, switches

    flag = CATALOGUE["flashinfer_verify_host_plan"].env_flag
    monkeypatch.delenv(flag, raising=False)
    monkeypatch.setattr(switches, "_set_here", set())
    env = {config.ENV_SLOTS: "auto"}
    early = plans.resolve(env, facts=facts("EAGLE", 1, None, None))
    monkeypatch.setattr(plans, "inherited", lambda env=None: early)
    monkeypatch.setattr(plans, "export", lambda plan, env=None: None)
    seen = []
    resolved = facts("EAGLE", 1, 1, "flashinfer")  # page 1: not measured, so default
    monkeypatch.setattr(runtime.ServingFacts, "from_server_args",
                        classmethod(lambda cls, args, e: seen.append(dict(e)) or
                                    ServingFacts(**{**resolved.__dict__, "env": dict(e)})))
    switches.apply([CATALOGUE["flashinfer_verify_host_plan"]])  # as the first plan's switches did
    try:
        refined = runtime.refine_exported(object())
    finally:
        switches.clear_own()
    assert seen and flag not in seen[0] and os.environ.get(flag) is None
    assert refined.verdict("flashinfer_plan_guard").status is Status.SKIPPED, refined.verdict("flashinfer_plan_guard")


def test_the_prebuild_waits_for_the_pick(monkeypatch):
    """The launcher's first plan selects every slot some pick may hold: no kernel is built for it; the
    refinement that decides the pick starts the build for the pick's slots."""
    from sglang_hostsync_plugin import csrc, runtime, switches

    started = []
    monkeypatch.setattr(csrc, "start_prebuild", lambda names: started.append(names))
    monkeypatch.setattr(runtime, "kernels_for", lambda slots, f: tuple(sorted(s.name for s in slots)))
    monkeypatch.setattr(switches, "_set_here", set())
    early = plans.resolve({config.ENV_SLOTS: "auto"}, facts=facts("EAGLE", None, None, None))
    assert early.auto_pending
    runtime._prebuild(early, facts("EAGLE", None, None, None))
    assert started == []
    monkeypatch.setattr(plans, "inherited", lambda env=None: early)
    monkeypatch.setattr(plans, "export", lambda plan, env=None: None)
    resolved = facts("EAGLE", 4)
    monkeypatch.setattr(runtime.ServingFacts, "from_server_args",
                        classmethod(lambda cls, args, e: ServingFacts(**{**resolved.__dict__, "env": dict(e)})))
    try:
        refined = runtime.refine_exported(object())
    finally:
        switches.clear_own()
    assert refined.choice.endswith("SGLANG_HOSTSYNC_SLOTS=default,eagle_host")
    (built,) = started
    assert "eagle_fixed_shape_tail" in built and "eagle_step_graph" not in built
    assert set(built) == acting(refined) - {v.name for v in refined.verdicts if v.status is Status.UPSTREAM}


def test_user_tokens_bad_beside_the_fallback_stop_the_launcher_before_any_pick():
    # The guard is required by default's FlashInfer verify plan, so by every pick: refused with no facts at all.
    with pytest.raises(config.HostsyncConfigError, match="requires slot 'flashinfer_plan_guard'"):
        plans.resolve({config.ENV_SLOTS: "auto,-flashinfer_plan_guard"})
    plans.resolve({config.ENV_SLOTS: "auto,-ngram_accept_readback"})  # bad only beside the NGRAM pick


def test_the_doctors_preset_hint_counts_slots_auto_left_out_as_off(monkeypatch):
    monkeypatch.setenv(config.ENV_SLOTS, "auto")
    f = facts("NGRAM", 1, 1, "flashinfer")  # not measured: auto picks default, ngram_host's slots left out
    plan = plans.resolve({config.ENV_SLOTS: "auto"}, facts=f)
    assert plan.verdict("ngram_full_mask").left_out_by_auto
    (hint,) = [h for h in doctor.preset_hints(plan, CATALOGUE, f) if "ngram_host" in h]
    assert hint.startswith("SGLANG_HOSTSYNC_SLOTS=auto,ngram_host also turns on ngram_full_mask, ngram_late_wait (")
    on_triton = plans.resolve({config.ENV_SLOTS: "auto"}, facts=facts("NGRAM", 1, 1))  # picked there
    assert not [h for h in doctor.preset_hints(on_triton, CATALOGUE, facts("NGRAM", 1, 1)) if "ngram_host" in h]


COUNTED_LAUNCH = """
import collections, json, sys, tempfile
from sglang_hostsync_plugin import plan as plans, slot
calls = collections.Counter()
def counted(owner, name, wrap):
    original = getattr(owner, name)
    def call(*a, **k):
        calls[name] += 1
        return original(*a, **k)
    setattr(owner, name, wrap(call) if wrap else call)
counted(slot.ServingFacts, "from_server_args", lambda f: classmethod(lambda cls, *a, **k: f(*a, **k)))
counted(plans, "resolve", None)
counted(plans.Plan, "with_facts", None)
from sglang.srt.entrypoints import engine
try:
    engine.Engine(not_a_server_arg=1)  # loads the plugins, as a launcher does
except TypeError:
    pass
from sglang_hostsync_plugin.e2e import matrix
models = matrix.write_models(tempfile.mkdtemp())
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(["--model-path", models["target"], "--load-format", "dummy", "--speculative-algorithm",
                            "STANDALONE", "--speculative-draft-model-path", models["draft"], "--page-size", "16",
                            "--attention-backend", "triton", "--skip-tokenizer-init", "--device", "cuda"])
args.resolve_once()
engine._set_envs_and_config(args)
print("RESULT" + json.dumps(calls))
"""


def test_the_launcher_computes_the_plan_once_and_refines_it_once():
    """One launch: the server facts are read before SGLang's resolution (bad input fails there, before any
    model load) and once after it; the plan is resolved once and refined once."""
    from helpers import REPO, clean_env, out, run_process

    proc = run_process([sys.executable, "-c", COUNTED_LAUNCH], cwd=REPO, timeout=600,
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="auto"))
    assert proc.returncode == 0, out(proc)
    calls = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert calls == {"from_server_args": 2, "resolve": 1, "with_facts": 2}, calls


def test_the_users_switch_flags_are_checked_against_what_auto_keeps_not_its_union():
    """Unset is auto: a user's own SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH=0 must not stop a server whose pick
    does not hold fill_fast_path (a non-speculative server, topk 1 on triton); where the pick holds it (topk 4
    on triton: eagle_host), it is bad input as for an explicit selection, found once the pick is known."""
    env = {"SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH": "0"}
    for f in (ServingFacts(), facts("EAGLE3", 1), facts("EAGLE3", 1, None, None)):
        plans.resolve(env, facts=f).check_startup()
    with pytest.raises(config.HostsyncConfigError, match="fill_fast_path"):
        plans.resolve(env, facts=facts("EAGLE3", 4))
    with pytest.raises(config.HostsyncConfigError, match="fill_fast_path"):
        plans.resolve({**env, config.ENV_SLOTS: "default,eagle_host"}, facts=ServingFacts())  # explicit: as before


def test_an_open_pick_sets_no_switch_flag_and_the_launcher_settles_it_before_spawning(monkeypatch):
    """While auto's class is open the plan lists every row's switches (some unsafe together): none of their
    flags is set; if SGLang's resolution leaves the class open, the launcher's refinement settles the pick
    (default) before the schedulers are spawned, so they inherit a final plan."""
    from sglang_hostsync_plugin import runtime, switches

    monkeypatch.setattr(switches, "_set_here", set())
    applied = []
    monkeypatch.setattr(switches, "apply", lambda slots: applied.extend(s.name for s in slots))
    open_ = plans.resolve({}, facts=facts("EAGLE3", 1, None, None))
    assert open_.auto_pending and {"metadata_glue_graph", "fill_fast_path"} <= acting(open_)
    runtime._set_switch_flags(open_)
    assert applied == []
    exported = {}
    monkeypatch.setattr(plans, "inherited", lambda env=None: exported.get("plan") or open_.with_facts(
        CATALOGUE, facts("EAGLE3", 1, None, None)))
    monkeypatch.setattr(plans, "export", lambda plan, env=None: exported.update(plan=plan))
    monkeypatch.setattr(runtime, "_prebuild", lambda plan, f: None)
    monkeypatch.setattr(runtime.ServingFacts, "from_server_args",
                        classmethod(lambda cls, args, env=None: facts("EAGLE3", 1, None, None)))
    refined = runtime.refine_exported(object())
    assert refined is not None and not refined.auto_pending and exported["plan"] is refined
    assert "left the configuration open" in refined.choice and "metadata_glue_graph" not in acting(refined)
    assert not {"metadata_glue_graph", "fill_fast_path"} & set(applied)


@pytest.mark.parametrize("f", [
    facts("DFLASH", None, None, None, tp_size=2), facts("DSPARK", None, None, None, disable_overlap_schedule=True),
    facts("FROZEN_KV_MTP", 1, None, None), facts("EAGLE", None, None, None, tp_size=2), facts("EAGLE", None, None, None, disable_cuda_graph=True),
    facts("NGRAM", None, None, None, dp_attention=True), facts("EAGLE3", 1, enable_lora=True),
    facts("EAGLE3", 4, enable_pdmux=True), facts("EAGLE3", 1, moe_counts=True)])
def test_what_no_row_can_cover_is_decided_before_sglang_resolves_the_rest(f):
    """An algorithm no row covers, or a server unlike every measured one, gets default at once: no open
    pick (its union, the prebuild waiting) while the backends or topk are still unknown."""
    picked = choice.pick(f)
    assert picked is not None and picked.spec == "default" and picked.evidence is None, picked
    assert not plans.resolve({}, facts=f).auto_pending


def test_the_doctor_reads_a_whole_server_command_line(monkeypatch, capsys):
    """The README's advice, taken literally: the server's own command line, the plugin's flag and SGLang's
    other arguments included. What the plugin's checks do not read is named on stderr, not refused; what it
    does read (CUDA graphs off) changes the pick."""
    monkeypatch.setenv(config.ENV_SLOTS, "auto")
    argv = ["doctor", "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "d", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
            "--speculative-num-draft-tokens", "8", "--page-size", "16", "--attention-backend", "flashinfer",
            "--mem-fraction-static", "0.8", "--enable-hostsync-plugin"]
    assert doctor.main(argv) == 0
    out = capsys.readouterr()
    # The value to paste back stays on one line, however long (the wrap does not cut a word).
    assert any(f"SGLANG_HOSTSYNC_SLOTS={FI_TREE}" in line for line in out.out.splitlines())
    assert ("not read by the plugin's checks (SGLang's own): --model-path meta-llama/Llama-3.1-8B-Instruct "
            "--speculative-draft-model-path d --speculative-num-draft-tokens 8 --mem-fraction-static 0.8") in out.err
    assert doctor.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"].endswith(f"SGLANG_HOSTSYNC_SLOTS={FI_TREE}")
    assert doctor.main([*argv, "--disable-cuda-graph"]) == 0
    assert "auto: not measured" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # another subcommand keeps refusing what it does not know
        doctor.main(["prebuild", "--model-path", "m"])


def test_under_a_decided_auto_the_doctor_lists_what_the_pick_runs(monkeypatch, capsys):
    """The header and the selected column: the pick's slots, as with its pinned value, not every row's union;
    the union's others read `no (auto)`."""
    argv = ["doctor", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4", "--page-size", "16",
            "--attention-backend", "flashinfer"]

    def header_and_rows(spec):
        monkeypatch.setenv(config.ENV_SLOTS, spec)
        assert doctor.main(argv) == 0
        text = capsys.readouterr().out
        head = text.split("slot ", 1)[0].replace("\n  ", " ")
        return head.split(" selects: ", 1)[1].split("; strict=")[0], text

    picked, text = header_and_rows("auto")
    pinned, _ = header_and_rows(FI_TREE)
    assert picked == pinned and "dflash_step_graph" not in picked and "metadata_glue_graph" not in picked
    rows = {line.split()[0]: line.split()[1:3] for line in text.splitlines() if line[:1].isalpha() and "  " in line}
    assert rows["metadata_glue_graph"] == ["no", "(auto)"] and rows["dflash_step_graph"] == ["no", "(auto)"]
    assert rows["flashinfer_tree_verify_plan"][0] == "yes"


def test_the_status_line_does_not_lend_the_picks_gain_to_a_set_the_user_changed():
    picked = choice.pick(facts("EAGLE3", 1))
    assert ", for " not in choice.line(picked, "auto")
    line = choice.line(picked, "auto,-eagle_step_graph")
    assert f"for {picked.spec} itself: your other tokens change that set, not measured" in line
    assert line.endswith(f"SGLANG_HOSTSYNC_SLOTS={picked.spec},-eagle_step_graph")
