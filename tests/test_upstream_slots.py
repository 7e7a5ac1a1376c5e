"""#3: the #45450 switch slots and the #31468 built-in slots against real SGLang 0.5.23.

Switch flags are checked in real processes: the real ``prepare_server_args`` in the
launcher, then a process started with multiprocessing's spawn (as SGLang starts its
schedulers) reports what it inherited."""

import json
import types

import pytest
import torch

from helpers import BUILTINS, HOST_PLAN_FLAGS, SWITCH_FLAGS, SWITCH_REQUIRES, out, run_python
from sglang_hostsync_plugin import config, doctor, registry, switches
from sglang_hostsync_plugin.slot import ServingFacts, SlotKind, inert_reason
from sglang_hostsync_plugin.slots import upstream_builtins as ub

CATALOGUE = registry.catalogue()


def facts(algo="DSPARK", **kw):
    return ServingFacts(speculative_algorithm=algo, **kw)


def test_catalogue_has_every_switch_and_builtin_with_kind_and_default():
    switches_ = {n: s for n, s in CATALOGUE.items() if s.kind is SlotKind.UPSTREAM_SWITCH}
    assert {n: s.env_flag for n, s in switches_.items()} == {**SWITCH_FLAGS, **HOST_PLAN_FLAGS}
    assert not any(s.default for s in switches_.values())  # opt-in, like upstream
    builtins = [n for n, s in CATALOGUE.items() if s.kind is SlotKind.UPSTREAM_BUILTIN]
    assert builtins == list(BUILTINS)
    assert config.parse_slot_spec("dspark_mega", CATALOGUE).names == tuple(SWITCH_FLAGS)
    assert set(config.parse_slot_spec("default", CATALOGUE).names) == {
        "dspark_dp_meta", "target_dp_meta", "eagle_fixed_shape_tail", "draft_input_reuse", "event_ring",
        "accept_lens_snapshot", "flashinfer_plan_guard", "flashinfer_tree_verify_plan",
        "ngram_accept_readback", *BUILTINS}


@pytest.mark.parametrize("slot,dep", sorted(SWITCH_REQUIRES.items()))
def test_dependency_rule_rejects_config_without_its_dependency(slot, dep):
    with pytest.raises(config.HostsyncConfigError) as exc:
        config.parse_slot_spec(f"default,{slot}", CATALOGUE)
    assert str(exc.value) == (
        f"{config.ENV_SLOTS}: slot {slot!r} requires slot {dep!r}, which is not selected. "
        f"Add {dep!r} or remove {slot!r}."
    )
    assert slot in config.parse_slot_spec(f"{slot},{dep}", CATALOGUE).names
    with pytest.raises(config.HostsyncConfigError, match=f"requires slot {dep!r}"):
        config.parse_slot_spec(f"dspark_mega,-{dep}", CATALOGUE)


def test_no_other_switch_declares_a_dependency():
    declared = {n: s.requires for n, s in CATALOGUE.items() if s.requires}
    # Besides the switches: the FlashInfer host plan needs the pinned-buffer guard, and the
    # audit's sub-phases (a tool slot) time into the audit's clock; NGRAM's late wait defers the
    # readback's synchronize and relies on the full-mask edit sizing the mask after the draft prep.
    # SGLang's own topk-1 host plan needs it too (stock's verify read-back was the only drain).
    owned = {"flashinfer_tree_verify_plan": ("flashinfer_plan_guard",),
             "flashinfer_verify_host_plan": ("flashinfer_plan_guard",), "audit_fine": ("audit",), "audit_block": ("audit",),
             "audit_ngram": ("audit",), "ngram_late_wait": ("ngram_accept_readback", "ngram_full_mask"),
             "ngram_device_draft": ("ngram_full_mask",),  # the device draft's full mask is built by ngram_full_mask's part
             "flashinfer_device_plan": ("flashinfer_plan_guard",)}  # stock steps still plan into the pinned buffer
    assert declared == {**{n: (d,) for n, d in SWITCH_REQUIRES.items()}, **owned}


@pytest.mark.parametrize("value", ["0", "false", "off", "maybe"])
def test_contrary_user_env_is_an_error_naming_both(value):
    flag = SWITCH_FLAGS["fused_accept_tail"]
    with pytest.raises(config.HostsyncConfigError) as exc:
        switches.check_contrary_env([CATALOGUE["fused_accept_tail"]], {flag: value})
    assert f"{flag}={value!r}" in str(exc.value) and "'fused_accept_tail'" in str(exc.value)


def test_agreeing_user_env_and_unselected_slot_are_fine():
    flag = SWITCH_FLAGS["fused_accept_tail"]
    switches.check_contrary_env([CATALOGUE["fused_accept_tail"]], {flag: "1"})
    switches.check_contrary_env([CATALOGUE["fused_accept_tail"]], {flag: "true"})
    switches.check_contrary_env([CATALOGUE["mid_fold"]], {flag: "0"})


INERT_CASES = [
    # (slot, facts, expected substring or None)
    ("sim_draw_ahead", facts(), "SGLANG_SIMULATE_ACC_LEN"),
    ("sim_draw_ahead", facts(env={"SGLANG_SIMULATE_ACC_LEN": "3.51"}), None),
    ("mid_fold", facts("EAGLE"), "--speculative-algorithm is EAGLE"),
    ("mid_fold", facts(None), "--speculative-algorithm is unset"),
    ("mid_fold", facts(), None),
    ("fill_fast_path", facts("EAGLE"), None),
    ("mxfp4_finalized_shape", facts(None), None),
    ("draft_prep_fork", facts(dp_attention=True), "attention DP"),
    ("draft_prep_fork", facts(two_batch_overlap=True), "two-batch overlap"),
    ("target_metadata_early", facts(dp_attention=True), "attention DP"),
    ("target_metadata_early", facts(two_batch_overlap=True), "two-batch overlap"),
    ("defer_context_kv", facts(dp_attention=True), "attention DP"),
    ("post_fold", facts(dp_attention=True), "attention DP"),
    ("sampling_accept_graph", facts(dp_attention=True), "attention DP"),
    ("fused_accept_tail", facts(tp_size=4), "dspark-accept-graph"),
    ("fused_accept_tail", facts(tp_size=1), None),
    ("fused_accept_tail", facts(tp_size=4, env={"SGLANG_SPEC_TP_SYNC": "rng,-dspark-accept-sample"}), None),
    ("fused_accept_tail", facts(tp_size=4, env={"SGLANG_DSPARK_SIMULATE_FOLD": "1"}), None),
]


@pytest.mark.parametrize("slot,f,expected", INERT_CASES)
def test_inert_rules(slot, f, expected):
    reason = inert_reason(CATALOGUE[slot], f)
    if expected is None:
        assert reason is None
    else:
        assert reason.startswith("inert because") and expected in reason


SPAWN_CHECK = """
import json, multiprocessing as mp, os
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
import child_env

FLAGS = json.loads(os.environ.pop("EXPECT_FLAGS"))
BASE = dict(os.environ)
ARGV = ["--model-path", "dummy", "--speculative-algorithm", "DSPARK", "--enable-hostsync-plugin"]

def launch(spec):
    os.environ.clear(); os.environ.update(BASE)
    os.environ["SGLANG_HOSTSYNC_SLOTS"] = spec
    prepare_server_args(ARGV)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child_env.report, args=(q,))
    p.start(); env = q.get(timeout=120); p.join()
    return env

base = launch("none")
res = {}
for spec in [*FLAGS, "target_metadata_early,target_verify_metadata_glue",
             "one_launch_commit_stage,defer_context_kv", "dspark_mega"]:
    env = launch(spec)
    # The plugin's own variables differ by construction: the slot list, and the plan it exports.
    res[spec] = {k: v for k, v in env.items() if base.get(k) != v and k not in ("SGLANG_HOSTSYNC_SLOTS", "SGLANG_HOSTSYNC_PLAN")}
    res[spec]["plan_spec"] = json.loads(env["SGLANG_HOSTSYNC_PLAN"])["spec"]
print("RESULT" + json.dumps(res))
"""

CHILD_ENV = "import os\n\ndef report(q):\n    q.put(dict(os.environ))\n"


def test_each_switch_sets_exactly_its_flag_in_a_spawned_child(tmp_path):
    (tmp_path / "child_env.py").write_text(CHILD_ENV)
    simple = [n for n in SWITCH_FLAGS if n not in SWITCH_REQUIRES]
    proc = run_python(SPAWN_CHECK, timeout=900, pythonpath=str(tmp_path),
                      EXPECT_FLAGS=json.dumps(simple), SGLANG_SIMULATE_ACC_LEN="3.51")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    for spec, flags in res.items():  # the child read the launcher's plan for this selection
        assert flags.pop("plan_spec") == spec
    for name in simple:
        assert res[name] == {SWITCH_FLAGS[name]: "1"}, (name, res[name])
    for name, dep in SWITCH_REQUIRES.items():
        assert res[f"{name},{dep}"] == {SWITCH_FLAGS[name]: "1", SWITCH_FLAGS[dep]: "1"}
    assert res["dspark_mega"] == {flag: "1" for flag in SWITCH_FLAGS.values()}


def test_every_process_sets_the_flags_again_before_sglang_reads_them():
    """A process that inherits only the plugin switches (not the flags) sets the
    flags in the launcher's set-envs step, before any process or worker is built;
    inert ones stay off."""
    proc = run_python("""
    import json, logging, os
    logging.basicConfig(level=logging.INFO)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    before = {k: os.environ.get(k) for k in FLAGS}
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.entrypoints import engine
    server_args = ServerArgs(model_path="dummy", speculative_algorithm="DSPARK")
    server_args.resolve_once()
    engine._set_envs_and_config(server_args)  # what Engine._launch_subprocesses calls
    from sglang.srt.environ import envs
    after = {k: os.environ.get(k) for k in FLAGS}
    print("RESULT" + json.dumps({"before": before, "after": after,
        "sglang_reads": envs.SGLANG_OPT_DSV41_DSPARK_MID_FOLD.get()}))
    """.replace("FLAGS", repr(sorted(SWITCH_FLAGS.values()))),
        SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,dspark_mega")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert set(res["before"].values()) == {None}
    inert = SWITCH_FLAGS["sim_draw_ahead"]  # no SGLANG_SIMULATE_ACC_LEN here
    assert res["after"] == {f: (None if f == inert else "1") for f in SWITCH_FLAGS.values()}
    assert res["sglang_reads"] is True
    assert "sim_draw_ahead               skipped (inert because SGLANG_SIMULATE_ACC_LEN" in proc.stderr, out(proc)
    assert f"mid_fold                     applied ({SWITCH_FLAGS['mid_fold']}=1)" in proc.stderr, out(proc)
    assert "fused_compact_rebuild        upstream present" in proc.stderr, out(proc)


def test_contrary_env_fails_argument_preparation():
    proc = run_python("""
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    prepare_server_args(["--model-path", "dummy", "--enable-hostsync-plugin"])
    """, SGLANG_HOSTSYNC_SLOTS="fused_accept_tail", SGLANG_DSPARK_FUSED_ACCEPT_TAIL="0")
    assert proc.returncode != 0, out(proc)
    assert "HostsyncConfigError" in proc.stderr and "SGLANG_DSPARK_FUSED_ACCEPT_TAIL='0'" in proc.stderr
    assert "'fused_accept_tail'" in proc.stderr, out(proc)


# --- #31468 built-ins: each contract passes on real SGLang and fails on a broken copy.

@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_contract_passes_on_real_sglang(name):
    assert CATALOGUE[name].precheck() is None


def _legacy_exact_on_host(self, host_seq_lens, out):
    # The reverted variant: the exact sawtooth evaluated on the host over-estimate.
    out.copy_(self._compute_compact_draft_seq_lens(host_seq_lens).to(torch.int32))


def _hybrid_without_or(self, model_runner, prefill_backend, decode_backend):
    self.prefill_backend, self.decode_backend = prefill_backend, decode_backend


def _last_max_sampler(self, hidden_states, input_ids=None):
    bs = hidden_states.shape[0] // self.block_size
    hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(-1, hidden_states.shape[-1])
    logits = hs @ self.weight[: self.num_org].T
    flipped = torch.argmax(logits.flip(-1), dim=-1)
    self.out[: hs.shape[0]].copy_(logits.shape[-1] - 1 - flipped + self.org_vocab_start)


def _filter_with_d2h(self, new_indices, new_indices_cpu=None):
    self.nxt_kv_lens_cpu = self.nxt_kv_lens_cpu[new_indices.cpu()]
    self.nxt_kv_lens_sum = int(self.nxt_kv_lens_cpu.sum().item())


def _metadata_with_device_max(self, forward_batch):
    self.forward_decode_metadata = types.SimpleNamespace(
        max_seq_len_k=int(forward_batch.seq_lens.max().item()))


BROKEN = {
    "fused_compact_rebuild": [
        ("sglang.kernels.ops.speculative.cache_locs", "rebuild_compact_draft_req_to_token", None),
        ("sglang.srt.speculative.dflash_worker_v2", "rebuild_compact_draft_req_to_token_func", lambda **kw: None),
    ],
    "host_envelope_bound": [
        ("sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2", "_compute_compact_draft_seq_lens_host", None),
        ("sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2", "_compute_compact_draft_seq_lens_host", _legacy_exact_on_host),
    ],
    "hybrid_needs_cpu_seq_lens": [
        ("sglang.srt.layers.attention.hybrid_attn_backend.HybridAttnBackend", "__init__", _hybrid_without_or),
    ],
    "draft_sampler_in_graph": [
        ("sglang.srt.speculative.dflash_worker_v2", "_DflashDraftSampler", None),
        ("sglang.srt.speculative.dflash_worker_v2._DflashDraftSampler", "__call__", _last_max_sampler),
    ],
    "filter_batch_host_keep_list": [
        ("sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2", "filter_batch", _filter_with_d2h),
    ],
    "trtllm_mla_host_max": [
        ("sglang.srt.layers.attention.trtllm_mla_backend.TRTLLMMLABackend", "init_forward_metadata", _metadata_with_device_max),
    ],
}


@pytest.mark.parametrize("name,case", [(n, i) for n, cases in BROKEN.items() for i in range(len(cases))])
def test_builtin_contract_fails_on_broken_copy(name, case, monkeypatch):
    import pkgutil

    owner, attr, replacement = BROKEN[name][case]
    target = pkgutil.resolve_name(owner)
    if replacement is None:
        monkeypatch.delattr(target, attr)
    else:
        monkeypatch.setattr(target, attr, replacement)
    reason = CATALOGUE[name].precheck()
    assert reason is not None and (reason.startswith("contract broken") or reason.startswith("target missing")), reason


def test_eager_sampler_env_warns(monkeypatch):
    assert ub.eager_sampler_warning({}) is None
    assert ub.eager_sampler_warning({"SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "0"}) is None
    warning = ub.eager_sampler_warning({"SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1"})
    assert "re-adds the eager DFlash draft sampler" in warning


# --- doctor

def _doctor(capsys, *argv):
    code = doctor.main(["doctor", *argv])
    return code, capsys.readouterr()


def test_doctor_lists_every_switch_and_builtin(capsys):
    code, cap = _doctor(capsys, "--json")
    assert code == 0, cap.err
    rows = {r["name"]: r for r in json.loads(cap.out)["slots"]}
    for name, flag in SWITCH_FLAGS.items():
        assert rows[name]["status"] == "would apply" and rows[name]["reason"] == f"sets {flag}=1"
    for name in BUILTINS:
        assert rows[name]["status"] == "upstream present", rows[name]


def test_doctor_reports_inert_switches_for_server_args(capsys):
    code, cap = _doctor(capsys, "--json", "--speculative-algorithm", "EAGLE")
    rows = {r["name"]: r for r in json.loads(cap.out)["slots"]}
    assert code == 0
    assert rows["mid_fold"]["status"] == "skipped" and "only DSpark" in rows["mid_fold"]["reason"]
    assert rows["fill_fast_path"]["status"] == "would apply"


def test_doctor_names_the_backend_forcing_the_seq_lens_d2h(capsys):
    code, cap = _doctor(capsys, "--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE")
    assert code == 0, cap.err
    assert "per-step D2H: YES, forced by FlashInferAttnBackend" in cap.out, cap.out
    code, cap = _doctor(capsys, "--json", "--attention-backend", "fa3", "--speculative-algorithm", "EAGLE")
    report = json.loads(cap.out)["seq_lens_d2h"]
    assert report["d2h_per_step"] is False and report["forced_by"] == []
    fa3 = {c["name"]: c for c in report["roles"][0]["classes"]}["FlashAttentionBackend"]
    assert fa3["needs_cpu_seq_lens"] is False and fa3["per_instance"] is True


def test_doctor_hybrid_backends_and_tbo(capsys):
    code, cap = _doctor(capsys, "--json", "--prefill-attention-backend", "flashinfer",
                        "--decode-attention-backend", "fa3", "--speculative-algorithm", "EAGLE",
                        "--speculative-draft-attention-backend", "fa3")
    rep = json.loads(cap.out)["seq_lens_d2h"]
    # mode=prefill routes verify to the prefill backend, so flashinfer counts.
    assert rep["d2h_per_step"] is True and rep["forced_by"] == ["FlashInferAttnBackend", "FlashInferMLAAttnBackend"]
    code, cap = _doctor(capsys, "--json", "--prefill-attention-backend", "flashinfer",
                        "--decode-attention-backend", "fa3", "--speculative-algorithm", "EAGLE",
                        "--speculative-draft-attention-backend", "fa3", "--speculative-attention-mode", "decode")
    assert json.loads(cap.out)["seq_lens_d2h"]["d2h_per_step"] is False
    code, cap = _doctor(capsys, "--json", "--attention-backend", "fa3", "--speculative-algorithm", "EAGLE",
                        "--enable-two-batch-overlap")
    assert json.loads(cap.out)["seq_lens_d2h"]["forced_by"] == ["two-batch overlap"]


def test_doctor_unknown_backend_is_a_configuration_error(capsys):
    code, cap = _doctor(capsys, "--attention-backend", "nope", "--speculative-algorithm", "EAGLE")
    assert code == 2 and "unknown attention backend 'nope'" in cap.err


def _unwrapped(out: str, prefix: str) -> list[str]:
    """The doctor's lines that start with ``prefix``, each with its wrapped (indented) lines joined back."""
    lines, found = out.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            rest = []
            for more in lines[i + 1:]:
                if not more.startswith("  "):
                    break
                rest.append(more.strip())
            found.append(" ".join([line, *rest]))
    return found


def _table(out: str) -> dict[str, list[str]]:
    """The default table's rows: slot -> [selected, status, reason with its wrapped lines joined]."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("slot  "))
    at = [lines[start].index(h) for h in ("selected", "status", "reason")]
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("("):
            break
        if line[:at[0]].strip():
            rows[line[:at[0]].strip()] = [line[at[0]:at[1]].strip(), line[at[1]:at[2]].strip(), line[at[2]:]]
        else:  # a wrapped reason's next line
            rows[list(rows)[-1]][2] += " " + line[at[2]:]
    return rows


# Server arguments whose reasons are long (inert slots), and the widest selection.
WIDE_CASES = [((), {}),
              (("--speculative-algorithm", "EAGLE", "--attention-backend", "flashinfer", "--page-size", "16"), {}),
              (("--speculative-algorithm", "NGRAM", "--attention-backend", "flashinfer"), {"SGLANG_HOSTSYNC_SLOTS": "all"})]


@pytest.mark.parametrize("argv,env", WIDE_CASES)
def test_doctor_fits_120_columns_and_loses_no_reason(capsys, monkeypatch, argv, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, cap = _doctor(capsys, *argv)
    assert code == 0, cap.err
    assert max(map(len, cap.out.splitlines())) <= 120, max(cap.out.splitlines(), key=len)
    code, js = _doctor(capsys, "--json", *argv)
    slots = json.loads(js.out)["slots"]
    table = _table(cap.out)
    assert list(table) == [r["name"] for r in slots]
    for r in slots:  # wrapping moves line breaks only (a word longer than the column is cut)
        selected, status, reason = table[r["name"]]
        assert (selected, status) == ("yes" if r["selected"] else "no", r["status"]), r
        assert reason.replace(" ", "") == r["reason"].replace(" ", ""), (reason, r["reason"])
    assert next(line for line in cap.out.splitlines() if line.startswith("slot  ")).split() == [
        "slot", "selected", "status", "reason"]
    assert "(--wide: also each slot's kind, origin and default; --json: everything)" in cap.out


@pytest.mark.parametrize("argv,env", WIDE_CASES)
def test_doctor_wide_is_one_line_per_slot_with_every_column(capsys, monkeypatch, argv, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, cap = _doctor(capsys, "--wide", *argv)
    assert code == 0, cap.err
    lines = cap.out.splitlines()
    assert lines[1].split() == ["slot", "kind", "origin", "default", "selected", "status", "reason"]
    origin_at, default_at = lines[1].index("origin"), lines[1].index("default")
    rows = {line.split()[0]: line for line in lines[3:3 + len(CATALOGUE)]}
    assert list(rows) == list(CATALOGUE)
    for name, slot in CATALOGUE.items():
        assert rows[name][origin_at:default_at].strip() == slot.origin
    assert max(map(len, lines)) > 120 and "(--wide" not in cap.out


def test_no_internal_issue_numbers_in_origins_reasons_or_hints(capsys, monkeypatch):
    import re

    issue = re.compile(r"\bissues? ?#?\d", re.IGNORECASE)
    assert not [(n, s.origin) for n, s in CATALOGUE.items() if issue.search(s.origin) or issue.search(s.summary)]
    for argv, env in WIDE_CASES:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code, cap = _doctor(capsys, "--wide", *argv)
        assert code == 0 and not issue.search(cap.out), cap.out


def test_doctor_hints_the_flashinfer_preset_where_its_switches_would_run(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "default")  # unset is auto, whose FlashInfer pick holds the preset
    code, cap = _doctor(capsys, "--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE")
    assert code == 0, cap.err
    (hint,) = _unwrapped(cap.out, "hint: ")
    assert "SGLANG_HOSTSYNC_SLOTS=default,flashinfer" in hint
    assert "draft_extend_fused_layout, flashinfer_verify_host_plan, flashinfer_draft_host_indptr (" in hint
    # topk 4: SGLang's verify switch is topk 1 only, so it is not named.
    code, cap = _doctor(capsys, "--json", "--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE",
                        "--speculative-eagle-topk", "4", "--page-size", "16")
    auto_hint, hint = json.loads(cap.out)["hints"]  # auto's measured pick for this class comes first
    assert auto_hint.startswith("SGLANG_HOSTSYNC_SLOTS=auto (or unset) picks default,flashinfer,eagle_host,")
    assert "also turns on draft_extend_fused_layout, flashinfer_draft_host_indptr (" in hint
    for argv, env in ((("--attention-backend", "triton", "--speculative-algorithm", "EAGLE"), "default"),
                      (("--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE"), "default,flashinfer"),
                      (("--attention-backend", "flashinfer", "--speculative-algorithm", "NGRAM"), "default,ngram_host")):
        monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", env)
        code, cap = _doctor(capsys, "--json", *argv)
        assert code == 0 and json.loads(cap.out)["hints"] == [], (argv, env)


def test_doctor_hints_the_ngram_preset_for_ngram_servers_only(capsys, monkeypatch):
    # Unset is auto: its NGRAM triton page-1 pick holds the preset (no hint), on FlashInfer it picks default.
    monkeypatch.delenv("SGLANG_HOSTSYNC_SLOTS", raising=False)
    code, cap = _doctor(capsys, "--json", "--attention-backend", "triton", "--speculative-algorithm", "NGRAM",
                        "--page-size", "1")
    assert code == 0 and json.loads(cap.out)["hints"] == [], cap
    code, cap = _doctor(capsys, "--json", "--attention-backend", "flashinfer", "--speculative-algorithm", "NGRAM",
                        "--page-size", "1")
    assert [h.split(" (")[0] for h in json.loads(cap.out)["hints"]] == [
        "SGLANG_HOSTSYNC_SLOTS=auto,ngram_host also turns on ngram_full_mask, ngram_late_wait"]
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "default")
    code, cap = _doctor(capsys, "--json", "--attention-backend", "triton", "--speculative-algorithm", "NGRAM")
    assert code == 0, cap.err
    (hint,) = json.loads(cap.out)["hints"]
    assert hint.startswith("SGLANG_HOSTSYNC_SLOTS=default,ngram_host also turns on ngram_full_mask, ngram_late_wait (")
    # Under FlashInfer both presets concern an NGRAM server; the flashinfer preset's switches are EAGLE-only.
    code, cap = _doctor(capsys, "--json", "--attention-backend", "flashinfer", "--speculative-algorithm", "NGRAM")
    assert [h.split(" (")[0] for h in json.loads(cap.out)["hints"]] == [
        "SGLANG_HOSTSYNC_SLOTS=default,ngram_host also turns on ngram_full_mask, ngram_late_wait"]
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "default,ngram_full_mask")
    code, cap = _doctor(capsys, "--json", "--attention-backend", "triton", "--speculative-algorithm", "NGRAM")
    (hint,) = json.loads(cap.out)["hints"]
    assert "default,ngram_full_mask,ngram_host also turns on ngram_late_wait (" in hint
    monkeypatch.delenv("SGLANG_HOSTSYNC_SLOTS")
    code, cap = _doctor(capsys, "--json", "--attention-backend", "triton", "--speculative-algorithm", "EAGLE")
    assert code == 0 and json.loads(cap.out)["hints"] == []


def test_doctor_says_what_the_selected_slots_change_in_the_seq_lens_read(capsys, monkeypatch):
    """Where a selected slot skips or moves the per-step read, the doctor names it under the stock report
    (``auto``'s FlashInfer topk-4 page-16 pick has ``flashinfer_device_plan``; a selection without it says nothing)."""
    args = ("--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
            "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8", "--page-size", "16")
    monkeypatch.delenv("SGLANG_HOSTSYNC_SLOTS", raising=False)
    code, cap = _doctor(capsys, "--wide", *args)
    assert code == 0, cap.err
    lines = cap.out.splitlines()
    at = lines.index("  with the selected slots (above is stock SGLang's):")
    assert lines[at - 1].startswith("  per-step D2H: YES, forced by FlashInferAttnBackend")
    assert lines[at + 1] == f"    flashinfer_device_plan: {registry.catalogue()['flashinfer_device_plan'].seq_lens_read}"
    code, cap = _doctor(capsys, "--json", *args)
    assert list(json.loads(cap.out)["seq_lens_d2h"]["slots"]) == ["flashinfer_device_plan"]
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "default,flashinfer")
    code, cap = _doctor(capsys, "--json", *args)
    assert code == 0 and json.loads(cap.out)["seq_lens_d2h"]["slots"] == {}
    code, cap = _doctor(capsys, "--wide", *args)
    assert "with the selected slots" not in cap.out


def test_doctor_on_a_cpu_box_does_not_relay_sglangs_no_cuda_arch_warning():
    """SGLang's JIT logs "Cannot detect CUDA architecture." on import without a GPU; the doctor drops that one line
    (in a child: the warning is logged once per process)."""
    proc = run_python("""
        import sys
        from sglang_hostsync_plugin import doctor
        sys.exit(doctor.main(["doctor", "--speculative-algorithm", "EAGLE", "--attention-backend", "triton"]))
        """)
    assert proc.returncode == 0, out(proc)
    assert "Cannot detect CUDA architecture" not in proc.stderr, out(proc)


def test_doctor_seq_lens_slot_lines_follow_the_selection_and_overlap(capsys, monkeypatch):
    """The NGRAM texts name where the read stays; without overlap SGLang never calls it, and no slot line shows."""
    ngram = ("--speculative-algorithm", "NGRAM", "--attention-backend", "triton")
    monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", "default,ngram_full_mask,ngram_device_draft")
    code, cap = _doctor(capsys, "--json", *ngram)
    slots = json.loads(cap.out)["seq_lens_d2h"]["slots"]
    assert code == 0 and slots["ngram_device_draft"].startswith("gone where every attention backend is triton"), slots
    assert slots["ngram_accept_readback"].startswith("where the read stays"), slots
    code, cap = _doctor(capsys, "--json", *ngram, "--disable-overlap-schedule")
    rep = json.loads(cap.out)["seq_lens_d2h"]
    assert code == 0 and rep["d2h_per_step"] is False and rep["overlap"] is False and rep["slots"] == {}, rep
    code, cap = _doctor(capsys, *ngram, "--disable-overlap-schedule")
    assert "per-step D2H: none here: without overlap SGLang does not call it" in cap.out, cap.out
