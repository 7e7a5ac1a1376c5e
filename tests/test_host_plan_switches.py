"""The switch slots for SGLang 0.5.23's own metadata-prep opt-ins (metadata glue graph,
FlashInfer host plans): each inert rule against the server arguments, read through
SGLang's real argument preparation, the conditions still being in SGLang's code, and
the glue graph's conflict with the host-fed verify plan."""

import inspect

import pytest

from sglang_hostsync_plugin import config, registry
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import upstream_host_plans as hp

CATALOGUE = registry.catalogue()


def facts(*argv):
    from sglang.srt.server_args import prepare_server_args

    return ServingFacts.from_server_args(prepare_server_args(["--model-path", "dummy", *argv]), {})


EAGLE = ("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "dummy")


@pytest.mark.parametrize("argv, inert", [
    (EAGLE, None),
    ((*EAGLE, "--disable-cuda-graph"), "--disable-cuda-graph"),
    (("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "dummy"), "DFlash family"),
    ((*EAGLE, "--enable-lora"), "LoRA"),
    ((), None),  # plain decode replays are glued too
])
def test_glue_graph_inert_rules(argv, inert):
    reason = hp.glue_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


@pytest.mark.parametrize("argv, inert", [
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer"), None),
    ((*EAGLE, "--speculative-eagle-topk", "1"), None),  # backend chosen later: not decided here
    ((*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "flashinfer"), "topk is 4"),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "triton"), "not flashinfer"),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer", "--kv-cache-dtype", "nvfp4"),
     "kv-cache-dtype is nvfp4"),
    (("--speculative-algorithm", "NGRAM", "--attention-backend", "flashinfer"), "only EAGLE-family"),
])
def test_verify_host_plan_inert_rules(argv, inert):
    reason = hp.verify_host_plan_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


@pytest.mark.parametrize("argv, inert", [
    ((*EAGLE, "--attention-backend", "flashinfer"), None),
    ((*EAGLE, "--attention-backend", "flashinfer", "--speculative-draft-window-size", "64"), "window-size is 64"),
    ((*EAGLE, "--attention-backend", "flashinfer", "--speculative-draft-attention-backend", "triton"),
     "draft attention backend is triton"),
    ((), "only the EAGLE multi-step draft"),
])
def test_draft_host_indptr_inert_rules(argv, inert):
    reason = hp.draft_host_indptr_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


def test_the_conditions_are_the_ones_in_sglang():
    from sglang.srt.layers.attention import flashinfer_backend as fb
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr

    runner = inspect.getsource(dcgr.DecodeCudaGraphRunner)
    # The glue route and the DFlash force-off the glue rules mirror.
    for text in ("envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH.get()", "model_runner.spec_algorithm.is_dflash_family()",
                 "and not self.enable_two_batch_overlap", "and not self.enable_pdmux",
                 "and self.model_runner.lora_manager is None", "and raw_bs == bs"):
        assert text in runner, text
    backend = inspect.getsource(fb)
    for text in ("envs.SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN.get()", "spec_info.topk == 1",
                 'self.prefill_backend == "fa2"', "self.dispatch_reason is None",
                 "envs.SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR.get()", "self.draft_window_size == 0"):
        assert text in backend, text


def test_glue_graph_and_host_fed_verify_plan_cannot_be_selected_together():
    with pytest.raises(config.HostsyncConfigError, match="conflict"):
        config.parse_slot_spec("default,metadata_glue_graph,flashinfer_verify_host_plan", CATALOGUE)
    assert "metadata_glue_graph" in config.parse_slot_spec("default,metadata_glue_graph", CATALOGUE).names
    for name in ("metadata_glue_graph", "flashinfer_verify_host_plan", "flashinfer_draft_host_indptr"):
        slot = CATALOGUE[name]
        assert not slot.default and slot.precheck() is None and name not in slot.presets


def _plan(spec, *argv):
    from sglang_hostsync_plugin import plan as plans

    return plans.resolve({config.ENV_ENABLE: "1", config.ENV_SLOTS: spec}, facts=facts(*argv))


FI_T4 = (*EAGLE, "--speculative-eagle-topk", "4", "--page-size", "16", "--attention-backend", "flashinfer")


@pytest.mark.parametrize("argv, refused", [
    (FI_T4, True),  # the owned host plan is active: the glue would freeze it
    ((*EAGLE, "--speculative-eagle-topk", "4", "--page-size", "16", "--attention-backend", "triton"), False),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer"), False),  # tree plan inert
])
def test_glue_graph_is_refused_beside_an_active_tree_verify_host_plan(argv, refused):
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    p = _plan("default,metadata_glue_graph", *argv)
    glue, tree = p.verdict("metadata_glue_graph"), p.verdict("flashinfer_tree_verify_plan")
    if refused:
        assert glue.status is Status.FAILED and "flashinfer_tree_verify_plan" in glue.reason
        assert "frozen" in glue.reason and tree.status is Status.WOULD_APPLY  # the default slot stays
        with pytest.raises(config.HostsyncConfigError, match="metadata_glue_graph: cannot run beside"):
            p.check_startup()
        lenient = plans.resolve({config.ENV_ENABLE: "1", config.ENV_SLOTS: "default,metadata_glue_graph",
                                 config.ENV_STRICT: "0"}, facts=facts(*argv))
        with pytest.raises(config.HostsyncConfigError):  # bad input stops startup in every mode
            lenient.check_startup()
    else:
        assert glue.status is Status.WOULD_APPLY and tree.status is Status.SKIPPED
        p.check_startup()
    # Deselecting the host plan (and its guard-free remainder) makes the glue valid again.
    p = _plan("default,metadata_glue_graph,-flashinfer_tree_verify_plan", *argv)
    assert p.verdict("metadata_glue_graph").status is Status.WOULD_APPLY


NGRAM = ("--speculative-algorithm", "NGRAM", "--page-size", "1")


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("spec", ["default,eagle_host,ngram_full_mask", "default,eagle_host,ngram_host",
                                  "default,metadata_glue_graph"])
def test_the_glue_graph_is_inert_under_ngram_whose_verify_mask_is_new_every_step(spec, backend):
    """The NGRAM presets changed greedy outputs in a real server (H100, 2026-12-06: 5 of 27 identical)
    with SGLang's glue graph on: it replays the capture step's mask. The switch sets no flag there."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    p = _plan(spec, *NGRAM, "--attention-backend", backend)
    glue = p.verdict("metadata_glue_graph")
    assert glue.status is Status.SKIPPED and "NGRAM's verify mask is a new tensor every step" in glue.reason
    assert p.refused() == [] and p.warnings() == []
    # A plan resolved before the arguments were known skips it once they are.
    early = plans.resolve({config.ENV_ENABLE: "1", config.ENV_SLOTS: spec})
    assert early.verdict("metadata_glue_graph").status is Status.WOULD_APPLY
    late = early.with_facts(CATALOGUE, facts(*NGRAM, "--attention-backend", backend))
    assert late.verdict("metadata_glue_graph").status is Status.SKIPPED and late.refused() == []


@pytest.mark.parametrize("argv, inert", [
    ((*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "aiter"), "backend is aiter"),
    ((*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "fa3"), None),  # the mask in its VerifyMask
    ((*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "triton"), None),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer"), None),
    ((*NGRAM, "--attention-backend", "triton"), "NGRAM's verify mask"),
])
def test_the_glue_graph_runs_only_where_the_verify_prep_reads_stable_buffers(argv, inert):
    reason = hp.glue_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


def test_a_users_own_glue_flag_under_ngram_is_a_warning(monkeypatch, capsys):
    """SGLang reads SGLANG_ENABLE_METADATA_GLUE_GRAPH whether or not the slot sets it: the user who
    set it under NGRAM is told, in the status block's warnings and the doctor's reason column."""
    from sglang_hostsync_plugin import doctor, plan as plans

    env = {config.ENV_ENABLE: "1", config.ENV_SLOTS: "default", hp.GLUE_FLAG: "1"}
    ngram = ServingFacts.from_server_args(_args(*NGRAM, "--attention-backend", "triton"), env)
    (warning,) = plans.resolve(env, facts=ngram).warnings()
    assert warning.startswith("metadata_glue_graph: inert because NGRAM") and "unset it" in warning
    eagle = ServingFacts.from_server_args(_args(*EAGLE, "--speculative-eagle-topk", "4",
                                                "--attention-backend", "triton"), env)
    assert plans.resolve(env, facts=eagle).warnings() == []
    monkeypatch.setenv(hp.GLUE_FLAG, "1")
    monkeypatch.setenv(config.ENV_SLOTS, "default")
    assert doctor.main(["doctor", "--speculative-algorithm", "NGRAM", "--attention-backend", "triton"]) == 0
    out = capsys.readouterr().out
    assert "warning: metadata_glue_graph: inert because NGRAM" in out


def test_the_ngram_mask_hazard_is_still_in_sglang():
    """What the NGRAM rule stands on: NGRAM's full mask is a new tensor every step, triton's verify prep
    copies ``spec_info.custom_mask`` into its buffer, and EAGLE writes its mask into that buffer."""
    import importlib.util

    def source(module):  # read, not imported: the NGRAM worker imports sgl_kernel, absent on a CPU box
        return open(importlib.util.find_spec(module).origin).read()

    ngram = source("sglang.srt.speculative.ngram_worker")
    assert "\nUSE_FULL_MASK = True\n" in ngram and "tree_mask = torch.cat(tree_mask, dim=0)" in ngram
    verify = source("sglang.srt.layers.attention.triton_backend")
    assert "custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask" in verify
    eagle = source("sglang.srt.speculative.eagle_worker_common")
    assert "tree_mask_buf = verify_mask.buffer if verify_mask.fits(bs) else None" in eagle
    fa3 = source("sglang.srt.layers.attention.flashattention_backend")
    assert "self._verify_mask = maybe_create_verify_mask(" in fa3  # why fa3 is among hp.GLUE_BACKENDS


def _args(*argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", "dummy", *argv])


def test_the_refusal_waits_for_the_facts_and_with_facts_applies_it():
    """An activated launcher resolves its plan before the server arguments are parsed: the
    pair is judged when they are (Plan.with_facts), as the inert rules are."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    early = plans.resolve({config.ENV_ENABLE: "1", config.ENV_SLOTS: "default,metadata_glue_graph"})
    assert early.verdict("metadata_glue_graph").status is Status.WOULD_APPLY
    late = early.with_facts(CATALOGUE, facts(*FI_T4))
    assert late.verdict("metadata_glue_graph").status is Status.FAILED
    triton = early.with_facts(CATALOGUE, facts(*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "triton"))
    assert triton.verdict("metadata_glue_graph").status is Status.WOULD_APPLY


def test_all_leaves_out_the_later_slot_of_an_unsafe_pair():
    names = config.parse_slot_spec("all", CATALOGUE).names
    assert "flashinfer_tree_verify_plan" in names and "metadata_glue_graph" not in names


def test_an_activated_launcher_refuses_the_glue_when_the_facts_come(monkeypatch):
    """load_plugins() ran first (the env switch was exported): the plan was resolved without
    server facts and installed; apply_facts then refuses the glue, whose flag is never set,
    and the strict startup check stops with both slots named."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_hostsync_plugin import plan as plans, runtime
    from sglang_hostsync_plugin.slot import Status

    rt = runtime.Runtime()
    rt.plan = plans.resolve({config.ENV_ENABLE: "1", config.ENV_SLOTS: "default,metadata_glue_graph"})
    for v in rt.plan.verdicts:  # what installer.install records for the applicable ones
        rt.state.statuses[v.name] = v
        if v.selected and v.status is Status.WOULD_APPLY:
            rt.state.active.add(v.name)
    flags = []
    monkeypatch.setattr(runtime.switches, "apply", lambda slots: flags.extend(s.env_flag for s in slots))
    runtime.apply_facts(rt, prepare_server_args(["--model-path", "dummy", *FI_T4]))
    glue = rt.state.statuses["metadata_glue_graph"]
    assert glue.status is Status.FAILED and "metadata_glue_graph" not in rt.state.active
    assert "SGLANG_ENABLE_METADATA_GLUE_GRAPH" not in flags
    assert "flashinfer_tree_verify_plan" in rt.state.active
    rt.state.verified = rt.reported = True
    with pytest.raises(config.HostsyncConfigError, match="metadata_glue_graph: cannot run beside"):
        runtime.startup_check(rt)


def test_eagle_host_preset():
    from sglang_hostsync_plugin.slot import Status

    names = set(config.parse_slot_spec("eagle_host", CATALOGUE).names)
    assert names == {"metadata_glue_graph", "skip_glued_replay_view", "fill_fast_path", "draft_extend_glue_graph",
                     "draft_decode_glue_graph", "fused_tree_compact", "fused_draft_page_locs", "greedy_row_argmax",
                     "fused_relay_stash", "draft_extend_topk_graph", "small_copy_launch", "draft_vocab_topk",
                     "triton_replay_launch", "spec_kernel_replay", "mamba_verdict_once", "isolation_snapshot",
                     "decode_lens_lazy_h2d", "chain_tree_full_mask"}
    triton = _plan("default,eagle_host", *EAGLE, "--speculative-eagle-topk", "4", "--page-size", "16",
                   "--attention-backend", "triton")
    assert all(triton.verdict(n).status is Status.WOULD_APPLY for n in names - {"chain_tree_full_mask"})
    assert triton.verdict("chain_tree_full_mask").status is Status.SKIPPED  # topk 4: a tree, not a chain
    chain = _plan("default,eagle_host", *EAGLE, "--speculative-eagle-topk", "1", "--page-size", "16",
                  "--attention-backend", "triton")
    assert chain.verdict("chain_tree_full_mask").status is Status.WOULD_APPLY and chain.refused() == []
    fi = _plan("default,eagle_host", *FI_T4)  # the glue would freeze the default host plan there
    assert fi.verdict("metadata_glue_graph").status is Status.FAILED
    assert fi.verdict("draft_extend_glue_graph").status is Status.SKIPPED  # not triton
    assert fi.verdict("draft_decode_glue_graph").status is Status.SKIPPED
    assert _plan("default,eagle_host,-metadata_glue_graph", *FI_T4).refused() == []


def test_doctor_names_the_unsafe_pair_as_bad_input(monkeypatch, capsys):
    from sglang_hostsync_plugin import doctor

    monkeypatch.setenv(config.ENV_SLOTS, "default,metadata_glue_graph")
    argv = ["doctor", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4", "--page-size", "16"]
    assert doctor.main([*argv, "--attention-backend", "flashinfer"]) == 2
    assert "metadata_glue_graph: cannot run beside slot 'flashinfer_tree_verify_plan'" in capsys.readouterr().err
    assert doctor.main([*argv, "--attention-backend", "triton"]) == 0


def test_with_a_topk_sglang_has_not_chosen_yet_the_pair_waits_for_the_refinement():
    """prepare_server_args without --speculative-eagle-topk: the glue and the tree plan both look
    reachable, but SGLang may still choose topk 1 (the tree plan inert). The pair is judged once the
    plan is refined with the resolved topk: refused at 4 (bad input, before any model load), fine at 1."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import ServingFacts, Status

    env = {config.ENV_ENABLE: "1", config.ENV_SLOTS: "default,metadata_glue_graph"}

    def fi(topk):
        return ServingFacts("EAGLE", topk=topk, page_size=16, attention_backends=("flashinfer", "flashinfer"))

    early = plans.resolve(env, facts=fi(None))
    assert early.verdict("metadata_glue_graph").status is Status.WOULD_APPLY
    early.check_startup()
    tree = early.with_facts(CATALOGUE, fi(4))
    assert tree.verdict("metadata_glue_graph").status is Status.FAILED
    with pytest.raises(config.HostsyncConfigError, match="metadata_glue_graph: cannot run beside"):
        tree.check_startup()
    chain = early.with_facts(CATALOGUE, fi(1))
    assert chain.verdict("metadata_glue_graph").status is Status.WOULD_APPLY
    assert chain.verdict("flashinfer_tree_verify_plan").status is Status.SKIPPED
    chain.check_startup()


def test_the_step_graph_applies_alone_and_is_refused_beside_the_glue_graphs():
    from sglang_hostsync_plugin.slot import Status

    t1 = (*EAGLE, "--speculative-eagle-topk", "1", "--page-size", "16", "--attention-backend", "triton")
    alone = _plan("default,eagle_step_graph", *t1)
    assert alone.verdict("eagle_step_graph").status is Status.WOULD_APPLY and alone.refused() == []
    beside = _plan("default,eagle_host,eagle_step_graph", *t1)
    assert beside.verdict("eagle_step_graph").status is Status.FAILED
    assert "cannot run beside" in beside.verdict("eagle_step_graph").reason
    assert beside.verdict("draft_extend_glue_graph").status is Status.WOULD_APPLY  # the preset itself keeps applying
    t4 = _plan("default,eagle_step_graph", *EAGLE, "--speculative-eagle-topk", "4", "--page-size", "16",
               "--attention-backend", "triton")
    assert t4.verdict("eagle_step_graph").status is Status.SKIPPED


def test_the_users_glue_flag_warning_is_logged_once_the_facts_come(monkeypatch):
    """A plan resolved before the server arguments were known (an activated launcher) learns the warning
    from apply_facts, which logs it."""
    from sglang_hostsync_plugin import plan as plans, runtime

    env = {config.ENV_ENABLE: "1", config.ENV_SLOTS: "default", hp.GLUE_FLAG: "1"}
    monkeypatch.setenv(hp.GLUE_FLAG, "1")
    rt = runtime.Runtime()
    rt.plan = plans.resolve(env)
    assert rt.plan.warnings() == []
    monkeypatch.setattr(runtime.switches, "apply", lambda slots: [])
    logged = []
    monkeypatch.setattr(runtime.logger, "warning", lambda fmt, *a: logged.append(fmt % a))
    runtime.apply_facts(rt, _args(*NGRAM, "--attention-backend", "triton"))
    assert [m for m in logged if "unset it" in m] == [f"hostsync: {rt.plan.warnings()[0]}"]
