"""The end-to-end benchmark's own logic on the CPU: the matrix and launch commands
(checked against SGLang's real argument parser), the HTTP client against a fake
server on localhost, the statistics, the identity check, the report, and a whole
run against fake servers (tests/fake_sglang_server.py)."""

import argparse
import importlib.util
import json
import lzma
import re
import math
import os
import struct
import subprocess
import sys
import time
import zlib

import pytest

from helpers import REPO, clean_env, free_port_base, run_process
from sglang_hostsync_plugin.e2e import client, matrix, run, stats
from sglang_hostsync_plugin.e2e.png import bar_chart, line_plot
from sglang_hostsync_plugin.slots.audit import ENV_TRACE, TraceStep, format_trace_line, parse_trace

TESTS = os.path.join(REPO, "tests")


def sglang_parse(argv):
    """SGLang's own parser (our flag is added by the plugin's CLI hook, not here)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args([a for a in argv if a != "--enable-hostsync-plugin"])


# --- matrix and commands -------------------------------------------------------

SPEED_RUN = matrix.Options(weights="dummy", simulate_acc_len=3.0)  # the benchmark-only options


def test_a_windows_requests_are_at_least_requests_per_user_times_the_concurrency():
    parse = run.build_parser().parse_args
    assert [run.window_requests(parse(["--requests", "8"]), c) for c in (1, 8)] == [8, 16]
    assert [run.window_requests(parse(["--requests", "8", "--requests-per-user", "4"]), c) for c in (1, 8)] == [8, 32]
    with pytest.raises(ValueError, match="--requests-per-user"):
        run.plan(parse(["--requests-per-user", "0"]))


def test_by_default_servers_run_written_checkpoints_real_acceptance_and_the_radix_cache(tmp_path, capsys):
    """No --load-format dummy, no SGLANG_SIMULATE_ACC_LEN, no --disable-radix-cache unless asked; the
    report names a benchmark-only run."""
    opts = run.plan(run.build_parser().parse_args([]))[2]
    assert not opts.dummy and opts.simulate_acc_len == 0 and opts.radix_cache and opts.benchmark_only == []
    assert run.main(["--dry-run", "--out", str(tmp_path / "x"), "--configs", "standalone-t4-p16,ngram-p1"]) == 0
    text = capsys.readouterr().out
    assert "SGLANG_SIMULATE_ACC_LEN" not in text and "--load-format" not in text and "--disable-radix-cache" not in text
    assert f"--model-path {tmp_path}/x/models/small-seed1-target " in text
    assert f"--speculative-draft-model-path {tmp_path}/x/models/small-seed1-draft " in text
    speed = run.plan(run.build_parser().parse_args(["--weights", "dummy", "--simulate-acc-len", "3", "--no-radix-cache"]))[2]
    assert len(speed.benchmark_only) == 2
    ln = matrix.launch(matrix.CONFIGS["standalone-t4-p16"], matrix.STOCK, 1, speed, {"target": "t", "draft": "d"},
                       str(tmp_path))
    assert ln.env["SGLANG_SIMULATE_ACC_LEN"] == "3" and "--disable-radix-cache" in ln.argv
    header = run._header([{"date": "d", "command": "c", "rounds": 1, "max_new_tokens": 8,
                           "benchmark_only": speed.benchmark_only}])
    assert "**Benchmark-only run**: dummy weights" in header and "simulated acceptance" in header
    assert "Benchmark-only" not in run._header([{"date": "d", "command": "c", "rounds": 1, "max_new_tokens": 8}])


def test_every_arms_server_sleeps_on_idle_unless_told_not_to(tmp_path):
    """Idle arms' schedulers must not spin beside the timed one: --sleep-on-idle on stock's and the plugin's alike."""
    config, models = matrix.CONFIGS["standalone-t4-p16"], {"target": "t", "draft": "d"}
    for argv, flag in (([], True), (["--no-sleep-on-idle"], False)):
        opts = run.plan(run.build_parser().parse_args(argv))[2]
        for arm in matrix.parse_arms("stock,plugin", ["default"]):
            assert ("--sleep-on-idle" in matrix.launch(config, arm, 1, opts, models, str(tmp_path)).argv) is flag


def test_every_configuration_and_arm_launches_with_sglangs_own_parser(tmp_path):
    models = matrix.write_models(str(tmp_path / "models"))
    assert json.load(open(os.path.join(models["draft"], "config.json")))["num_hidden_layers"] == 2
    arms = matrix.parse_arms("stock,audit,plugin", ["default,-event_ring"])
    for config in matrix.CONFIGS.values():
        for i, arm in enumerate(arms):
            ln = matrix.launch(config, arm, 40000 + i, SPEED_RUN, models, str(tmp_path))
            assert ln.argv[1:3] == ("-m", "sglang.launch_server")
            ns = sglang_parse(list(ln.argv[3:]))
            assert ns.speculative_algorithm == config.algorithm and ns.page_size == config.page_size
            assert ns.port == 40000 + i and ns.load_format == "dummy" and ns.skip_tokenizer_init
            assert ns.max_total_tokens == matrix.Options.max_total_tokens and not ns.disable_radix_cache
            if config.uses_draft_model:
                given = config.block_size is None and not config.auto_params
                assert ns.speculative_eagle_topk == (config.topk if given else None)
                assert ns.speculative_draft_model_path == models[config.draft]
            else:
                assert ns.speculative_draft_model_path is None and ns.speculative_ngram_max_bfs_breadth == 1
            if arm.slots is None:  # stock: no flag, no plugin env, no trace
                assert "--enable-hostsync-plugin" not in ln.argv and ln.trace == ""
                assert not [k for k in ln.env if "HOSTSYNC" in k]
            else:
                assert "--enable-hostsync-plugin" in ln.argv
                tail = ["audit", config.audit_phases_slot] if config.audit_phases_slot else ["audit"]
                assert ln.env["SGLANG_HOSTSYNC_SLOTS"].split(",")[-len(tail):] == tail
                assert ln.env["SGLANG_HOSTSYNC_AUDIT_TRACE"] == ln.trace and ln.trace.startswith(str(tmp_path))
            assert ln.env["SGLANG_SIMULATE_ACC_LEN"] == "3"


def test_the_1b_dummy_shape_is_a_llama_sglang_can_size(tmp_path):
    from transformers import LlamaConfig

    models = matrix.write_models(str(tmp_path / "models"), "llama-1b")
    target = json.load(open(os.path.join(models["target"], "config.json")))
    draft = json.load(open(os.path.join(models["draft"], "config.json")))
    assert (target["hidden_size"], target["num_hidden_layers"], draft["num_hidden_layers"]) == (2048, 16, 2)
    cfg = LlamaConfig(**target)
    assert cfg.head_dim * cfg.num_attention_heads == cfg.hidden_size
    assert cfg.vocab_size == matrix.LLAMA_8B["vocab_size"]  # the prompt pool's token ids fit either shape
    ns = run.build_parser().parse_args(["--weights", "dummy", "--dummy-shape", "llama-1b"])
    assert run.plan(ns)[2].dummy_shape == "llama-1b"
    for other in (["--model-path", "/m"], []):  # a user's checkpoint, or the default written ones
        with pytest.raises(ValueError, match="--dummy-shape"):
            run.plan(run.build_parser().parse_args(["--dummy-shape", "llama-1b", *other]))


@pytest.mark.parametrize("shape", sorted(matrix.DUMMY_SHAPES))
def test_the_eagle3_dummy_draft_is_what_sglang_builds_an_eagle3_head_from(tmp_path, shape):
    """SGLang resolves the draft's class from ``architectures`` and sizes its head from the
    config: one layer of the target's width and a reduced vocabulary below the target's."""
    from transformers import LlamaConfig
    from sglang.srt.models.registry import ModelRegistry

    models = matrix.write_models(str(tmp_path / "models"), shape)
    target = json.load(open(os.path.join(models["target"], "config.json")))
    draft = json.load(open(os.path.join(models["draft-eagle3"], "config.json")))
    cls, arch = ModelRegistry.resolve_model_cls(draft["architectures"])
    assert arch == "LlamaForCausalLMEagle3" and cls.__name__ == "LlamaForCausalLMEagle3"
    cfg = LlamaConfig(**draft)
    assert cfg.num_hidden_layers == 1 and cfg.hidden_size == target["hidden_size"]
    assert cfg.draft_vocab_size == matrix.EAGLE3_DRAFT_VOCAB < cfg.vocab_size == target["vocab_size"]
    eagle3 = [c for c in matrix.CONFIGS.values() if c.algorithm == "EAGLE3"]
    assert {c.topk for c in eagle3} == {1, 4} and all(c.draft == "draft-eagle3" for c in eagle3)


RESOLVE_EVERY_CONFIG = """
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.model_override_base import resolved_view
out = {}
for name, argv in json.load(open(sys.argv[1])).items():
    args = prepare_server_args(argv)
    args.resolve_once()
    v = resolved_view(args)
    out[name] = [v.speculative_algorithm, v.speculative_eagle_topk, v.page_size, v.speculative_num_draft_tokens,
                 v.speculative_draft_model_path, v.speculative_draft_attention_backend, v.disable_overlap_schedule,
                 v.speculative_num_steps]
print("RESOLVED " + json.dumps(out))
"""


def test_every_configuration_resolves_in_sglang_to_what_it_names(tmp_path):
    """SGLang's whole argument resolution (``resolve_once``, which reads the draft's config: the DFlash
    family's block and target layers, the EAGLE3 head) on each configuration's launch command, with
    the dummy models the benchmark writes: the algorithm, topk, page size, verify width and draft the
    configuration names, overlap scheduling on, and the draft attention backend triton."""
    models = matrix.write_models(str(tmp_path / "models"))
    argvs = {}
    for config in matrix.CONFIGS.values():
        ln = matrix.launch(config, matrix.STOCK, 40000, matrix.Options(), models, str(tmp_path))
        argvs[config.name] = [a for a in ln.argv[3:] if a != "--enable-hostsync-plugin"] + ["--device", "cuda"]
    spec = tmp_path / "argvs.json"
    spec.write_text(json.dumps(argvs))
    proc = run_process([sys.executable, "-c", RESOLVE_EVERY_CONFIG, str(spec)], timeout=600, cwd=str(tmp_path),
                       env=clean_env())  # no SGLANG_ variable
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESOLVED ")]
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    resolved = json.loads(line[0][len("RESOLVED "):])
    for name, config in matrix.CONFIGS.items():
        algorithm, topk, page, width, draft, draft_backend, no_overlap, steps = resolved[name]
        assert (algorithm, page, width, no_overlap) == (config.algorithm, config.page_size, config.draft_tokens, False), name
        if config.uses_draft_model:
            assert topk == config.topk and draft == models[config.draft], name
            assert steps == (config.num_steps if config.block_size is None else 1), name
        if config.block_size is not None:  # DFlash's own backend choice; DSpark's draft runs on the target's
            assert draft_backend in ("triton", None) and topk == 1, name
    assert resolved["dflash-p16"][5] == "triton"


def test_the_block_drafts_are_what_sglang_builds_dflash_and_dspark_drafts_from(tmp_path):
    """SGLang's own parsers of the two drafts' configs (the ones its model classes and workers call):
    the three target layers, the mask token, the block, DSpark's Markov head; the classes resolve."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    models = matrix.write_models(str(tmp_path / "models"))
    target = json.load(open(os.path.join(models["target"], "config.json")))
    dflash = json.load(open(os.path.join(models["draft-dflash"], "config.json")))
    dspark = json.load(open(os.path.join(models["draft-dspark"], "config.json")))
    for draft, block in ((dflash, matrix.DFLASH_BLOCK), (dspark, matrix.DSPARK_BLOCK)):
        cfg = parse_dflash_draft_config(draft_hf_config=draft)  # DSparkDraftModel builds on DFlash's model
        layers = cfg.resolve_target_layer_ids(target_num_layers=target["num_hidden_layers"], draft_num_layers=1)
        assert list(layers) == [1, 16, 30] and cfg.resolve_block_size(default=None) == block
        assert cfg.mask_token_id == matrix.BLOCK_DRAFT_MASK_TOKEN < target["vocab_size"]
        assert draft["hidden_size"] == target["hidden_size"] and draft["num_hidden_layers"] == 1
    sp = parse_dspark_draft_config(draft_hf_config=dspark)
    assert sp.require_markov() and sp.markov_head_type == "vanilla" and sp.resolve_gamma() == matrix.DSPARK_BLOCK
    assert list(sp.target_layer_ids) == [1, 16, 30] and sp.mask_token_id == matrix.BLOCK_DRAFT_MASK_TOKEN
    assert {c.algorithm for c in matrix.CONFIGS.values() if c.block_size} == {"DFLASH", "DSPARK"}
    from sglang.srt.models.registry import ModelRegistry

    for draft in (dflash, dspark):
        cls, arch = ModelRegistry.resolve_model_cls(draft["architectures"])
        assert arch == cls.__name__ == draft["architectures"][0]


BUILD_BLOCK_DRAFT = """
import json, socket, sys
import torch
from sglang_hostsync_plugin.e2e import matrix
models = matrix.write_models(sys.argv[2], sys.argv[3])
key = sys.argv[1]
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import publish, SpawnRanks
alg = {"draft-dflash": "DFLASH", "draft-dspark": "DSPARK"}[key]
args = prepare_server_args(["--model-path", models["target"], "--load-format", "dummy", "--speculative-algorithm", alg,
                            "--speculative-draft-model-path", models[key], "--attention-backend", "triton",
                            "--skip-tokenizer-init", "--device", "cuda"])
args.resolve_once()
publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
from sglang.srt.distributed import parallel_state as ps
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                distributed_init_method=f"tcp://127.0.0.1:{port}")
ps.initialize_model_parallel()
from sglang.srt.layers.moe import utils as moe_utils
moe_utils.initialize_moe_config()
from sglang.srt.layers.rotary_embedding import base as rope
rope._is_cpu = True  # no CUDA in this torch: the rotary layer's CPU path (its weights are the same)
from transformers import AutoConfig
from sglang.srt.models.registry import ModelRegistry
cfg = AutoConfig.from_pretrained(models[key])
cls, _ = ModelRegistry.resolve_model_cls(cfg.architectures)
with torch.device("meta"):
    model = cls(cfg)
print("BUILT " + json.dumps({"cls": cls.__name__, "fc": list(model.fc.weight.shape), "features": model.num_context_features,
                             "block": model.block_size, "gamma": getattr(model, "gamma", None),
                             "markov": type(getattr(model, "markov_head", None)).__name__}))
"""


@pytest.mark.parametrize("key", ["draft-dflash", "draft-dspark"])
def test_sglang_builds_the_block_drafts(tmp_path, key):
    """SGLang's own model classes built from the dummy configs (meta device, a gloo world of one, the
    arguments resolved and published as a scheduler does): the layers, the projection of the three
    target layers, the block, DSpark's gamma and Markov head. What a GPU start adds (weights, graphs,
    the workers) is left to the e2e run."""
    from helpers import out, run_python

    proc = run_python(BUILD_BLOCK_DRAFT.replace("sys.argv[1]", repr(key)).replace("sys.argv[2]", repr(str(tmp_path)))
                      .replace("sys.argv[3]", repr("llama-8b")), timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("BUILT ")]
    assert proc.returncode == 0 and line, out(proc)
    built = json.loads(line[0][len("BUILT "):])
    hidden = matrix.LLAMA_8B["hidden_size"]
    assert built["fc"] == [hidden, 3 * hidden] and built["features"] == 3
    if key == "draft-dflash":
        assert (built["cls"], built["block"]) == ("DFlashDraftModel", matrix.DFLASH_BLOCK)
    else:
        assert (built["cls"], built["gamma"], built["markov"]) == ("DSparkDraftModel", matrix.DSPARK_BLOCK, "VanillaMarkov")


def test_repeated_prompts_are_one_passage_repeated_and_random_ones_are_not():
    vocab = 32000
    rep = run.prompts(5, 100, vocab, seed=3, kind="repeated")
    rnd = run.prompts(5, 100, vocab, seed=3)
    assert run.build_parser().parse_args([]).prompt_kind == "random"
    for p in rep:
        assert len(p) == 100 and all(1000 <= t < vocab - 1000 for t in p)
        assert p == (p[:run.PASSAGE] * 5)[:100] and len(set(p)) > 1
    assert len({tuple(p[:run.PASSAGE]) for p in rep}) == 5
    # An n-gram drafter finds a continuation of every prompt's last 3 ids in the prompt itself.
    assert all(any(p[i:i + 3] == p[-3:] for i in range(len(p) - 3)) for p in rep)
    assert not any(any(p[i:i + 3] == p[-3:] for i in range(len(p) - 3)) for p in rnd)


def test_plugin_env_goes_to_plugin_arms_only(tmp_path):
    opts = matrix.Options(plugin_env=matrix.parse_plugin_env(["SGLANG_HOSTSYNC_GLUE_CHECK=50"]))
    models = matrix.write_models(str(tmp_path / "models"))
    cfg = matrix.CONFIGS["standalone-t4-p16"]
    assert matrix.launch(cfg, matrix.ARMS["plugin"], 1, opts, models, str(tmp_path)).env["SGLANG_HOSTSYNC_GLUE_CHECK"] == "50"
    assert "SGLANG_HOSTSYNC_GLUE_CHECK" not in matrix.launch(cfg, matrix.STOCK, 1, opts, models, str(tmp_path)).env
    for bad in ("NOEQUALS", "=1", "A B=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            matrix.parse_plugin_env([bad])


def test_a_slots_arm_without_the_audit(tmp_path):
    models = matrix.write_models(str(tmp_path / "models"))
    cfg = matrix.CONFIGS["standalone-t4-p16"]
    arm = matrix.parse_arms("stock", ["default,eagle_host,-audit"])[1]
    assert arm.name == "slots:default,eagle_host,-audit" and not arm.audited
    ln = matrix.launch(cfg, arm, 1, matrix.Options(), models, str(tmp_path))
    assert ln.env["SGLANG_HOSTSYNC_SLOTS"] == "default,eagle_host" and ln.trace == ""
    assert "SGLANG_HOSTSYNC_AUDIT_TRACE" not in ln.env
    assert matrix.extra_arm("default,eagle_host").slots == "default,eagle_host,audit"


def test_the_audited_arms_of_the_dflash_dspark_and_ngram_configurations_time_their_steps(tmp_path):
    """The audit's own phases are EAGLE v2's: every audited arm of a DFlash or DSpark configuration,
    stock code's included, also selects ``audit_block``, of an NGRAM one ``audit_ngram``, unless the
    arm's list removes it."""
    from sglang_hostsync_plugin import config as plugin_config, registry

    models = matrix.write_models(str(tmp_path / "models"))
    arms = matrix.parse_arms("stock,audit,plugin,plugin-noaudit", ["default,-audit_block,-audit_ngram"])
    by_slot = {}
    for c in matrix.CONFIGS.values():
        by_slot.setdefault(c.audit_phases_slot, set()).add(c.algorithm)
    assert by_slot == {"audit_block": {"DFLASH", "DSPARK"}, "audit_ngram": {"NGRAM"},
                       None: {"STANDALONE", "EAGLE3"}}
    for config in matrix.CONFIGS.values():
        for arm in arms:
            env = matrix.launch(config, arm, 1, matrix.Options(), models, str(tmp_path)).env
            if arm.slots is None:
                assert "SGLANG_HOSTSYNC_SLOTS" not in env
                continue
            names = plugin_config.parse_slot_spec(env["SGLANG_HOSTSYNC_SLOTS"], registry.catalogue()).names
            for slot in ("audit_block", "audit_ngram"):
                want = config.audit_phases_slot == slot and arm.audited and f"-{slot}" not in arm.slots
                assert (slot in names) is want, (config.name, arm.name, env["SGLANG_HOSTSYNC_SLOTS"])


def test_where_one_audited_arm_times_the_fine_phases_every_audited_arm_does():
    """Each timer costs host time: stock code's arm gets ``audit_fine`` where a plugin arm selects
    it, so host work compares under the same timers; unaudited arms and ``-audit_fine`` stay as asked."""
    from sglang_hostsync_plugin import config as plugin_config, registry

    def fine(arms):
        out = {}
        for a in arms:
            if a.slots is not None:
                names = plugin_config.parse_slot_spec(a.slots, registry.catalogue()).names
                out[a.name] = "audit_fine" in names
        return out

    assert fine(matrix.parse_arms("stock,audit,plugin", ["default,eagle_host"])) == {
        "audit": False, "plugin": False, "slots:default,eagle_host": False}
    arms = matrix.parse_arms("stock,audit,plugin,plugin-noaudit",
                             ["default,eagle_host,audit_fine", "default,-audit", "default,-audit_fine"])
    assert fine(arms) == {"audit": True, "plugin": True, "plugin-noaudit": False,
                          "slots:default,eagle_host,audit_fine": True, "slots:default,-audit": False,
                          "slots:default,-audit_fine": False}
    assert [a.name for a in arms] == ["stock", "audit", "plugin", "plugin-noaudit",
                                      "slots:default,eagle_host,audit_fine", "slots:default,-audit",
                                      "slots:default,-audit_fine"]
    assert arms[1].slots == "audit,audit_fine" and matrix.STOCK_CODE.slots == "audit"  # the table's arm untouched

    def header(arms):
        meta = {"date": "d", "command": "c", "rounds": 1, "max_new_tokens": 8,
                "arm_slots": {a.name: a.slots for a in arms}}
        return run._header([meta])

    assert ("Named arms with the timers another audited arm selects (host work compares under the same "
            "timers): audit `audit,audit_fine`; plugin `default,audit,audit_fine`.") in header(arms)
    assert "Named arms" not in header(matrix.parse_arms("stock,audit,plugin", ["default,eagle_host"]))
    old = {"date": "d", "command": "c", "rounds": 1, "max_new_tokens": 8}  # an e2e.json without arm_slots
    assert "Named arms" not in run._header([old])
    merged = run._header([old, {**old, "arm_slots": {a.name: a.slots for a in arms}}])  # --merge of both
    assert "selects (host work compares under the same timers): run 2: audit `audit,audit_fine`; plugin " in merged


def test_a_dflash_run_without_flashinfer_stops_before_any_server_starts(tmp_path, capsys):
    """SGLang's DFlash worker imports flashinfer minutes into its start (every arm, stock's too,
    2026-12-05 on the H200); the e2e says so at once. The test venv has no flashinfer."""
    assert importlib.util.find_spec("flashinfer") is None
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16,dflash-p16", "--out", str(out)]
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{sys.executable} cannot import 'flashinfer' (pip: flashinfer_python), which dflash-p16 need(s)" in err
    assert not out.exists()  # nothing written, nothing started


def test_the_preflight_asks_the_servers_interpreter_in_their_environment(tmp_path, monkeypatch):
    opts = matrix.Options()
    needs = matrix.server_needs([matrix.CONFIGS["dflash-p16"], matrix.CONFIGS["dspark-p16"]], opts)
    assert needs == {"flashinfer": ["dflash-p16"]}
    fi = matrix.server_needs([matrix.CONFIGS["dflash-p16"]], matrix.Options(attention_backend="flashinfer"))
    assert fi == {"flashinfer": ["--attention-backend flashinfer", "dflash-p16"]}
    assert matrix.server_needs([matrix.CONFIGS["standalone-t4-p16"]], opts) == {} and run.preflight({}, opts) is None
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert "cannot import 'flashinfer'" in run.preflight(needs, opts)
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(site))  # what the servers inherit
    assert run.preflight(needs, opts) is None
    assert "did not run" in run.preflight(needs, matrix.Options(python=str(tmp_path / "no-python")))


def test_real_checkpoints_replace_the_dummy_models(tmp_path):
    opts = matrix.Options(model_path="/ckpt/target", draft_model_path="/ckpt/draft")
    ln = matrix.launch(matrix.CONFIGS["standalone-t4-p16"], matrix.STOCK, 1, opts, {}, str(tmp_path))
    ns = sglang_parse(list(ln.argv[3:]))
    assert ns.model_path == "/ckpt/target" and ns.speculative_draft_model_path == "/ckpt/draft" and ns.load_format != "dummy"


def test_bad_matrix_arguments_are_refused(capsys):
    with pytest.raises(ValueError, match="unknown configuration"):
        matrix.parse_configs("standalone-t4-p16,nope")
    with pytest.raises(ValueError, match="keep it"):
        matrix.parse_arms("audit,plugin", [])
    assert run.main(["--arms", "plugin", "--dry-run"]) == 2
    assert run.main(["--rounds", "0", "--dry-run"]) == 2
    assert "stock arm" in capsys.readouterr().err
    # One real draft checkpoint cannot serve both a STANDALONE and an EAGLE3 configuration.
    mixed = ["--model-path", "/t", "--draft-model-path", "/d", "--dry-run"]
    assert run.main([*mixed, "--configs", "standalone-t4-p16,eagle3-t4-p16"]) == 2
    assert "separate runs" in capsys.readouterr().err
    assert run.main([*mixed, "--configs", "eagle3-t1-p16,eagle3-t4-p16,ngram-p1"]) == 0


def test_dry_run_prints_the_matrix_and_starts_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert run.main(["--dry-run", "--out", str(out), "--configs", "standalone-t4-p16,ngram-p1", "--slots", "default"]) == 0
    text = capsys.readouterr().out
    assert "2 configurations x 4 arms" in text
    assert text.count("sglang.launch_server") == 8 and "SGLANG_HOSTSYNC_SLOTS=default,audit" in text
    assert not out.exists()


# --- client against a fake server ------------------------------------------------

@pytest.fixture
def fake_server(tmp_path):
    port = free_port_base(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "fake_sglang_server", "--port", str(port)], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        client.wait_ready(base, 60, lambda: proc.poll() is None, poll_s=0.1)
        yield base
    finally:
        proc.kill()
        proc.wait()


def test_client_generate_load_and_logprobs(fake_server):
    r = client.generate(fake_server, [1, 2, 3], 8, logprobs=2)
    assert len(r.output_ids) == 8 and r.completion_tokens == 8 and r.accept_length == 3.0
    assert len(r.logprobs) == 8 and r.logprobs[0][0][1] == r.output_ids[0] and len(r.logprobs[0][1]) == 2
    assert r.tok_per_s > 0
    prompts = [[i, i + 1] for i in range(7)]
    load = client.run_load(fake_server, prompts, 3, 4)
    assert len(load.results) == 7 and not load.errors and load.wall > 0
    # Outputs come back in prompt order, whatever order the workers finished in.
    assert [res.output_ids for res in load.results] == [client.generate(fake_server, p, 4).output_ids for p in prompts]


def test_client_errors_are_clear():
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with pytest.raises(client.ClientError, match="127.0.0.1:9"):
        client.generate(dead, [1], 1, timeout=2)
    with pytest.raises(client.ClientError, match="exited before it was ready"):
        client.wait_ready(dead, 30, alive=lambda: False, poll_s=0.01)
    with pytest.raises(client.ClientError, match="not ready after"):
        client.wait_ready(dead, 0.05, poll_s=0.01)
    load = client.run_load(dead, [[1], [2]], 2, 1, timeout=2)
    assert not load.results and len(load.errors) == 2


# --- statistics ------------------------------------------------------------------

def step(n, t, finish, decode=True, sites=()):
    return TraceStep(n, t, finish, decode, 100.0 + n, tuple(sites))


def test_percentiles():
    assert stats.median([3, 1, 2]) == 2 and stats.percentile([0, 10], 10) == 1.0
    assert stats.median([]) is None and stats.percentile([math.nan, 5], 50) == 5


def test_trace_roundtrip_and_torn_line():
    steps = [step(1, 1.5, 1.6, sites=("a.py:1 (f)", "b.py:2 (g)")), step(0, 1.0, math.nan, decode=False)]
    text = "#header\n" + "".join(format_trace_line(s) for s in steps) + "2\t2.0\t2.1"  # torn last line
    got = parse_trace(text)
    assert [s.step for s in got] == [0, 1] and got[1].sites == ("a.py:1 (f)", "b.py:2 (g)")
    assert math.isnan(got[0].t_finish) and got[0].decode is False


def test_audit_figures_count_decode_pairs_only():
    # Steps 0-3 decode, 4 is a prefill (a new request), 5-6 decode again.
    steps = [
        step(0, 0.000, 0.012), step(1, 0.010, 0.022, sites=("x.py:1 (f)",)), step(2, 0.020, 0.029),
        step(3, 0.030, 0.045), step(4, 0.100, 0.110, decode=False), step(5, 0.110, 0.121), step(6, 0.120, math.nan),
    ]
    fig = stats.audit_figures(steps)
    # leads: 0->1 +2 ms, 1->2 +2 ms, 2->3 -1 ms; 3->4 and 4->5 excluded; 5->6 +1 ms; 6 has no finish.
    assert fig["lead_pairs"] == 4
    assert fig["run_ahead_fraction"] == 0.75
    assert fig["launch_lead_ms_median"] == pytest.approx(1.5)
    assert fig["syncs_per_step"] == pytest.approx(1 / 7) and fig["sync_sites"] == {"x.py:1 (f)": pytest.approx(1 / 7)}
    assert fig["host_us_per_step_median"] == pytest.approx(102.5)  # decode steps 0-3, 5, 6
    assert [s.step for s in stats.window(steps, 0.015, 0.105)] == [2, 3, 4]
    pooled = stats.pool_audit([steps[:4], steps[5:]])
    assert pooled["steps"] == 6 and pooled["lead_pairs"] == 4 and pooled["run_ahead_fraction_min_round"] == pytest.approx(2 / 3)
    # Decode steps after a prefill: 0-3 are 1-4 (the window starts as after one), 5-6 are 1-2 after step 4.
    assert stats.steps_since_prefill(steps) == {0: 1, 1: 2, 2: 3, 3: 4, 4: 0, 5: 1, 6: 2}
    ramp = fig["ramp"]
    assert [(b["misses"], b["pairs"]) for b in ramp["buckets"]] == [(0, 2), (1, 2), (0, 0), (0, 0)]
    assert ramp["run_ahead_after_ramp"] is None
    # Bucket 1 holds pairs 0->1 (+2 ms) and 5->6 (+1 ms); 2-3 holds 1->2 (+2) and 2->3 (-1).
    assert [b["lead_ms_median"] for b in ramp["buckets"]] == [pytest.approx(1.5), pytest.approx(0.5), None, None]
    # The prefill (step 4) finished at 0.110, step 5 launched at 0.110: the host starts level.
    assert ramp["starts"] == 1 and ramp["start_lead_ms_median"] == pytest.approx(0.0)
    # Late launches: the miss 2->3 is 1 ms late; decode time between the pairs' finishes 10+7+16 ms
    # (0->1, 1->2, 2->3; 5->6 has no finish for 6).
    assert fig["late_ms"] == pytest.approx(1.0) and fig["decode_span_ms"] == pytest.approx(33.0)
    assert fig["late_share"] == pytest.approx(1 / 33)
    # Pooled over two windows: 0-3 hold the same three pairs, 5-6 none with both finishes.
    assert pooled["late_ms"] == pytest.approx(1.0) and pooled["decode_span_ms"] == pytest.approx(33.0)


def test_ramp_table_separates_the_catch_up_after_a_prefill_from_steady_state():
    # One prefill, then 14 decode steps: the first 3 pairs miss (the host starts behind), then one
    # late miss at step 13 after the ramp.
    steps = [step(0, 0.0, 0.006, decode=False)]
    for k in range(1, 15):
        lead = -1e-3 if k <= 3 or k == 13 else 2e-3
        steps.append(step(k, k * 0.01, (k + 1) * 0.01 + lead))
    fig = stats.audit_figures(steps)
    assert fig["lead_pairs"] == 13 and fig["run_ahead_fraction"] == pytest.approx(9 / 13)
    assert [(b["misses"], b["pairs"]) for b in fig["ramp"]["buckets"]] == [(1, 1), (2, 2), (0, 7), (1, 3)]
    assert fig["ramp"]["run_ahead_after_ramp"] == pytest.approx(2 / 3)
    # The prefill finished 4 ms before the first decode step's launch (0.006 vs 0.010).
    assert fig["ramp"]["start_lead_ms_median"] == pytest.approx(-4.0)
    rows = [{"config": "c", "concurrency": 1, "arm": "plugin", "audit": stats.pool_audit([steps])}]
    lines = stats.ramp_lines(rows)
    assert ("| config | conc | arm | start lead ms | 1 | 2-3 | 4-10 | 11+ | run-ahead after 10 steps "
            "| late launches | host stalls (misses after them / all misses) |") in lines
    # Four misses 1 ms late each; the decode pairs span step 1's finish (0.019) to step 14's (0.152).
    assert rows[0]["audit"]["late_share"] == pytest.approx(4 / 133)
    # No step's host time stands out (100-114 µs): no stall, none of the four misses after one.
    assert "| c | 1 | plugin | -4.0 | 1/1 (-1.0) | 2/2 (-1.0) | 0/7 (+2.0) | 1/3 (+2.0) | 0.667 | 3.01% | 0 (0/4) |" in lines
    # A cell from an e2e.json written before the leads were kept (--merge) still renders.
    old = {"buckets": [{"from": lo, "to": hi, "pairs": 1, "misses": 0} for lo, hi in stats.RAMP_BUCKETS],
           "run_ahead_after_ramp": 1.0}
    lines = stats.ramp_lines([{"config": "c", "concurrency": 1, "arm": "old", "audit": {"ramp": old}}])
    assert "| c | 1 | old | - | 0/1 (-) | 0/1 (-) | 0/1 (-) | 0/1 (-) | 1.000 | - | - |" in lines
    assert stats.ramp_lines([{"config": "c", "concurrency": 1, "arm": "stock", "audit": None}]) == []


def test_host_stalls_and_the_misses_in_their_wake():
    # 20 decode steps 10 ms apart on the GPU, host CPU time 9 ms each (it waits for the GPU), except:
    # step 5 stalls (30 ms: the host falls behind and needs steps 5-7 to catch up), step 12 takes
    # 17 ms (under 2x the median: no stall) and misses once, and step 16 misses after a normal step.
    late = {5: -20e-3, 6: -12e-3, 7: -4e-3, 12: -1e-3, 16: -0.5e-3}
    host = {5: 30e3, 12: 17e3}
    steps = [TraceStep(k, k * 0.01, k * 0.01 + 0.012, True, host.get(k, 9e3), ()) for k in range(20)]
    for k, lead in late.items():  # the pair (k-1, k): step k launches `lead` after step k-1 finished
        steps[k] = TraceStep(k, steps[k - 1].t_finish - lead, steps[k - 1].t_finish - lead + 0.012, True,
                             host.get(k, 9e3), ())
    fig = stats.audit_figures(steps)
    assert sum(lead <= 0 for lead in fig["leads_ms"]) == 5
    # One stall (step 5); the run of misses it begins (5, 6, 7) is after it; 12 and 16 are not.
    assert fig["stalls"] == {"stalls": 1, "misses": 5, "misses_after_stalls": 3}
    # A run of misses that begins before the stall is not the stall's: move the stall to step 6.
    host6 = [TraceStep(s.step, s.t_launch, s.t_finish, True, 30e3 if s.step == 6 else 9e3, ()) for s in steps]
    assert stats.audit_figures(host6)["stalls"] == {"stalls": 1, "misses": 5, "misses_after_stalls": 0}
    # Pooled over two windows, each with its own median.
    pooled = stats.pool_audit([steps[:10], steps[10:]])
    assert pooled["stalls"] == {"stalls": 1, "misses": 5, "misses_after_stalls": 3}
    lines = stats.ramp_lines([{"config": "c", "concurrency": 1, "arm": "plugin", "audit": pooled}])
    assert lines[-1].endswith("| 1 (3/5) |")


def res(ids, lps=None, latency=1.0):
    return client.Result(tuple(ids), latency, len(ids), 3.0, lps)


def test_identity_check_can_fail_on_tokens_logprobs_and_counts():
    lp = (((-1.0, 5), ((-1.0, 5),)), ((-2.0, 6), ((-2.0, 6),)))
    ref = [res([5, 6], lp), res([7], lp[:1])]
    assert stats.compare_outputs(ref, [res([5, 6], lp), res([7], lp[:1])])["identical"]
    bad_tok = stats.compare_outputs(ref, [res([5, 6], lp), res([8], lp[:1])])
    assert not bad_tok["identical"] and bad_tok["first_mismatch"] == "prompt 1, token 0: output ids differ"
    nudged = (lp[0], ((-2.0000001, 6), ((-2.0, 6),)))
    bad_lp = stats.compare_outputs(ref, [res([5, 6], nudged), res([7], lp[:1])])
    assert not bad_lp["identical"] and "prompt 0, position 1: logprobs differ" == bad_lp["first_mismatch"]
    assert not stats.compare_outputs(ref, ref[:1])["identical"]
    no_lp = stats.compare_outputs([res([5])], [res([5])])
    assert no_lp["identical"] and no_lp["logprobs_compared"] is False
    assert stats.distinct_tokens(ref) == 3


def load_row(config, conc, arm, rnd, per_user, total):
    return {"config": config, "concurrency": conc, "arm": arm, "round": rnd, "errors": [],
            "load": {"requests": len(per_user), "tok_s_user_median": stats.median(per_user),
                     "tok_s_total": total, "accept_length": 3.0, "tok_s_user_all": per_user}}


def test_plugin_arms_against_each_other_by_round():
    """Two plugin arms of a run, round by round (B over A), their median and the rounds B won; an
    audited arm is compared with audited ones only, stock and stock code's arm with none."""
    rows = [load_row("c", 1, "stock", r, [100], 100) for r in range(3)]
    rows += [load_row("c", 1, "slots:a", r, [v], v) for r, v in enumerate([110, 120, 100])]
    rows += [load_row("c", 1, "slots:b", r, [v], v) for r, v in enumerate([121, 114, 105])]
    rows += [load_row("c", 1, "audit", r, [90], 90) for r in range(3)]
    rows += [load_row("c", 1, "slots:c", r, [v], v) for r, v in enumerate([130, 130, 130])]
    windows = {("c", 1, arm): [[step(0, 0, 0.01), step(1, 0.005, 0.02)]] for arm in ("audit", "slots:c")}
    lines = stats.arm_ab_lines(stats.cells(rows, windows))
    assert lines[-1] == "| c | 1 | slots:a | slots:b | 1.050 | 1.100, 0.950, 1.050 | 2/3 |"
    assert len(lines) == 6 and not any("audit" in line or "slots:c" in line for line in lines[5:])
    lone = [r for r in rows if r["arm"] != "slots:b" or r["round"] == 0]  # one round in common: no ratio
    assert stats.arm_ab_lines(stats.cells(lone, windows)) == []
    md = stats.markdown(stats.cells(rows, windows), {}, {})
    assert "Plugin arms against each other" in md and "| slots:a | slots:b | 1.050 |" in md


def test_cells_pool_rounds_and_divide_by_stock():
    rows = [load_row("c", 1, "stock", 0, [100, 102], 200), load_row("c", 1, "stock", 1, [98, 100], 190),
            load_row("c", 1, "plugin", 0, [110, 112], 220), load_row("c", 1, "plugin", 1, [114, 116], 230)]
    windows = {("c", 1, "plugin"): [[step(0, 0, 0.01), step(1, 0.005, 0.02)]]}
    cells = {c["arm"]: c for c in stats.cells(rows, windows)}
    assert cells["stock"]["tok_s_user_median"] == 100 and cells["plugin"]["tok_s_user_median"] == 113
    assert cells["plugin"]["ratio_tok_s_user"] == pytest.approx(1.13)
    assert cells["plugin"]["tok_s_total_median"] == 225 and cells["plugin"]["ratio_tok_s_total"] == pytest.approx(225 / 195)
    assert cells["plugin"]["audit"]["run_ahead_fraction"] == 1.0 and cells["stock"]["audit"] is None
    md = stats.markdown(list(cells.values()), {"c/stock": {"ready_s": 60.0}, "c/plugin": {"ready_s": None}},
                        {"c/plugin": {"identical": False, "first_mismatch": "prompt 0, token 3: output ids differ",
                                      "logprobs_compared": True}})
    # Round by round: 111/101 and 115/99; stock's own row is the reference, with no range.
    assert cells["plugin"]["ratio_by_round"] == pytest.approx([111 / 101, 115 / 99])
    assert "| c | 1 | plugin | 113.0 (110.6) | 1.130 (1.099-1.162) |" in md
    assert cells["stock"]["ratio_by_round"] == [] and re.search(r"\| c \| 1 \| stock \| [^|]+ \| 1\.000 \|", md)
    # A round only one arm ran (a time budget cut the other) is left out of the range.
    lone = stats.cells(rows + [load_row("c", 1, "plugin", 2, [50, 50], 100)])
    assert next(c for c in lone if c["arm"] == "plugin")["ratio_by_round"] == pytest.approx([111 / 101, 115 / 99])
    assert "| c/plugin | failed |" in md and "NO: prompt 0, token 3" in md


def test_a_multi_process_servers_further_ranks_are_read_from_their_own_traces(tmp_path):
    """TP/DP servers: rank r > 0 writes ``<root>.rank<r><ext>`` (audit.rank_path); each rank's syncs and
    run-ahead over the same windows, rank 0's in the main table as before; a run without them unchanged."""
    from sglang_hostsync_plugin.slots.audit import TRACE_HEADER, rank_path

    sync = ("x.py:1 (f)",)
    ranks = {0: [step(k, k * 0.01, k * 0.01 + 0.012) for k in range(20)],  # ahead, no sync
             1: [step(k, k * 0.01, k * 0.01 + 0.005, sites=sync) for k in range(20)],  # behind, syncing
             2: [step(k, k * 0.01, k * 0.01 + 0.012, sites=sync * (k % 2)) for k in range(20)]}
    trace = tmp_path / "c__plugin.trace.tsv"
    for rank, steps in ranks.items():
        with open(rank_path(str(trace), rank), "w") as f:
            f.write(TRACE_HEADER + "".join(format_trace_line(x) for x in steps))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c__plugin.trace.rank1.tsv", "c__plugin.trace.rank2.tsv",
                                                         "c__plugin.trace.tsv"]
    rows = [{**load_row("c", 1, arm, rnd, [100, 100], 100), "t_start": 0.0 + rnd * 0.1, "t_end": 0.095 + rnd * 0.1}
            for arm in ("stock", "plugin") for rnd in (0, 1)]
    result = {"rows": rows}
    windows = run.attach_audit(result, {("c", "plugin"): str(trace)})
    assert sorted(windows, key=str) == [("c", 1, "plugin"), ("c", 1, "plugin", 1), ("c", 1, "plugin", 2)]
    assert [len(w) for w in windows[("c", 1, "plugin", 1)]] == [10, 10]
    cells = {c["arm"]: c for c in stats.cells(rows, windows)}
    plugin = cells["plugin"]
    assert plugin["audit"]["syncs_per_step"] == 0 and plugin["audit"]["run_ahead_fraction"] == 1.0
    assert plugin["other_ranks"]["1"]["syncs_per_step"] == 1.0 and plugin["other_ranks"]["1"]["run_ahead_fraction"] == 0.0
    assert plugin["other_ranks"]["2"]["syncs_per_step"] == 0.5 and plugin["other_ranks"]["2"]["steps"] == 20
    assert cells["stock"]["other_ranks"] == {}
    md = stats.markdown(list(cells.values()), {}, {})
    assert "| c | 1 | plugin | 1 | 20 | 1.00 | 0.000 |" in md and "| c | 1 | plugin | 2 | 20 | 0.50 | 1.000 |" in md
    json.loads(json.dumps(plugin))  # e2e.json
    # benchmarks/e2e_rereport.py finds the further ranks' traces beside rank 0's (here one xz'd).
    with open(rank_path(str(trace), 1), "rb") as f, lzma.open(rank_path(str(trace), 1) + ".xz", "wb") as g:
        g.write(f.read())
    os.unlink(rank_path(str(trace), 1))
    meta = {"date": "d", "command": "c", "rounds": 2, "max_new_tokens": 16, "arms": ["stock", "plugin"]}
    with open(tmp_path / "e2e.json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "identity": {}, "servers": {
            "c/stock": {"command": "python -m sglang.launch_server"},
            "c/plugin": {"command": f"{ENV_TRACE}={trace} python -m sglang.launch_server"}}}, f)
    spec = importlib.util.spec_from_file_location("e2e_rereport", os.path.join(REPO, "benchmarks", "e2e_rereport.py"))
    rereport = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rereport)
    assert "| c | 1 | plugin | 1 | 20 | 1.00 | 0.000 |" in rereport.rereport(str(tmp_path), str(tmp_path / "again"))
    os.rename(rank_path(str(trace), 1) + ".xz", tmp_path / "elsewhere.xz")
    # One rank only: no further-ranks table.
    os.unlink(rank_path(str(trace), 2))
    windows = run.attach_audit({"rows": rows}, {("c", "plugin"): str(trace)})
    assert list(windows) == [("c", 1, "plugin")]
    assert "Further ranks" not in stats.markdown(stats.cells(rows, windows), {}, {})


def test_host_work_is_divided_by_the_stock_code_arms_of_the_same_cell():
    def phased(result_us, sim_us, other_us):
        return [TraceStep(k, k * 0.01, k * 0.01 + 0.012, True, 900.0, (), 0.0,
                          {"result": (result_us, 0.0), "simulate": (sim_us, 0.0), "other": (other_us, 0.0)})
                for k in range(3)]
    rows = [load_row("c", 1, arm, 0, [100, 100], 200) for arm in ("stock", "audit", "plugin")]
    windows = {("c", 1, "audit"): [phased(100.0, 200.0, 1800.0)],  # work 2000 µs, of which 200 simulated
               ("c", 1, "plugin"): [phased(1000.0, 200.0, 800.0)]}  # work 1000 µs
    cells = {c["arm"]: c for c in stats.cells(rows, windows)}
    assert cells["plugin"]["host_work_ratio_to_stock_code"] == pytest.approx(0.5)
    assert cells["plugin"]["host_work_ratio_to_stock_code_unsimulated"] == pytest.approx(800 / 1800)
    assert "host_work_ratio_to_stock_code" not in cells["audit"] and "host_work_ratio_to_stock_code" not in cells["stock"]
    md = stats.markdown(list(cells.values()), {}, {})
    assert "| host µs/step: CPU (work, x stock code's) |" in md
    assert re.search(r"\| c \| 1 \| plugin \| .* \| [0-9]+ \(1000, 0\.500x\) \|", md), md
    assert re.search(r"\| c \| 1 \| audit \| .* \| [0-9]+ \(2000\) \|", md), md
    assert "benchmark-only host work in both arms): c c1 plugin 0.444x\n" in md, md
    # Without a stock-code arm in the run: no ratio.
    alone = {c["arm"]: c for c in stats.cells(rows[::2], {("c", 1, "plugin"): windows[("c", 1, "plugin")]})}
    assert "host_work_ratio_to_stock_code" not in alone["plugin"]
    assert "without SGLang's simulated acceptance" not in stats.markdown(list(alone.values()), {}, {})


def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    i, idat = 8, b""
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        kind = data[i + 4:i + 8]
        if kind == b"IDAT":
            idat += data[i + 8:i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    rows = [raw[r * (width * 3 + 1) + 1:(r + 1) * (width * 3 + 1)] for r in range(height)]
    return width, height, lambda x, y: tuple(rows[y][3 * x:3 * x + 3])


def test_png_charts_draw_what_they_are_given(tmp_path):
    path = str(tmp_path / "bars.png")
    bar_chart(path, [[1.2, None], [0.8, 1.0]], width=100, height=60)
    w, h, px = read_png(path)
    assert (w, h) == (100, 60)
    mid = (h - 1) // 2
    assert px(20, mid - 10) == (200, 40, 40)  # the first bar rises above the reference line
    assert px(60, mid + 10) == (200, 40, 40)  # the third (0.8) falls below it
    assert px(20, h - 2) == (255, 255, 255)
    line_plot(str(tmp_path / "line.png"), {"stock": [-1.0, -1.0], "plugin": [1.0, 1.0]}, width=40, height=31)
    w, h, px = read_png(str(tmp_path / "line.png"))
    assert px(20, 10) == (30, 90, 200) and px(20, h - 11) == (200, 40, 40)


# --- a whole run against fake servers -------------------------------------------

def test_ready_times_do_not_include_another_servers_first_request(tmp_path, monkeypatch):
    # Polled one after another, the plugin's ready time included stock's slow first request:
    # every e2e table showed the plugin 2-5 s slower to start than stock.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_SGLANG_FIRST_GENERATE_S", "4")
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock,plugin",
            "--concurrency", "1", "--rounds", "1", "--requests", "1", "--max-new-tokens", "16",
            "--identity-tokens", "8", "--port", str(free_port_base(2)), "--out", str(out)]
    assert run.main(argv) == 0
    servers = json.load(open(out / "e2e.json"))["servers"]
    stock, plugin = (servers[f"standalone-t4-p16/{a}"] for a in ("stock", "plugin"))
    assert stock["first_request_s"] >= 4 and plugin["first_request_s"] >= 4
    assert abs(plugin["ready_s"] - stock["ready_s"]) < 2.5, (stock["ready_s"], plugin["ready_s"])


def test_a_port_that_already_answers_stops_the_run_before_any_server_starts(tmp_path, capsys):
    """A server left on one of the arms' ports (an earlier run's) would answer the e2e's /health
    polls and requests in place of the server it starts, whose own bind then fails."""
    import socket
    port = free_port_base(2)
    stale = socket.socket()
    stale.bind(("127.0.0.1", port + 1))
    stale.listen()
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock,plugin",
            "--port", str(port), "--out", str(out)]
    try:
        assert run.ports_answering(port, 2) == [port + 1]
        assert run.main(argv) == 2
    finally:
        stale.close()
    err = capsys.readouterr().err
    assert f"port(s) {port + 1} on 127.0.0.1 already answer" in err and f"(it uses {port}-{port + 1})" in err
    assert not out.exists()  # nothing written, nothing started
    assert run.ports_answering(port, 2) == []


def test_a_configuration_whose_ports_still_answer_is_not_started(tmp_path, monkeypatch):
    # Between configurations the previous servers are stopped; one that lingers on a port fails the
    # next configuration's arms as not started (named), instead of being measured as theirs.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    port = free_port_base(2)
    calls = []

    def answering(first, count):
        calls.append(first)
        return [] if len(calls) == 1 else [first]

    monkeypatch.setattr(run, "ports_answering", answering)
    monkeypatch.setattr(run, "PORT_WAIT_S", 1.0)  # polled again every 0.5 s until then
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock,plugin",
            "--port", str(port), "--out", str(out)]
    assert run.main(argv) == 1  # the main check passed (first call), the configuration's failed
    assert len(calls) >= 3 and set(calls) == {port}  # asked again while the wait lasted
    servers = json.load(open(out / "e2e.json"))["servers"]
    for arm in ("stock", "plugin"):
        s = servers[f"standalone-t4-p16/{arm}"]
        assert s["ready_s"] is None and f"port(s) {port} on 127.0.0.1 already answer" in s["error"]
    assert not list(out.glob("*.log"))  # no server was launched
    md = (out / "e2e.md").read_text()
    assert f"- standalone-t4-p16/plugin: port(s) {port} on 127.0.0.1 already answer" in md
    assert "| standalone-t4-p16/plugin | failed | - | - |" in md  # no identity verdict for what never served


def test_a_port_that_closes_while_the_next_configuration_waits_is_started(monkeypatch):
    calls = []

    def answering(first, count):
        calls.append(first)
        return [first] if len(calls) < 3 else []

    monkeypatch.setattr(run, "ports_answering", answering)
    assert run.ports_problem(31000, 2, wait_s=5.0) is None
    assert len(calls) == 3
    calls.clear()
    assert "port(s) 31000 " in run.ports_problem(31000, 2)  # no wait: the first answer stands
    assert len(calls) == 1


def test_ready_all_reports_each_server_on_its_own():
    dead = "http://127.0.0.1:9"
    t0 = time.perf_counter()
    out = client.wait_ready_all({"gone": (dead, t0, lambda: False), "late": (dead, t0, lambda: True)}, 0.3, poll_s=0.01)
    assert "exited before it was ready" in str(out["gone"]) and "not ready after" in str(out["late"])
    assert time.perf_counter() - t0 < 5
    # An error outside the client's own (here from ``alive``) is that server's answer, not a lost thread.
    def broken():
        raise RuntimeError("no such process")
    out = client.wait_ready_all({"odd": (dead, t0, broken), "gone": (dead, t0, lambda: False)}, 0.3, poll_s=0.01)
    assert isinstance(out["odd"], client.ClientError) and "no such process" in str(out["odd"])
    assert "exited before it was ready" in str(out["gone"])


def test_whole_run_against_fake_servers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(run, "gpu_free_gib", lambda: 2.5)  # as nvidia-smi would say on a full GPU
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--concurrency", "1", "2",
            "--rounds", "2", "--requests", "3", "--requests-per-user", "3", "--max-new-tokens", "16",
            "--identity-tokens", "8",
            "--slots", "default,perturb", "--slots", "crash", "--slots", "die", "--port", str(free_port_base(6)), "--out", str(out),
            "--plugin-env", "SGLANG_HOSTSYNC_GLUE_CHECK=5"]
    t0 = time.perf_counter()
    assert run.main(argv) == 1  # the perturbed arm differs, the crashing one never started, one died
    assert "only 2.5 GiB of GPU memory free with 5 servers up" in capsys.readouterr().out
    result = json.load(open(out / "e2e.json"))
    assert result["gpu_free_gib_after_warmup"] == {"standalone-t4-p16": 2.5}
    servers = result["servers"]
    assert servers["standalone-t4-p16/slots:crash"]["ready_s"] is None
    assert "exited before it was ready" in servers["standalone-t4-p16/slots:crash"]["error"]
    assert servers["standalone-t4-p16/plugin"]["status_block"][1].split() == ["audit", "applied"]
    ident = result["identity"]
    assert ident["standalone-t4-p16/plugin"]["identical"] and ident["standalone-t4-p16/audit"]["identical"]
    assert not ident["standalone-t4-p16/slots:default,perturb"]["identical"]
    # The arm that died inside c1 round 0 keeps that row (with its errors) and nothing after it;
    # the rest of the run and its report go on.
    assert "c1 round 0" in servers["standalone-t4-p16/slots:die"]["died"]
    assert "dying while serving" in servers["standalone-t4-p16/slots:die"]["log_tail"]
    died_rows = [r for r in result["rows"] if r["arm"] == "slots:die"]
    assert [(r["concurrency"], r["round"]) for r in died_rows] == [(1, 0)] and died_rows[0]["errors"]
    rows = [r for r in result["rows"] if r["arm"] != "slots:die"]
    assert {(r["arm"], r["concurrency"]) for r in rows} == {(a, c) for a in ("stock", "audit", "plugin", "slots:default,perturb") for c in (1, 2)}
    # a c1 window of --requests (3), a c2 window of --requests-per-user (3) per user
    assert {(r["concurrency"], r["load"]["requests"]) for r in rows} == {(1, 3), (2, 6)}
    # Every server was warmed at c2 (two requests in flight) before the first measured round began.
    first_row = min(r["t_start"] for r in result["rows"])
    for arm in ("stock", "audit", "plugin", "slots:default,perturb"):
        log = (out / servers[f"standalone-t4-p16/{arm}"]["log"]).read_text()
        (at,) = re.findall(r"fake server: 2 requests in flight at ([0-9.]+)", log)
        assert float(at) < first_row, arm
    first_round = [r["arm"] for r in rows if r["concurrency"] == 1 and r["round"] == 0]
    second_round = [r["arm"] for r in rows if r["concurrency"] == 1 and r["round"] == 1]
    assert second_round == first_round[::-1]  # ABBA
    cells = {(c["arm"], c["concurrency"]): c for c in result["cells"]}
    assert cells[("plugin", 1)]["audit"]["syncs_per_step"] == 0 and cells[("plugin", 1)]["audit"]["run_ahead_fraction"] == 1.0
    assert cells[("audit", 1)]["audit"]["syncs_per_step"] == 1.0 and cells[("audit", 1)]["audit"]["run_ahead_fraction"] == 0.0
    assert cells[("stock", 1)]["audit"] is None and cells[("plugin", 2)]["ratio_tok_s_user"] > 0
    md = (out / "e2e.md").read_text()
    # Exited during the shared start: started once more alone, failed again, reported failed.
    assert "| standalone-t4-p16/slots:crash | failed (restarted alone) |" in md and (out / "e2e.png").exists()
    assert servers["standalone-t4-p16/slots:crash"]["restarted_alone"] == "fake server: crashing before ready"
    assert (out / "standalone-t4-p16__slots_crash.first-start.log").exists()
    assert "- standalone-t4-p16/slots:die: exited (rc 5) during c1 round 0" in md
    # --plugin-env reached the plugin arms only; each slot's last self-check line is reported.
    assert servers["standalone-t4-p16/plugin"]["slot_checks"] == ["draft_extend_glue_graph check: 10 checks, 0 mismatches"]
    assert servers["standalone-t4-p16/stock"]["slot_checks"] == []
    assert "- standalone-t4-p16/plugin: draft_extend_glue_graph check: 10 checks, 0 mismatches" in md
    merged = run.merge([str(out)], str(tmp_path / "merged"))
    assert merged["cells"] == result["cells"] and (tmp_path / "merged" / "e2e.md").exists()
    # benchmarks/e2e_rereport.py: the same cells again from e2e.json and the traces (one of them xz'd,
    # as the results folders keep them).
    trace = out / os.path.basename(servers["standalone-t4-p16/plugin"]["command"].split(ENV_TRACE + "=")[1].split()[0])
    with open(trace, "rb") as f, lzma.open(str(trace) + ".xz", "wb") as g:
        g.write(f.read())
    trace.unlink()
    spec = importlib.util.spec_from_file_location("e2e_rereport", os.path.join(REPO, "benchmarks", "e2e_rereport.py"))
    rereport = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rereport)
    md_again = rereport.rereport(str(out), str(tmp_path / "again"))
    again = json.load(open(tmp_path / "again" / "e2e.json"))
    assert again["cells"] == result["cells"] and md.endswith(md_again)
    assert time.perf_counter() - t0 < 300


def test_a_server_that_exits_during_the_shared_start_is_started_again_alone(tmp_path, monkeypatch):
    """As SGLang's KV sizing did on the H200 with five servers loading at once (2026-12-05-h200-c): the
    arm that exited is started once more, alone, serves, and the report says so."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock",
            "--slots", "crash_once", "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "8",
            "--identity-tokens", "4", "--port", str(free_port_base(2)), "--out", str(out),
            "--plugin-env", f"FAKE_CRASH_ONCE={tmp_path / 'crashed'}"]
    assert run.main(argv) == 0
    result = json.load(open(out / "e2e.json"))
    srv = result["servers"]["standalone-t4-p16/slots:crash_once"]
    assert srv["ready_s"] is not None and srv["restarted_alone"] == "fake server: crashing before ready, once"
    assert "restarted_alone" not in result["servers"]["standalone-t4-p16/stock"]
    assert result["identity"]["standalone-t4-p16/slots:crash_once"]["identical"]
    first = (out / "standalone-t4-p16__slots_crash_once.first-start.log").read_text()
    assert "crashing before ready, once" in first
    assert "crashing" not in (out / srv["log"]).read_text()
    assert "| standalone-t4-p16/slots:crash_once | " in (out / "e2e.md").read_text()
    assert " (restarted alone) |" in (out / "e2e.md").read_text()


def test_a_server_ready_with_too_small_a_kv_pool_is_started_again_alone(tmp_path, monkeypatch):
    """As on the H100 with four DFlash servers starting at once (2026-12-06): one became ready with a
    192-token KV pool and its first 256-token request waited until the client gave up. The arm whose
    ``/server_info`` says fewer tokens than one request needs is stopped and started once more alone."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock",
            "--slots", "small_kv_once", "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "8",
            "--identity-tokens", "4", "--prompt-len", "64", "--port", str(free_port_base(2)), "--out", str(out),
            "--plugin-env", f"FAKE_SMALL_KV_ONCE={tmp_path / 'small'}"]
    assert run.main(argv) == 0
    result = json.load(open(out / "e2e.json"))
    srv = result["servers"]["standalone-t4-p16/slots:small_kv_once"]
    assert srv["ready_s"] is not None
    assert srv["restarted_alone"] == "KV pool of 64 tokens, fewer than the 72 the run's largest load holds"
    assert "restarted_alone" not in result["servers"]["standalone-t4-p16/stock"]  # its pool is large enough
    assert "a KV pool of 64 tokens" in (out / "standalone-t4-p16__slots_small_kv_once.first-start.log").read_text()
    assert "a KV pool of 64 tokens" not in (out / srv["log"]).read_text()
    assert result["identity"]["standalone-t4-p16/slots:small_kv_once"]["identical"]
    assert srv["kv_tokens"] == 1 << 20 and result["servers"]["standalone-t4-p16/stock"]["kv_tokens"] == 1 << 20
    assert f"| standalone-t4-p16/slots:small_kv_once | {srv['ready_s']:.1f} (restarted alone) | {1 << 20} | " in (
        out / "e2e.md").read_text()


def test_a_server_whose_first_request_fails_is_stopped_before_the_rounds(tmp_path, monkeypatch):
    """On the H100 of 2026-12-06 a DFlash server whose first request never finished stayed up, that
    request still held, through the other arms' rounds; they read run-ahead 0.000 there and 0.999-1.000
    in the same command without it. A server that fails is stopped at once."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock",
            "--slots", "fail_first", "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "8",
            "--identity-tokens", "4", "--port", str(free_port_base(2)), "--out", str(out)]
    run.main(argv)
    result = json.load(open(out / "e2e.json"))
    srv = result["servers"]["standalone-t4-p16/slots:fail_first"]
    assert srv["ready_s"] is None and "HTTP 500" in srv["error"]
    (stopped,) = re.findall(r"fake server: SIGTERM at ([0-9.]+)", (out / srv["log"]).read_text())
    rounds = [r for r in result["rows"] if r["arm"] == "stock"]
    assert rounds and float(stopped) < min(r["t_start"] for r in rounds)
    assert "| standalone-t4-p16/slots:fail_first | failed |" in (out / "e2e.md").read_text()


def test_a_server_whose_kv_pool_is_too_small_alone_too_fails_at_once(tmp_path, monkeypatch):
    """Restarted alone and still too small: reported failed before its first request (which would
    wait until the client's 300 s timeout) and stopped; the other arms run their rounds."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock",
            "--slots", "small_kv", "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "8",
            "--identity-tokens", "4", "--prompt-len", "64", "--port", str(free_port_base(2)), "--out", str(out)]
    t0 = time.perf_counter()
    assert run.main(argv) == 1
    assert time.perf_counter() - t0 < 120
    result = json.load(open(out / "e2e.json"))
    srv = result["servers"]["standalone-t4-p16/slots:small_kv"]
    assert srv["ready_s"] is None and srv["restarted_alone"].startswith("KV pool of 64 tokens")
    assert srv["error"].endswith("KV pool of 64 tokens, fewer than the 72 the run's largest load holds")
    assert srv["kv_tokens"] == 64
    assert "| standalone-t4-p16/slots:small_kv | failed (restarted alone) | 64 | " in (out / "e2e.md").read_text()
    assert "fake server: SIGTERM at" in (out / srv["log"]).read_text()
    assert [r["arm"] for r in result["rows"]] == ["stock"]


def test_a_max_total_tokens_below_the_largest_load_is_refused_before_any_server_starts(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--configs", "standalone-t4-p16", "--concurrency", "1", "8", "--max-total-tokens", "3000",
            "--out", str(out)]  # 8 x (128 + 256) = 3072
    assert run.main(argv) == 2
    assert "--max-total-tokens 3000 is fewer than the 3072 KV tokens" in capsys.readouterr().err
    assert not out.exists()


def test_the_largest_load_is_the_highest_concurrency_or_one_identity_request():
    args = run.build_parser().parse_args(["--concurrency", "1", "4", "--prompt-len", "128", "--max-new-tokens", "256"])
    assert run.tokens_needed(args) == 4 * (128 + 256)
    # The identity pass sends its requests one at a time: one long one outweighs two short concurrent ones.
    args = run.build_parser().parse_args(["--concurrency", "2", "--prompt-len", "64", "--max-new-tokens", "8",
                                          "--identity-tokens", "200"])
    assert run.tokens_needed(args) == 64 + 200


def test_kv_tokens_is_none_where_the_server_does_not_say(tmp_path):
    """No answer, an error status, no such field or not an integer: None, so no server is restarted
    or failed for a pool size nobody reported."""
    import http.server
    import threading

    bodies = {"/missing/server_info": b'{"version": "x"}', "/text/server_info": b'{"max_total_num_tokens": "192"}',
              "/int/server_info": b'{"max_total_num_tokens": 192}'}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = bodies.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert client.kv_tokens(f"{base}/int") == 192
        assert client.kv_tokens(f"{base}/missing") is None and client.kv_tokens(f"{base}/text") is None
        assert client.kv_tokens(f"{base}/none") is None  # 404
    finally:
        srv.shutdown()
    assert client.kv_tokens(f"http://127.0.0.1:{free_port_base(1)}", timeout=1.0) is None  # nothing listening


def test_where_no_server_of_the_start_came_up_none_is_started_again():
    class Exited:
        def alive(self):
            return False

        def stop(self):
            raise AssertionError("restarted")

    servers = {"stock": Exited(), "plugin": Exited()}
    failed = {name: client.ClientError("exited before it was ready") for name in servers}
    run.restart_alone(servers, failed, 1.0)  # would raise on a restart


def test_a_killed_run_stops_its_servers_and_reports_the_rounds_that_finished(tmp_path):
    """A timeout's SIGTERM mid-run (the H200's device calls end that way): every server stops, and
    e2e.json and e2e.md hold the rounds that finished, marked as interrupted. Before, the report was
    written only at the very end, and the servers' shutdowns, one after another, outlasted the limit."""
    from helpers import clean_env

    out, port = tmp_path / "run", free_port_base(2)
    argv = [sys.executable, "-m", "sglang_hostsync_plugin.e2e", "--server-module", "fake_sglang_server", "--weights", "dummy",
            "--configs", "standalone-t4-p16", "--arms", "stock,plugin", "--concurrency", "1", "--rounds", "200",
            "--requests", "2", "--max-new-tokens", "16", "--identity-tokens", "8", "--port", str(port), "--out", str(out)]
    env = clean_env(PYTHONPATH=os.pathsep.join([TESTS, REPO]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if " c1 r2 " in line:
            break
    proc.send_signal(15)
    t0 = time.perf_counter()
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert time.perf_counter() - t0 < 30
    result = json.load(open(out / "e2e.json"))
    assert result["meta"]["stopped"] == "interrupted (signal 15)"
    rounds = {r["round"] for r in result["rows"]}
    assert {0, 1} <= rounds and max(rounds) < 199
    assert {c["arm"] for c in result["cells"]} == {"stock", "plugin"}
    assert "(interrupted (signal 15): the rounds that finished)" in (out / "e2e.md").read_text()
    for k in range(2):  # both servers are gone
        assert not client.health(f"http://127.0.0.1:{port + k}", timeout=0.5)


def fake_servers_saving(monkeypatch) -> list[int]:
    """Fake servers on the path; the row count at each ``run.save``, in order."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    saved = []
    real = run.save
    monkeypatch.setattr(run, "save", lambda result, out_dir: saved.append(len(result["rows"])) or real(result, out_dir))
    return saved


def test_each_finished_round_is_saved_and_a_budget_stop_is_named(tmp_path, monkeypatch):
    saved = fake_servers_saving(monkeypatch)
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock,plugin",
            "--concurrency", "1", "--rounds", "3", "--requests", "1", "--max-new-tokens", "16",
            "--identity-tokens", "8", "--port", str(free_port_base(2)), "--out", str(out)]
    assert run.main(argv) == 0
    assert saved[:5] == [0, 0, 2, 4, 6]  # after the real-traffic pass, the identity pass, then every round
    assert "stopped" not in json.load(open(out / "e2e.json"))["meta"]
    budget = tmp_path / "budget"
    assert run.main([*argv[:-1], str(budget), "--time-budget", "0"]) == 0
    assert json.load(open(budget / "e2e.json"))["meta"]["stopped"] == "time budget spent"
    assert "(time budget spent: the rounds that finished)" in (budget / "e2e.md").read_text()


def test_a_rounds_passes_slice_its_window_and_reverse_the_arms_pass_by_pass():
    """--passes K: the window's requests in K slices of at least one request per concurrent user (fewer
    passes where the window is too short), each pass over the arms in turn, reversed pass by pass."""
    args = run.build_parser().parse_args(["--requests", "8", "--requests-per-user", "4", "--passes", "4"])
    order = ["A", "B", "C"]
    c1 = run.round_passes(args, 1, 0, order)
    assert [(p, "".join(o), list(idx)) for p, o, idx in c1] == [
        (0, "ABC", [0, 1]), (1, "CBA", [2, 3]), (2, "ABC", [4, 5]), (3, "CBA", [6, 7])]
    c8 = run.round_passes(args, 8, 1, order)  # a window of 32 (4 per user): four bursts of 8
    assert [len(idx) for _, _, idx in c8] == [8] * 4 and [i for _, _, idx in c8 for i in idx] == list(range(32))
    short = run.build_parser().parse_args(["--requests", "10", "--requests-per-user", "1", "--passes", "4"])
    assert [len(idx) for _, _, idx in run.round_passes(short, 4, 0, order)] == [5, 5]  # 10 // 4: two passes
    assert [len(idx) for _, _, idx in run.round_passes(short, 3, 0, order)] == [3, 3, 4]
    odd = run.build_parser().parse_args(["--requests", "3", "--passes", "3"])
    assert ["".join(o) for _, o, _ in run.round_passes(odd, 1, 1, order)] == ["CBA", "ABC", "CBA"]
    one = run.build_parser().parse_args(["--requests", "8"])  # the default: one pass, ABBA by round
    assert [("".join(o), len(idx)) for r in (0, 1) for _, o, idx in run.round_passes(one, 1, r, order)] == [
        ("ABC", 8), ("CBA", 8)]
    with pytest.raises(ValueError, match="--passes"):
        run.plan(run.build_parser().parse_args(["--passes", "0"]))


def test_a_rounds_figure_pools_its_passes():
    """Two passes of a round: the round's tok/s/user is the median of both passes' requests, and the
    cell counts rounds, not passes."""
    rows = [{**load_row("c", 1, "stock", r, v, 100), "pass": p}
            for r, p, v in ((0, 0, [100, 100, 100]), (0, 1, [80]), (1, 0, [90, 90]), (1, 1, [90, 90]))]
    rows += [{**load_row("c", 1, "plugin", r, v, 100), "pass": p}
             for r, p, v in ((0, 0, [120, 120, 120]), (0, 1, [88]), (1, 0, [99, 99]), (1, 1, [99, 99]))]
    cells = {c["arm"]: c for c in stats.cells(rows)}
    # pooled, not the mean of the passes' medians (90 and 104 there)
    assert cells["stock"]["tok_s_user_by_round"] == {0: 100, 1: 90} and cells["stock"]["rounds"] == 2
    assert cells["plugin"]["ratio_by_round"] == pytest.approx([120 / 100, 99 / 90])
    assert cells["plugin"]["requests"] == 8
    # A round an arm did not run whole (its second pass missing, or without a finished request) has no ratio.
    cut = [r for r in rows if not (r["arm"] == "plugin" and r["round"] == 0 and r["pass"] == 1)]
    assert {c["arm"]: c for c in stats.cells(cut)}["plugin"]["ratio_by_round"] == pytest.approx([99 / 90])
    failed = [r if (r["arm"], r["round"], r["pass"]) != ("plugin", 1, 1) else
              {**r, "load": {**r["load"], "tok_s_user_all": [], "requests": 0}} for r in rows]
    assert {c["arm"]: c for c in stats.cells(failed)}["plugin"]["ratio_by_round"] == pytest.approx([120 / 100])


def test_passes_against_fake_servers(tmp_path, monkeypatch):
    saved = fake_servers_saving(monkeypatch)
    sent = []  # each timed window's prompts, in the order of the rows
    real_load = run.client.run_load
    monkeypatch.setattr(run.client, "run_load", lambda base, batch, conc, n: sent.append(batch) or real_load(
        base, batch, conc, n))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16",
            "--arms", "stock,plugin", "--concurrency", "1", "2", "--rounds", "2", "--requests", "4",
            "--requests-per-user", "1", "--passes", "4", "--max-new-tokens", "16", "--identity-tokens", "8",
            "--traffic", "off", "--port", str(free_port_base(2)), "--out", str(out)]
    assert run.main(argv) == 0
    result = json.load(open(out / "e2e.json"))
    rows = result["rows"]
    sent = sent[len(sent) - len(rows):]  # the warm-ups come first
    assert result["meta"]["passes"] == {"1": 4, "2": 2}
    windows = {}
    for conc, k in ((1, 4), (2, 2)):
        first = None
        for rnd in (0, 1):
            these = [(r["arm"], r["pass"], tuple(map(tuple, b))) for r, b in zip(rows, sent)
                     if r["concurrency"] == conc and r["round"] == rnd]
            first = first or these[0][0]
            other = "plugin" if first == "stock" else "stock"
            # even k: every round starts with the same arm, the order reversed pass by pass
            assert [a for a, _, _ in these] == [first, other, other, first] * (k // 2), (conc, rnd, these)
            assert [p for _, p, _ in these] == [p for p in range(k) for _ in (0, 1)]
            by_pass = {p: {b for _, q, b in these if q == p} for p in range(k)}
            assert all(len(b) == 1 for b in by_pass.values())  # both arms got the pass's prompts
            # the passes together are the round's window of 4 distinct prompts, each pass its own slice
            windows[conc, rnd] = [p for q in range(k) for p in next(iter(by_pass[q]))]
            assert len(set(windows[conc, rnd])) == 4
    # c1 and c2 windows hold the same 4 prompts (4 requests either way), in the same order; rounds differ
    assert windows[1, 0] == windows[2, 0] and windows[1, 1] == windows[2, 1] and windows[1, 0] != windows[1, 1]
    assert [n for n in saved if n][:4] == [8, 16, 20, 24]  # saved after every round, all its passes
    md = (out / "e2e.md").read_text()
    assert "each round in passes (c1 4, c2 2), the arm order reversed pass by pass" in md
    assert re.search(r"\| standalone-t4-p16 \| 1 \| plugin \| [^|]+ \| [0-9.]+ \([0-9.]+-[0-9.]+\) \|", md)


def test_the_real_traffic_pass_runs_before_the_rounds_and_any_difference_fails_the_run(tmp_path, monkeypatch):
    """Every server gets the request mix one at a time (compared with stock's), then concurrent clients with
    cut streams, the drain and one request after the aborts; a differing output or KV tokens still held
    after the drain fail the run, and the report's table says which."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    drained = run.traffic.wait_drained
    monkeypatch.setattr(run.traffic, "wait_drained", lambda base: drained(base, timeout=3.0))  # the leak never drains
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16",
            "--arms", "stock,plugin", "--slots", "perturb_traffic", "--slots", "leak", "--concurrency", "1",
            "--rounds", "1", "--requests", "1", "--max-new-tokens", "16", "--identity-tokens", "8",
            "--traffic-requests", "24", "--traffic-aborts", "4", "--port", str(free_port_base(4)), "--out", str(out)]
    assert run.main(argv) == 1
    result = json.load(open(out / "e2e.json"))
    t = result["traffic"]
    clean, perturbed, leak = (t[f"standalone-t4-p16/{a}"] for a in ("plugin", "slots:perturb_traffic", "slots:leak"))
    assert clean["sequential"]["identical"] and clean["sequential"]["compared"] >= 20
    assert clean["concurrent"] == {**clean["concurrent"], "errors": [], "health": True, "aborted": 4}
    assert clean["tokens_after_drain"] == 0 and clean["log_problems"] == [] and clean["after_aborts"]["identical"]
    assert not perturbed["sequential"]["identical"]
    assert {m["name"].split("-")[0] for m in perturbed["sequential"]["mismatches"]} == {"logit"}
    assert leak["tokens_after_drain"] > 0 and leak["sequential"]["identical"]
    # The pass ran before the rounds: every row starts after each server's last traffic request.
    assert min(r["t_start"] for r in result["rows"]) > 0 and len(result["rows"]) == 4
    md = (out / "e2e.md").read_text()
    assert "## Real traffic" in md and "| standalone-t4-p16/plugin | " in md
    assert "standalone-t4-p16/slots:perturb_traffic | " in md and "(first: logit-bias" in md
    assert run.traffic_failures(result) == [
        "standalone-t4-p16/slots:perturb_traffic: outputs differ from stock one at a time",
        f"standalone-t4-p16/slots:leak: {leak['tokens_after_drain']} KV tokens still held after the drain"]
    off = tmp_path / "off"
    assert run.main([*argv[:-1], str(off), "--traffic", "off"]) == 0  # neither switch shows without the pass
    assert json.load(open(off / "e2e.json"))["traffic"] == {} and "## Real traffic" not in (off / "e2e.md").read_text()


def test_after_the_aborts_an_ngram_servers_request_is_no_evidence_where_its_trie_was_not_emptied():
    """NGRAM's trie holds the concurrent phase's outputs, which differ between any two servers, unless
    /flush_cache emptied it (the run does; where it could not, the comparison is marked no evidence)."""
    result = {"traffic": {"ngram-p1/plugin": {"after_aborts": {"identical": False, "evidence": False}},
                          "standalone-t4-p16/plugin": {"after_aborts": {"identical": False, "evidence": True}}}}
    assert run.traffic_failures(result) == ["standalone-t4-p16/plugin: the request after the aborts differs from stock's"]
    assert "differs (no evidence: trie)" in stats.traffic_markdown(result["traffic"])
    # An error after the aborts, or no KV token count after the drain, fails the run, trie or not.
    broken = {"ngram-p1/plugin": {"after_aborts_error": "an empty output", "tokens_after_drain": None,
                                  "after_aborts": {"identical": False, "evidence": False, "errors": ["x"]}}}
    assert run.traffic_failures({"traffic": broken}) == [
        "ngram-p1/plugin: no KV token count after the drain",
        "ngram-p1/plugin: the request after the aborts failed: an empty output"]


def test_a_cut_reply_is_a_request_error_not_the_runs(monkeypatch):
    """http.client's errors (a server that dies mid-body) are neither OSError nor URLError."""
    import http.client
    import urllib.request

    from sglang_hostsync_plugin.e2e import traffic

    def cut(*a, **k):
        raise http.client.IncompleteRead(b"{")

    monkeypatch.setattr(urllib.request, "urlopen", cut)
    (out,) = traffic.sequential("http://127.0.0.1:9", traffic.request_mix(32000, 0)[:1])
    assert out.error and "IncompleteRead" in out.error and out.output_ids == ()
    assert traffic.token_usage("http://127.0.0.1:9") is None


def test_an_ngram_servers_trie_is_emptied_before_each_comparison_and_round(tmp_path, monkeypatch):
    """On an H100 (2026-12-06) NGRAM's identity pass after the concurrent phase differed at a token and its
    c1 accept length read 4.18 against stock's 3.51: each server's trie held other outputs. The run now
    empties every NGRAM server's trie (/flush_cache) before the request after the aborts, before the
    identity pass and before each arm's timed round, so those comparisons are evidence again; a server
    that refuses the flush makes them no evidence. The fake NGRAM server's greedy outputs move (by its
    port) once it ran three requests at once (the concurrent phase), until a flush."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "ngram-p1", "--arms", "stock,plugin",
            "--slots", "noflush", "--concurrency", "1", "2", "--rounds", "1", "--requests", "2", "--max-new-tokens", "16",
            "--identity-tokens", "8", "--traffic-requests", "12", "--traffic-aborts", "2",
            "--port", str(free_port_base(3)), "--out", str(tmp_path / "run")]
    assert run.main(argv) == 0  # the refusing server's differences are no evidence, so they do not fail the run
    result = json.load(open(tmp_path / "run" / "e2e.json"))
    plugin, refusing = (f"ngram-p1/{a}" for a in ("plugin", "slots:noflush"))
    assert result["identity"][plugin]["identical"] and result["identity"][plugin]["evidence"]
    assert result["traffic"][plugin]["after_aborts"] == {**result["traffic"][plugin]["after_aborts"],
                                                         "identical": True, "evidence": True}
    assert result["traffic"][refusing]["sequential"]["identical"]  # before any concurrency: evidence, and clean
    assert not result["identity"][refusing]["identical"] and not result["identity"][refusing]["evidence"]
    assert not result["traffic"][refusing]["after_aborts"]["evidence"]
    logs = {k: result["servers"][k]["log"] for k in ("ngram-p1/stock", plugin)}
    for key, log in logs.items():  # traffic, identity, one per timed cell (2 concurrencies x 1 round)
        assert open(tmp_path / "run" / log).read().count("fake server: flush_cache done") == 4, key
    verdict = {"identical": False, "first_mismatch": "prompt 1, token 9: output ids differ", "logprobs_compared": True,
               "prompts": 4, "evidence": False}
    md = stats.markdown([], {"ngram-p1/plugin": {"ready_s": 1.0}}, {"ngram-p1/plugin": verdict})
    assert "NO: prompt 1, token 9: output ids differ (no evidence: trie)" in md


def test_an_arms_file_stem_fits_a_file_name_and_stays_distinct():
    short = matrix.file_stem("eagle3-t1-p16", "slots:default,eagle_step_graph,-audit")
    assert short == "eagle3-t1-p16__slots_default_eagle_step_graph_-audit"
    # CALL=7b's third arm (H100 2026-12-07: "File name too long" opening its log, after two servers had started)
    minus = ",".join("-" + n for n in ("metadata_glue_graph", "draft_extend_glue_graph", "draft_decode_glue_graph",
                                       "draft_extend_topk_graph", "fused_draft_page_locs", "fused_relay_stash",
                                       "fused_tree_compact", "greedy_row_argmax", "draft_vocab_topk"))
    long_a = matrix.file_stem("eagle3-t1-p16", f"slots:default,eagle_step_graph,eagle_host,{minus},-audit")
    long_b = matrix.file_stem("eagle3-t1-p16", f"slots:default,eagle_step_graph,eagle_host,{minus},-chain_tree_full_mask,-audit")
    assert len(long_a) <= matrix.STEM_MAX and len(long_b) <= matrix.STEM_MAX and long_a != long_b
    assert long_a.startswith("eagle3-t1-p16__slots_default_eagle_step_graph_eagle_host")
    assert matrix.file_stem("c", "slots:é") == "c__slots__"  # counted in characters: ASCII only


def test_a_launch_that_fails_stops_the_servers_already_started(tmp_path, monkeypatch):
    # CALL=7b (H100 2026-12-07): the fourth server's log could not be opened; the three started kept running and
    # answered on the next call's ports, which then compared EAGLE3 servers against NGRAM ones.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    port = free_port_base(2)
    started = []

    class Recorded(run.Server):
        def __init__(self, launch):
            if started:  # where the real one failed: opening the arm's log
                raise OSError(36, "File name too long", launch.log)
            super().__init__(launch)
            started.append(self)

    monkeypatch.setattr(run, "Server", Recorded)
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16",
            "--arms", "stock,plugin", "--port", str(port), "--out", str(tmp_path / "run"), "--ready-timeout", "30"]
    try:
        with pytest.raises(OSError):
            run.main(argv)
        assert len(started) == 1
        assert started[0].proc.poll() is not None  # stopped, not left on its port
    finally:
        for srv in started:
            srv.stop()


def test_a_server_answering_with_another_model_is_not_measured_as_the_arms(tmp_path, monkeypatch):
    # CALL=11b (H100 2026-12-07): three arms' servers could not bind their ports, where an earlier call's
    # EAGLE3 servers answered; the e2e compared those in their place.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t4-p16", "--arms", "stock",
            "--slots", "foreign", "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "8",
            "--identity-tokens", "4", "--prompt-len", "64", "--port", str(free_port_base(2)), "--out", str(out)]
    assert run.main(argv) == 1
    result = json.load(open(out / "e2e.json"))
    srv = result["servers"]["standalone-t4-p16/slots:foreign"]
    assert srv["ready_s"] is None and "another server answers on this port (model /elsewhere/model" in srv["error"]
    assert result["servers"]["standalone-t4-p16/stock"]["ready_s"] is not None
    assert [r["arm"] for r in result["rows"]] == ["stock"]


def test_auto_is_judged_against_stock_and_the_best_arm_identical_to_stock():
    """Issue 63's bar per configuration and concurrency: identical, no round below stock, at least 98% of the
    best unaudited arm identical to stock (by round); an arm that changed outputs or ran audited is no bar,
    and the arm that runs auto's own pick is its A/A twin."""
    rows = [load_row("c", 1, "stock", r, [100], 100) for r in range(3)]
    rows += [load_row("c", 1, "slots:auto", r, [v], v) for r, v in enumerate([110, 112, 99])]
    rows += [load_row("c", 1, "slots:b", r, [v], v) for r, v in enumerate([115, 113, 112])]  # identical, faster
    rows += [load_row("c", 1, "slots:wrong", r, [200], 200) for r in range(3)]  # faster, outputs differ
    rows += [load_row("c", 1, "slots:audited", r, [300], 300) for r in range(3)]  # its timers cost: no bar
    arm_slots = {"stock": None, "slots:auto": "auto", "slots:b": "default,b", "slots:wrong": "default,w",
                 "slots:audited": "default,b,audit"}
    same = {"identical": True, "first_mismatch": None, "logprobs_compared": True, "evidence": True}
    identity = {f"c/{a}": same for a in ("slots:auto", "slots:b", "slots:audited")}
    identity["c/slots:wrong"] = {**same, "identical": False}
    traffic = {"c/slots:auto": {"sequential": {"identical": True, "evidence": True},
                                "concurrent": {"errors": [], "completed": 40, "aborted": 8, "health": True}}}
    servers = {"c/slots:auto": {"status_block": ["x hostsync: sglang 0.5.23, SGLANG_HOSTSYNC_SLOTS='auto'",
                                                 "  auto: C: measured 1.1x; pin it with SGLANG_HOSTSYNC_SLOTS=default,a"]}}
    cell_rows = stats.cells(rows)
    (v,) = stats.auto_verdicts(cell_rows, arm_slots, identity, traffic, servers)
    assert v["picked"] == "default,a" and v["identical"] is True
    assert v["best"] == "slots:b" and not v["best_is_the_pick"]
    assert v["lowest_round"] == pytest.approx(0.99) and not v["never_below"]
    assert v["over_best"] == pytest.approx(110 / 115) and not v["within"]
    # b is the set auto picked: the pair is A/A, so auto is within by its choice (the round-one miss stays)
    servers["c/slots:auto"]["status_block"][1] = "  auto: C: 1.1x; pin it with SGLANG_HOSTSYNC_SLOTS=b,default"
    (v,) = stats.auto_verdicts(cell_rows, arm_slots, identity, traffic, servers)
    assert v["best_is_the_pick"] and v["within"]
    md = "\n".join(stats.auto_lines([v]))
    assert ("| c | 1 | slots:auto | b,default | yes | 1.100 (0.990) | slots:b (1.130) = the pick (A/A) | 0.957 (3) | NO "
            "| 0.043 (auto / its pick) |") in md
    assert stats.auto_verdicts(cell_rows, {**arm_slots, "slots:auto": "default"}, identity, traffic, servers) == []


@pytest.mark.parametrize("change, verdict", [
    (lambda i, t: t["c/slots:auto"]["sequential"].update(identical=False), False),
    (lambda i, t: t["c/slots:auto"].update(after_aborts={"identical": False, "evidence": True}), False),
    (lambda i, t: t["c/slots:auto"]["concurrent"].update(errors=["HTTP 500"]), False),
    (lambda i, t: t["c/slots:auto"].update(errors=["timeout"]), False),
    (lambda i, t: i.update({"c/slots:auto": {**i["c/slots:auto"], "identical": False}}), False),
    # NGRAM's trie not flushed: no evidence either way (the e2e's own verdicts skip such checks)
    (lambda i, t: t["c/slots:auto"].update(after_aborts={"identical": False, "evidence": False}),
     stats.NO_EVIDENCE),
    (lambda i, t: i.update({"c/slots:auto": {**i["c/slots:auto"], "identical": False, "evidence": False}}),
     stats.NO_EVIDENCE),
    (lambda i, t: (i.pop("c/slots:auto"), t.pop("c/slots:auto")), None),
])
def test_auto_is_identical_only_where_every_check_it_had_passed(change, verdict):
    rows = [load_row("c", 1, arm, r, [v], v) for arm, v in (("stock", 100), ("slots:auto", 110), ("slots:b", 105))
            for r in range(2)]
    same = {"identical": True, "first_mismatch": None, "logprobs_compared": True, "evidence": True}
    identity = {"c/slots:auto": dict(same), "c/slots:b": dict(same)}
    traffic = {"c/slots:auto": {"sequential": {"identical": True, "evidence": True},
                                "after_aborts": {"identical": True, "evidence": True},
                                "concurrent": {"errors": [], "completed": 40, "aborted": 8, "health": True}}}
    change(identity, traffic)
    (v,) = stats.auto_verdicts(stats.cells(rows), {"slots:auto": "auto", "slots:b": "b"}, identity, traffic)
    assert v["identical"] == verdict if verdict is not None else v["identical"] is None
    # only an arm identical to stock is a bar: auto, not identical, is measured against b alone
    assert v["best"] == ("slots:auto" if verdict is True else "slots:b")
    row = stats.auto_row(v)
    assert row.endswith("| yes | - |") == (verdict is True)  # no pair of the same code in this run
    assert {True: "| yes |", False: "| NO |", stats.NO_EVIDENCE: "| no evidence |", None: "| - |"}[verdict] in row


def test_the_same_code_gap_is_the_wider_of_none_against_stock_and_auto_against_its_pick():
    """How far apart two servers of the same code read in the run: beside the bar, its noise at that scale."""
    rows = [load_row("c", 1, arm, r, [v], v) for arm, v in (("stock", 100), ("slots:auto,-audit", 110),
                                                             ("slots:none,-audit", 88), ("slots:b,-audit", 104))
            for r in range(2)]
    same = {"identical": True, "first_mismatch": None, "logprobs_compared": True, "evidence": True}
    arms = ("slots:auto,-audit", "slots:none,-audit", "slots:b,-audit")
    identity = {f"c/{a}": same for a in arms}
    arm_slots = {"stock": None, "slots:auto,-audit": "auto,-audit", "slots:none,-audit": "none,-audit",
                 "slots:b,-audit": "b,-audit"}
    servers = {"c/slots:auto,-audit": {"status_block": [
        "x hostsync: sglang 0.5.23, SGLANG_HOSTSYNC_SLOTS='auto'", "  auto: C: 1.1x; pin it with SGLANG_HOSTSYNC_SLOTS=b"]}}
    (v,) = stats.auto_verdicts(stats.cells(rows), arm_slots, identity, {}, servers)
    assert v["aa_pair"] == "none / stock" and v["aa_gap"] == pytest.approx(0.12)  # wider than auto / b (110 / 104)
    assert stats.auto_row(v).endswith("| 0.120 (none / stock) |")
    rows = [r for r in rows if r["arm"] != "slots:none,-audit"]
    (v,) = stats.auto_verdicts(stats.cells(rows), arm_slots, identity, {}, servers)
    assert v["aa_pair"] == "auto / its pick" and v["aa_gap"] == pytest.approx(110 / 104 - 1)


def test_auto_verdicts_without_stock_or_slots_of_an_older_run():
    # an arm missing from arm_slots (an older e2e.json) counts as audited by its audit figures
    rows = [load_row("c", 1, arm, r, [v], v) for arm, v in (("stock", 100), ("slots:auto", 110), ("slots:x", 300),
                                                             ("slots:y", 120)) for r in range(2)]
    cell_rows = stats.cells(rows)
    for c in cell_rows:
        c["audit"] = {"syncs_per_step": 0.0} if c["arm"] == "slots:x" else None
    same = {"identical": True, "first_mismatch": None, "logprobs_compared": True}
    identity = {f"c/{a}": same for a in ("slots:auto", "slots:x", "slots:y")}
    (v,) = stats.auto_verdicts(cell_rows, {"slots:auto": "auto"}, identity, {})
    assert v["best"] == "slots:y" and v["over_best"] == pytest.approx(110 / 120)
    # no stock rows: no ratio, no bar, no verdict of speed
    (v,) = stats.auto_verdicts(stats.cells([r for r in rows if r["arm"] == "slots:auto"]), {"slots:auto": "auto"}, {}, {})
    assert v["best"] is None and v["ratio"] is None and v["lowest_round"] is None
    assert not v["never_below"] and not v["within"] and v["identical"] is None


def test_the_report_has_autos_table_from_the_runs_own_arm_slots_and_traffic(tmp_path):
    rows = [load_row("c", 1, arm, r, [v], v) for arm, v in (("stock", 100), ("slots:auto,-audit", 120)) for r in range(2)]
    result = {"meta": {"arms": ["stock", "slots:auto,-audit"], "arm_slots": {"stock": None, "slots:auto,-audit": "auto"},
                       "configs": ["c"], "command": "x", "date": "d", "concurrency": [1], "rounds": 2,
                       "max_new_tokens": 8},
              "rows": rows, "servers": {"c/slots:auto,-audit": {"ready_s": 1.0, "status_block": [
                  "  auto: C: 1.2x; pin it with SGLANG_HOSTSYNC_SLOTS=default,a"]}, "c/stock": {"ready_s": 1.0}},
              "identity": {"c/slots:auto,-audit": {"identical": True, "first_mismatch": None, "logprobs_compared": True}},
              "traffic": {"c/slots:auto,-audit": {"sequential": {"identical": False, "evidence": True, "same": 24,
                                                                 "compared": 25, "mismatches": [{"name": "x"}]}}}}
    md = run.report(result, str(tmp_path), {})
    assert "| c | 1 | slots:auto,-audit | default,a | NO | 1.200 (1.200) | - (-) | - (0) | NO |" in md


def test_a_server_is_its_arms_where_sglang_rewrote_the_model_path_it_was_launched_with(monkeypatch):
    # SGLang rewrites a model path it downloads (ModelScope, a Hub GGUF); its launch command keeps the original
    launch = matrix.Launch("c", "stock", 31000, ("python", "-m", "sglang.launch_server", "--model-path", "/m/t",
                                                 "--port", "31000"), {}, "/tmp/x.log", "")
    srv = type("S", (), {"launch": launch, "base": "http://127.0.0.1:31000"})()
    answers = {"model_path": "/cache/t-snapshot", "launch_command": "--model-path /m/t --port 31000"}
    monkeypatch.setattr(client, "server_info", lambda base: answers)
    assert run.not_its_own(srv) is None
    answers["launch_command"] = "--model-path /tmp/hostsync-t1set_b/run/e2e/models/t --port 31000"
    assert "another server answers on this port (model /cache/t-snapshot" in run.not_its_own(srv)
    answers.clear()  # a server that does not say (or an older SGLang): not judged
    assert run.not_its_own(srv) is None


def test_a_cells_scheduler_placement_is_the_median_wait_all_preemptions_and_every_cpu_seen():
    rows = [load_row("c", 1, "stock", r, [100], 100) for r in range(3)]
    rows += [{**load_row("c", 1, "slots:a", r, [100], 100),
              "cpu": {"scheduler_wait_share": w, "scheduler_preempted": n, "scheduler_cpus": cpus}}
             for r, (w, n, cpus) in enumerate([(0.01, 2, [3]), (0.3, 40, [3, 7]), (0.02, 1, [3])])]
    cells = {c["arm"]: c for c in stats.cells(rows)}
    a = cells["slots:a"]
    assert (a["scheduler_wait_share"], a["scheduler_preempted"], a["scheduler_cpus"]) == (0.02, 43, [3, 7])
    assert cells["stock"]["scheduler_wait_share"] is None and cells["stock"]["scheduler_cpus"] == []
    assert "- c c1 slots:a: 2.00%, 43 preemptions, CPUs 3, 7" in stats.markdown(list(cells.values()), {}, {}).splitlines()
    # with the other arms' schedulers' CPUs (rows since 2026-12-08): their median, printed after
    for r, others in zip(rows[3:], (3.9, 0.0, 4.1)):
        r["cpu"]["others_cpus"] = others
    a = {c["arm"]: c for c in stats.cells(rows)}["slots:a"]
    assert a["others_cpus"] == 3.9
    assert ("- c c1 slots:a: 2.00%, 43 preemptions, CPUs 3, 7; other arms' schedulers 3.90 CPUs"
            in stats.markdown([a], {}, {}).splitlines())


def test_a_schedulers_run_queue_wait_over_a_window_from_proc():
    """Two processes titled as SGLang titles its scheduler, in a session of their own, spin on one CPU: each
    waits for it about half the window. Nothing is read for a group without a scheduler, or whose schedulers
    changed between the samples."""
    from sglang_hostsync_plugin.e2e import procs

    if not os.path.isdir("/proc/self") or not hasattr(os, "sched_getaffinity"):
        pytest.skip("no /proc")
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nt = time.time()\nwhile time.time() - t < 60: pass"
    one = f'(exec -a sglang::scheduler_TP0 "{sys.executable}" -c "$0")'
    pair = subprocess.Popen(["bash", "-c", f"{one} & {one} & wait", spin], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        deadline = time.time() + 20
        while True:  # until both spinners run under that title, on that CPU
            before = procs.groups([pair.pid])[pair.pid]
            scheds = [p for p in before.values() if p.title.startswith(procs.SCHEDULER_TITLE)]
            if len(scheds) == 2 and all(p.cpu == cpu for p in scheds):
                break
            assert time.time() < deadline, before
            time.sleep(0.05)
        time.sleep(1.0)
        shared = procs.window(before, procs.groups([pair.pid])[pair.pid], 1.0)
        assert 0.2 < shared["scheduler_wait_share"] < 1.0 and shared["scheduler_cpus"] == [cpu], shared
        assert shared["scheduler_preempted"] > 0
        alone = procs.groups([other.pid])[other.pid]
        assert procs.window(alone, alone, 1.0) is None  # no scheduler
        assert procs.window({}, procs.groups([pair.pid])[pair.pid], 1.0) is None  # the schedulers changed
    finally:
        for p in (pair, other):
            os.killpg(p.pid, 9)
            p.wait()


def test_the_other_arms_schedulers_cpu_over_a_window_from_proc():
    """Beside the timed server, one other server's scheduler spins (SGLang's idle loop without --sleep-on-idle)
    and one sleeps: ``others_cpus`` reads about one CPU with the spinner among the other arms, about none
    without it."""
    from sglang_hostsync_plugin.e2e import procs

    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")

    def titled(code: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", "-c", f'exec -a sglang::scheduler_TP0 "{sys.executable}" -c "$0"', code],
                                start_new_session=True)

    timed, asleep = titled("import time; time.sleep(60)"), titled("import time; time.sleep(60)")
    spinning = titled("import time\nt = time.time()\nwhile time.time() - t < 60: pass")
    every = [timed.pid, asleep.pid, spinning.pid]
    try:
        deadline = time.time() + 20
        while not all(any(p.title.startswith(procs.SCHEDULER_TITLE) for p in g.values())
                      for g in procs.groups(every).values()):
            assert time.time() < deadline
            time.sleep(0.05)
        t0, before = time.perf_counter(), procs.groups(every)
        time.sleep(1.0)
        after, wall = procs.groups(every), time.perf_counter() - t0
        with_spinner = procs.arm_window(before, after, timed.pid, wall, wall)
        assert 0.3 < with_spinner["others_cpus"] < 1.2, with_spinner
        quiet = {g: before[g] for g in (timed.pid, asleep.pid)}
        assert procs.arm_window(quiet, {g: after[g] for g in quiet}, timed.pid, wall, wall)["others_cpus"] < 0.1
        assert procs.arm_window(before, after, asleep.pid, wall, wall)["others_cpus"] > 0.3  # seen from another
        assert procs.arm_window(before, after, spinning.pid, wall, wall)["others_cpus"] < 0.1  # never the timed one
        assert procs.others({}, after[spinning.pid], wall) is None  # not seen at both ends
    finally:
        for p in (timed, asleep, spinning):
            os.killpg(p.pid, 9)
            p.wait()
