"""mamba_verdict_once on the CPU: for dense and hybrid HF configs the hook answers what SGLang's
``commit_mamba_states_after_verify`` answers (None at once without mamba-style state, SGLang's
function with the same arguments with it), asks SGLang's ``mambaish_config`` once per config
object, and keeps configs apart; its target, pins and inert rules; and, through SGLang's
HookRegistry in a fresh interpreter, the names the EAGLE v2 and NGRAM verify call reach it."""

import json
from functools import cached_property
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import mamba_verdict_once as mvo


class ModelConfig:
    """What ``mambaish_config`` reads of SGLang's ModelConfig (the registry part cached as there)."""

    def __init__(self, hf_config, is_draft_model=False):
        self.hf_config, self.is_draft_model = hf_config, is_draft_model

    @cached_property
    def linear_attn_registry_result(self):
        from sglang.srt.configs.linear_attn_model_registry import get_linear_attn_config

        return get_linear_attn_config(self.hf_config)


def _configs():
    from sglang.srt.configs import FalconH1Config, Mamba2Config, NemotronHConfig, Qwen3NextConfig

    return {
        "llama": (ModelConfig(LlamaConfig(num_hidden_layers=2)), False),
        "qwen3_next": (ModelConfig(Qwen3NextConfig()), True),
        "mamba2": (ModelConfig(Mamba2Config()), True),
        "falcon_h1": (ModelConfig(FalconH1Config()), True),
        "nemotron_h": (ModelConfig(NemotronHConfig()), True),
        # An MTP draft without mamba layers: SGLang says no mamba state.
        "nemotron_h_mtp_draft": (ModelConfig(NemotronHConfig(mtp_hybrid_override_pattern="*E"), is_draft_model=True), False),
    }


def _worker(model_config):
    return SimpleNamespace(model_runner=SimpleNamespace(model_config=model_config))


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(mvo, "_verdicts", mvo.Verdicts())
    asked = []
    real = mvo.spec_utils.mambaish_config
    monkeypatch.setattr(mvo.spec_utils, "mambaish_config", lambda mc: asked.append(mc) or real(mc))
    return asked


def test_verdict_is_sglangs_for_dense_and_hybrid_configs(fresh):
    from sglang.srt.configs.hybrid_arch import mambaish_config

    for name, (mc, hybrid) in _configs().items():
        assert (mambaish_config(mc) is not None) is hybrid, name  # the cases are what they claim
        assert mvo.keeps_mamba_state(mc) is hybrid, name


def test_dense_target_returns_none_without_sglangs_function_and_asks_once(fresh):
    from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify

    mc, _ = _configs()["llama"]
    worker, batch = _worker(mc), object()
    calls = []
    for _ in range(5):
        assert mvo.commit_hook(lambda *a, **k: calls.append((a, k)), worker, batch, "lens", "index", 4) is None
    assert calls == [] and fresh == [mc] and mvo._verdicts.skipped == 5
    # SGLang's own function answers the same for this worker (it returns at its first statement).
    assert commit_mamba_states_after_verify(worker, batch, "lens", "index", 4) is None


def test_hybrid_target_calls_sglangs_function_every_step_with_the_same_arguments(fresh):
    mc, _ = _configs()["qwen3_next"]
    worker = _worker(mc)
    calls = []
    original = lambda *a, **k: calls.append((a, k)) or "committed"  # noqa: E731
    for step in range(3):
        assert mvo.commit_hook(original, worker, "batch", step, "index", 4, prepared_step_indices=("p", None)) == "committed"
    assert mvo.commit_hook(original, target_worker=worker, batch="b", accept_lens=1, accept_index=2,
                           draft_token_num=4) == "committed"
    assert calls == [((worker, "batch", s, "index", 4), {"prepared_step_indices": ("p", None)}) for s in range(3)] + [
        ((), {"target_worker": worker, "batch": "b", "accept_lens": 1, "accept_index": 2, "draft_token_num": 4})]
    assert fresh == [mc] and mvo._verdicts.skipped == 0


def test_configs_keep_their_own_verdicts(fresh):
    cases = _configs()
    order = ["llama", "mamba2", "llama", "nemotron_h_mtp_draft", "mamba2", "nemotron_h", "llama"]
    for name in order:
        mc, hybrid = cases[name]
        assert mvo.keeps_mamba_state(mc) is hybrid, name
    assert len(fresh) == len(set(order))  # one question per config object


def test_a_new_config_at_a_reused_id_is_asked_again(fresh):
    dense, _ = _configs()["llama"]
    hybrid, _ = _configs()["mamba2"]
    mvo._verdicts.by_config[id(hybrid)] = (dense, False)  # as if id(hybrid) had held another config
    assert mvo.keeps_mamba_state(hybrid) is True and fresh == [hybrid]


def test_target_pins_and_preset():
    assert check_slot(mvo.SLOT) is None
    (target,) = mvo.SLOT.targets
    assert target.path == "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify"
    assert target.hook is mvo.commit_hook and not target.observer
    assert not mvo.SLOT.default and "eagle_host" in mvo.SLOT.presets


def test_a_changed_mambaish_config_refuses_the_slot(monkeypatch):
    monkeypatch.setattr(mvo, "PINS", (("sglang.srt.configs.hybrid_arch", "mambaish_config", "0" * 16),))
    assert "upstream shape changed" in check_slot(mvo.SLOT)


def test_inert_rules():
    for algo in ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM"):
        assert mvo.SLOT.inert(ServingFacts(algo, topk=1)) is None
    assert "DFLASH" in mvo.SLOT.inert(ServingFacts("DFLASH"))
    assert "unset" in mvo.SLOT.inert(ServingFacts())


def test_installs_beside_the_audits_observer():
    from helpers import install_eagle_host_with_audit

    paths = [path for path, _ in install_eagle_host_with_audit(mvo.NAME)]
    assert paths.count(mvo.TARGET) == 1


def test_installed_where_the_verify_callers_look_it_up():
    """Through the real HookRegistry: the name run_eagle_verify binds and spec_utils' own reach the
    hook; a dense target's commit answers None and asks SGLang's config walk once."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json
from types import SimpleNamespace
from transformers import LlamaConfig
from sglang.srt.configs import hybrid_arch
from sglang.srt.speculative import eagle_worker_common, spec_utils
from sglang_hostsync_plugin.slots import mamba_verdict_once as mvo
class MC:
    is_draft_model = False
    linear_attn_registry_result = None
    hf_config = LlamaConfig(num_hidden_layers=2)
worker = SimpleNamespace(model_runner=SimpleNamespace(model_config=MC()))
# The NGRAM worker binds the name the same way (it needs sgl_kernel to import, so not here); the
# pipeline mixin imports it from spec_utils at call time.
results = [eagle_worker_common.commit_mamba_states_after_verify(worker, None, None, None, 4),
           spec_utils.commit_mamba_states_after_verify(worker, None, None, None, 4)]
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["mamba_verdict_once"].status.value,
      "results": results, "skipped": mvo._verdicts.skipped, "configs": len(mvo._verdicts.by_config),
      "same_name": eagle_worker_common.commit_mamba_states_after_verify is spec_utils.commit_mamba_states_after_verify}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["results"] == [None, None] and res["skipped"] == 2 and res["configs"] == 1, res
    assert res["same_name"], res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout


def test_the_ngram_worker_binds_the_name_the_registry_rebinds():
    """NGRAMWorker imports sgl_kernel, so it is read here, not imported: it takes the commit by name
    from spec_utils (a module global, which SGLang's hook registry rebinds) and calls it per verify."""
    import ast
    import importlib.util

    path = importlib.util.find_spec("sglang.srt.speculative.ngram_worker").origin
    tree = ast.parse(open(path).read())
    imported = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "sglang.srt.speculative.spec_utils" for a in node.names]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "commit_mamba_states_after_verify"]
    assert "commit_mamba_states_after_verify" in imported and len(calls) == 1
    assert isinstance(calls[0].args[0], ast.Attribute) and calls[0].args[0].attr == "target_worker"
