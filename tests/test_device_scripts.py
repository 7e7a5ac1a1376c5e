"""The device calls' e2e arguments parse (``DRY_RUN=1``: the e2e's launch plan, nothing started) and
every server's plan, resolved for its own arguments as the launcher resolves it, refuses nothing, so a
typo or a pair its server makes unsafe costs no device time."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from sglang_hostsync_plugin import config, doctor, plan as plans
from sglang_hostsync_plugin.slot import Status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENDING = os.path.join(REPO, "scripts", "device_pending.sh")


def calls() -> list[str]:
    with open(PENDING) as f:
        return re.findall(r"^  ([0-9][0-9a-z]*)\)", f.read(), flags=re.M)


def test_the_script_lists_its_calls():
    assert {"1", "2", "8c", "8d", "10", "10s", "11c"} <= set(calls())


@pytest.mark.parametrize("call", calls())
def test_each_calls_e2e_arguments_parse(call):
    env = dict(os.environ, DRY_RUN="1", CALL=call,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run(["bash", PENDING], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (call, out.stdout[-2000:], out.stderr[-2000:])
    with open(PENDING) as f:
        body = f.read().split(f"\n  {call})", 1)[1].split(";;", 1)[0]
    if "E2E_ARGS=" in body:
        assert out.stdout.startswith("matrix: "), (call, out.stdout[:500])
    servers = [shlex.split(line) for line in out.stdout.splitlines() if "sglang.launch_server" in line]
    logs = [line.split("log: ", 1)[1] for line in out.stdout.splitlines() if line.startswith("  log: ")]
    assert len(logs) == len(servers), call
    # its first-start copy is the longest name an arm's files take (CALL=7b's log once could not be opened)
    assert all(len(os.path.basename(p[:-len(".log")] + ".first-start.log").encode()) <= 255 for p in logs), call
    plugin = [w for w in servers if any(x.startswith(config.ENV_SLOTS + "=") for x in w)]
    assert bool(plugin) == ("--slots" in body or "--arms stock,audit" in body), (call, len(servers))
    for words in plugin:
        env = dict(w.split("=", 1) for w in words[:words.index("-m")] if re.match(r"^[A-Z_]+=", w))
        args, _ = doctor._parser().parse_known_args(["doctor", *words[words.index("sglang.launch_server") + 1:]])
        plan = plans.resolve(env, facts=doctor.facts_of(args))  # raises on an unknown name or a declared conflict
        refused = plan.config_errors() + [v.name for v in plan.verdicts if v.selected and v.status is Status.FAILED]
        assert not refused, (call, env[config.ENV_SLOTS], refused)


@pytest.mark.parametrize("call", calls())
def test_each_call_fits_the_device_tools_limit(call):
    """The inner timeouts (the e2e's plus device_call.sh's 45 s margin, the GPU tests', step_graph_weights')
    add up to under the 590 s a call is given, so the archive is written before the tool's limit."""
    with open(PENDING) as f:
        body = f.read().split(f"\n  {call})", 1)[1].split(";;", 1)[0]
    limits = {k: int(v) for k, v in re.findall(r"\b(E2E_TIMEOUT|TESTS_TIMEOUT|SGW_TIMEOUT)=(\d+)", body)}
    e2e = limits.get("E2E_TIMEOUT", 480) + 45 if "E2E_ARGS=" in body else 0
    total = e2e + limits.get("TESTS_TIMEOUT", 150 if "GPU_TESTS=" in body else 0) + limits.get("SGW_TIMEOUT", 0)
    assert total <= 590, (call, total, limits)


def _warm_choice(e2e_args: str = "", gpu_tests: str = "", shape: str | None = None) -> tuple[str, str]:
    """device_call.sh's warm-shape block run alone: (WARM_SHAPE, WARM_ARGS)."""
    with open(os.path.join(REPO, "scripts", "device_call.sh")) as f:
        block = f.read().split("# warm-shape begin", 1)[1].split("# warm-shape end", 1)[0]
    env = {"PATH": os.environ["PATH"], "E2E_ARGS": e2e_args, "GPU_TESTS": gpu_tests}
    if shape is not None:
        env["FI_WARM_SHAPE"] = shape
    out = subprocess.run(["bash", "-c", "set -u\n" + block.split("\n", 1)[1] + '\necho "$WARM_SHAPE|$WARM_ARGS"'],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return tuple(out.stdout.strip().split("|"))


def test_the_flashinfer_warm_up_runs_where_flashinfer_serves_for_the_calls_checkpoint_shape():
    fi = "--configs standalone-t4-p16,standalone-t1-p16 --attention-backend flashinfer"
    assert _warm_choice("--configs ngram-p1,eagle3-t1-p16 --arms stock") == ("none", "")
    assert _warm_choice(fi) == ("small", "")
    assert _warm_choice(fi + " --checkpoint-shape llama-8b-bigram --rounds 6") == ("llama-8b-bigram", "")
    assert _warm_choice(fi + " --checkpoint-shape=llama-1b") == ("llama-1b", "")
    ngram = ("small", "--speculative-algorithm NGRAM")
    assert _warm_choice("--configs ngram-p1 --attention-backend flashinfer") == ngram
    assert _warm_choice("--configs ngram-p1,standalone-t4-p16 --attention-backend flashinfer") == ("small", "")
    assert _warm_choice(gpu_tests="tests/test_gpu_flashinfer_x.py", shape="llama-1b") == ("llama-1b", "")
    assert _warm_choice(fi, shape="none") == ("none", "")


def test_the_flashinfer_warm_up_knows_every_checkpoint_shape_a_call_names():
    """Every shape a call hands the warm-up (E2E_ARGS's --checkpoint-shape, FI_WARM_SHAPE) is in the e2e's table,
    which the warm-up reads."""
    from sglang_hostsync_plugin.e2e import checkpoints

    with open(PENDING) as f:
        named = set(re.findall(r"(?:--checkpoint-shape|FI_WARM_SHAPE=|_SHAPE=)\s*([a-z0-9-]+)", f.read()))
    assert named and named <= set(checkpoints.CHECKPOINT_SHAPES), named


def _fake_flashinfer(monkeypatch):
    """FlashInfer's module-name functions (not installed here): a name from the getter's own arguments."""
    import types

    mods = {n: types.ModuleType(n) for n in ("flashinfer", "flashinfer.jit", "flashinfer.jit.attention",
                                             "flashinfer.jit.attention.modules", "flashinfer.utils")}
    names = mods["flashinfer.jit.attention.modules"]
    names.get_batch_prefill_uri = lambda backend, *a: f"prefill_{backend}_d{a[4]}"
    names._get_batch_prefill_module_uri = lambda base, backend, stride, kind: f"{base}_{stride}"
    names.get_batch_decode_uri = lambda *a: f"decode_d{a[4]}"
    utils = mods["flashinfer.utils"]
    utils.version_at_least = lambda v, at: True
    utils.is_fa3_backend_supported = lambda *a: True
    utils.is_fa3_prefill_head_dim_supported = lambda qk, vo: qk in (64, 128, 256)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


def _planned(monkeypatch, *argv):
    import importlib.util

    _fake_flashinfer(monkeypatch)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("warm", os.path.join(REPO, "scripts", "flashinfer_attention_warm.py"))
    warm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm)
    return {m["name"]: m for m in warm.plan_modules(warm.build_parser().parse_args(list(argv)))}


def test_the_warm_up_plans_the_modules_sglangs_flashinfer_backend_builds(monkeypatch):
    small = _planned(monkeypatch, "--shape", "small")  # 16 / 8 heads: the draft decodes on CUDA cores
    assert set(small) == {"quantization", "prefill_fa2_d128_equal", "prefill_fa3_d128", "cascade", "decode_d128"}
    assert any("target verify" in u for u in small["prefill_fa2_d128_equal"]["uses"])
    ngram = _planned(monkeypatch, "--shape", "small", "--draft-key", "none", "--speculative-algorithm", "NGRAM")
    assert set(ngram) == {"quantization", "prefill_fa2_d128_equal", "prefill_fa3_d128", "cascade"}
    one_step = _planned(monkeypatch, "--shape", "small", "--num-steps", "1")  # no multi-step draft decode
    assert "decode_d128" not in one_step
    # 32 / 8 heads (GQA 4): decode runs on tensor cores, through the fa2 prefill module
    assert "decode_d128" not in _planned(monkeypatch, "--shape", "llama-8b-bigram")
    assert "prefill_fa3_d64" in _planned(monkeypatch, "--shape", "llama-1b")  # head_dim 64
