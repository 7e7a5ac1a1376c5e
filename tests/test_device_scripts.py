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



def test_the_flashinfer_warm_up_knows_every_checkpoint_shape_a_call_names():
    """device_call.sh hands the attention warm-up E2E_ARGS's --checkpoint-shape (FI_WARM_SHAPE for GPU tests):
    every shape a call names is one the warm-up's --shape accepts (it reads it from the e2e's table)."""
    from sglang_hostsync_plugin.e2e import checkpoints

    with open(PENDING) as f:
        named = set(re.findall(r"(?:--checkpoint-shape|FI_WARM_SHAPE=|_SHAPE=)\s*([a-z0-9-]+)", f.read()))
    assert named and named <= set(checkpoints.CHECKPOINT_SHAPES), named
    warm = os.path.join(REPO, "scripts", "flashinfer_attention_warm.py")
    out = subprocess.run([sys.executable, warm, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--shape" in out.stdout, out.stderr[-1000:]
    for shape in named:
        assert checkpoints.checkpoint_models(shape)["target"]["num_attention_heads"] > 0
