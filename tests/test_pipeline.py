"""The startup pipeline of issue 14: one plan per launch (selection, verdicts and
strictness computed once, in the launcher, read by every process it spawns and
printed by the doctor), ``source_edit`` refused under another plugin's hook, the
``--config`` YAML switch and a plugin enabled after ``load_plugins()``."""

import json
import subprocess
import sys

import pytest

from helpers import LOAD_AND_STARTUP_CHECK, REPO, clean_env, out, run_process, run_python

# A launcher snippet's ``spawn(code, env)``: a new process running ``code``, as
# ``subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)`` starts one;
# forked from the tests' fork server (tests/forkserver.py) where the launcher is one of its children:
# nothing of the launcher's state but ``env`` reaches it either way.
SPAWN = """
def spawn(code, env):
    import os, subprocess, sys
    server = sys.modules.get("forkserver")
    if server is not None and server.SOCKET:
        return server.run([sys.executable, "-c", code], env=env, cwd=os.getcwd())
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
"""

# A third-party slot whose precheck records each process that computes its verdict.
COUNTING_DIST = {
    "counting_slots.py": '''
import os
from sglang_hostsync_plugin.hookspecs import hookimpl
from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

def precheck():
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return None

def wrap(original, *args, **kwargs):
    return original(*args, **kwargs)

@hookimpl
def hostsync_slots():
    return [Slot(name="counted", kind=SlotKind.OWNED, origin="test", summary="", default=False, precheck=precheck,
                 targets=(HookTarget("sglang.srt.speculative.spec_info.spec_scale_global_num_tokens",
                                     TargetKind.FUNCTION, hook=wrap),))]
''',
    "counting_slots-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: counting-slots\nVersion: 0.1\n",
    "counting_slots-0.1.dist-info/entry_points.txt": "[sglang_hostsync.slots]\ncounting = counting_slots\n",
}

# A scheduler-like child: load_plugins() and the startup gate's check, then its view.
CHILD = LOAD_AND_STARTUP_CHECK + """
import json, os
print("RESULT" + json.dumps({"err": err, "plan": json.loads(rt.plan.to_json()),
    "status": {n: [s.status.value, s.reason] for n, s in rt.state.statuses.items()}}))
"""

# The launcher (load_plugins(), then argument preparation with the flag), then two
# children spawned from it: one with its environment, one with a different slot list.
LAUNCH_AND_SPAWN = SPAWN + """
import json, os, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
prepare_server_args(["--model-path", "dummy", "--enable-hostsync-plugin"])
child = sys.argv[1]
same = spawn(child, dict(os.environ))
other = spawn(child, {**os.environ, "SGLANG_HOSTSYNC_SLOTS": "default"})
print("RESULT" + json.dumps({"exported": json.loads(os.environ["SGLANG_HOSTSYNC_PLAN"]),
    "same": same.stdout.split("RESULT", 1)[-1], "same_err": same.stderr[-3000:],
    "other": other.stdout.split("RESULT", 1)[-1], "pid": os.getpid()}))
"""


@pytest.fixture
def counting_path(tmp_path):
    for rel, text in COUNTING_DIST.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_one_plan_per_launch_read_by_every_spawned_process(counting_path):
    count = counting_path / "count.txt"
    proc = run_process(
        [sys.executable, "-c", LAUNCH_AND_SPAWN, CHILD], cwd=REPO, timeout=600,
        env={**clean_env(SGLANG_HOSTSYNC_SLOTS="default,counted", COUNT_FILE=str(count)),
             "PYTHONPATH": f"{counting_path}:{REPO}/tests"},
    )
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    same, other = json.loads(res["same"]), json.loads(res["other"])
    pids = count.read_text().split()
    # The launcher computed the verdicts; the child with its environment read them.
    assert pids[0] == str(res["pid"]) and len(pids) == 2, (pids, res["same_err"])
    assert same["err"] is None and same["plan"] == res["exported"], res["same_err"]
    assert res["exported"]["facts"]["speculative_algorithm"] is None  # resolved for these args (no speculation)
    assert same["status"]["counted"] == ["applied", ""]
    # A child whose slot list differs does not take the launcher's plan: it computes
    # its own (the second line), and the rank agreement compares the two.
    assert other["plan"]["spec"] == "default" and other["status"]["counted"] == ["skipped", "not selected"]
    # One vocabulary in the plan, the runtime statuses and the doctor.
    from sglang_hostsync_plugin.slot import Status

    words = {s.value for s in Status}
    assert {v["status"] for v in res["exported"]["verdicts"]} <= words
    assert {s for s, _ in same["status"].values()} <= words


def test_a_stale_or_foreign_plan_in_the_environment_is_ignored():
    from sglang_hostsync_plugin import plan as plans

    fresh = plans.resolve({})
    env = {plans.ENV_PLAN: fresh.to_json()}
    assert plans.inherited(env) == fresh
    assert plans.inherited({**env, "SGLANG_HOSTSYNC_SLOTS": "-event_ring"}) is None
    assert plans.inherited({plans.ENV_PLAN: "{not json"}) is None
    assert plans.inherited({plans.ENV_PLAN: json.dumps({"spec": "x"})}) is None


def test_the_doctor_prints_the_same_plan_the_launcher_computes():
    from sglang_hostsync_plugin import plan as plans

    launcher = json.loads(plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,audit"}).to_json())
    proc = run_process([sys.executable, "-m", "sglang_hostsync_plugin", "doctor", "--json"], cwd=REPO, timeout=300,
                       env=clean_env(SGLANG_HOSTSYNC_SLOTS="default,audit"))
    assert proc.returncode == 0, out(proc)
    doctor = json.loads(proc.stdout)
    assert [(r["name"], r["selected"], r["status"], r["reason"]) for r in doctor["slots"]] == [
        (v["name"], v["selected"], v["status"], v["reason"]) for v in launcher["verdicts"]]
    assert doctor["selected"] == [v["name"] for v in launcher["verdicts"] if v["selected"]]


# --- defect 5: source_edit never recompiles another plugin's wrapper -------------------

FOREIGN_AROUND = """
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []
def theirs(original, self, model_runner):
    CALLS.append(1)
    return original(self, model_runner)
HookRegistry.register("sglang.srt.model_executor.forward_batch_info.ForwardBatch.prepare_mlp_sync_batch",
                      theirs, HookType.AROUND)
"""
STATUS = """
import json
print("RESULT" + json.dumps({"err": err, "status": {n: [s.status.value, s.reason] for n, s in rt.state.statuses.items()}}))
"""


def test_source_edit_slot_is_refused_under_another_plugins_inner_hook():
    # Registered before load_plugins() runs ours: HookRegistry puts it inside our hook,
    # so our hook would be handed their wrapper as `original`.
    lenient = run_python(FOREIGN_AROUND + LOAD_AND_STARTUP_CHECK + STATUS, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1",
                         SGLANG_HOSTSYNC_STRICT="0")
    assert lenient.returncode == 0, out(lenient)
    res = json.loads(lenient.stdout.split("RESULT", 1)[1])
    state, reason = res["status"]["target_dp_meta"]
    assert state == "failed" and "another hook wraps" in reason and "prepare_mlp_sync_batch" in reason, reason
    assert res["status"]["eagle_fixed_shape_tail"][0] == "applied" and res["err"] is None
    strict = run_python(FOREIGN_AROUND + LOAD_AND_STARTUP_CHECK + STATUS, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1")
    err = json.loads(strict.stdout.split("RESULT", 1)[1])["err"]
    assert err.startswith("HostsyncStartupError") and "target_dp_meta" in err, out(strict)


def test_source_edit_slot_applies_under_an_outer_hook():
    # Registered after ours: their hook wraps ours, and ours still gets SGLang's function.
    proc = run_python("""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang_hostsync_plugin
    sglang_hostsync_plugin.register()
    """.replace("\n    ", "\n") + FOREIGN_AROUND + LOAD_AND_STARTUP_CHECK + STATUS, SGLANG_ENABLE_HOSTSYNC_PLUGIN="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["status"]["target_dp_meta"] == ["applied", ""] and res["err"] is None, res


# --- item 10: --config YAML, and a plugin enabled after load_plugins() -----------------

CONFIG_LAUNCH = """
import json, os, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
prepare_server_args(["--config", sys.argv[1]])
print("RESULT" + json.dumps({"enabled": os.environ.get("SGLANG_ENABLE_HOSTSYNC_PLUGIN"),
                             "plan": "SGLANG_HOSTSYNC_PLAN" in os.environ}))
"""


@pytest.mark.parametrize("value, enabled", [("true", "1"), ("false", None)])
def test_config_yaml_enables_the_plugin(tmp_path, value, enabled):
    cfg = tmp_path / "server.yaml"
    cfg.write_text(f"model-path: dummy\nenable-hostsync-plugin: {value}\n")
    proc = run_process([sys.executable, "-c", CONFIG_LAUNCH, str(cfg)], env=clean_env(), cwd=REPO, timeout=300)
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"enabled": enabled, "plan": enabled is not None}, out(proc)


LATE = """
import json, logging, os
logging.basicConfig(level=logging.INFO)
from sglang.srt.plugins import load_plugins
load_plugins()
os.environ["SGLANG_ENABLE_HOSTSYNC_PLUGIN"] = "1"   # after the plugins were loaded
os.environ["SGLANG_HOSTSYNC_SLOTS"] = os.environ.pop("LATE_SLOTS")
from sglang.srt.server_args import ServerArgs
from sglang.srt.entrypoints import engine
args = ServerArgs(model_path="dummy", device="cpu")
try:
    engine._set_envs_and_config(args)
    err = None
except Exception as exc:
    err = f"{type(exc).__name__}: {exc}"
print("RESULT" + json.dumps({"err": err, "plan": "SGLANG_HOSTSYNC_PLAN" in os.environ}))
"""


def test_enabling_after_load_plugins_is_checked_and_said():
    ok = run_python(LATE, LATE_SLOTS="default")
    assert ok.returncode == 0, out(ok)
    res = json.loads(ok.stdout.split("RESULT", 1)[1])
    assert res == {"err": None, "plan": True}, out(ok)
    assert "was set after load_plugins() ran in this process" in ok.stderr, out(ok)
    bad = run_python(LATE, LATE_SLOTS="default,nope")
    err = json.loads(bad.stdout.split("RESULT", 1)[1])["err"]
    assert err.startswith("HostsyncConfigError") and "'nope'" in err, out(bad)


# --- the launcher defers: nothing hooked at load_plugins(), the plan resolved with the args ---

# SGLang's embedded Engine: load_plugins() from engine.py, then ServerArgs(**kwargs) refuses
# the unknown keyword before anything launches. Then the arguments reach the plugin either
# through prepare_server_args (the CLI) or through the launcher gate (an Engine's args).
LAUNCHER = SPAWN + """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO)  # an Engine configures SGLang's logger before the gate runs
from sglang.srt.entrypoints import engine
try:
    engine.Engine(not_a_server_arg=1)
except TypeError:
    pass
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_hostsync_plugin import runtime
hooked = sorted(HookRegistry._hooks)
argv = ["--model-path", "dummy", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "dummy",
        "--speculative-eagle-topk", "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8",
        "--page-size", "16", "--attention-backend", "triton", "--device", "cpu"]
err = None
try:
    if sys.argv[1] == "cli":
        from sglang.srt.server_args import prepare_server_args
        engine._set_envs_and_config(prepare_server_args(argv))  # the launch passes this object to the gate
    else:
        from sglang.srt.server_args import ServerArgs
        kw = {a[2:].replace("-", "_"): b for a, b in zip(argv[::2], argv[1::2])}
        kw.update(speculative_eagle_topk=4, speculative_num_steps=3, speculative_num_draft_tokens=8, page_size=16)
        engine._set_envs_and_config(ServerArgs(**kw))
except Exception as exc:
    err = f"{type(exc).__name__}: {exc}"
# One process spawned per child snippet (argv[2:]), all at once, as SGLang starts its processes.
from concurrent.futures import ThreadPoolExecutor
codes = sys.argv[2:] if err is None else []
with ThreadPoolExecutor(max(1, len(codes))) as pool:
    outs = [(p.stdout, p.stderr) for p in pool.map(lambda code: spawn(code, dict(os.environ)), codes)]
print("RESULT" + json.dumps({"rt": runtime.current() is not None, "hooked": hooked, "err": err,
    "exported": json.loads(os.environ["SGLANG_HOSTSYNC_PLAN"]) if "SGLANG_HOSTSYNC_PLAN" in os.environ else None,
    "dspark_imported": "sglang.srt.speculative.dspark_components.dspark_worker_v2" in sys.modules,
    "child": outs[0][0].split("RESULT", 1)[-1] if outs else None, "child_err": outs[0][1][-3000:] if outs else None,
    "children": [[stdout.split("RESULT", 1)[-1], stderr[-3000:]] for stdout, stderr in outs]}))
"""


@pytest.mark.parametrize("route", ["cli", "engine_gate"])
def test_a_launcher_hooks_nothing_and_its_schedulers_read_its_plan(route):
    proc = run_process([sys.executable, "-c", LAUNCHER, route, CHILD],
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host"),
                       cwd=REPO, timeout=600)
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None, out(proc)
    # At load_plugins() only the CLI shim and the launcher gate: no slot target imported or hooked.
    assert not res["rt"] and res["hooked"] == ["sglang.srt.entrypoints.engine._set_envs_and_config",
                                               "sglang.srt.server_args.ServerArgs.add_cli_args",
                                               "sglang.srt.server_args.prepare_server_args"], res
    assert "was set after load_plugins()" not in proc.stderr, out(proc)
    # Resolved once: the CLI route's gate sees the object prepare_server_args returned.
    assert proc.stderr.count("hostsync: plan resolved in") == 1, out(proc)
    assert "the slots these server args reach" in proc.stderr, out(proc)
    verdicts = {v["name"]: v for v in res["exported"]["verdicts"]}
    assert verdicts["eagle_fixed_shape_tail"]["status"] == "would apply", verdicts["eagle_fixed_shape_tail"]
    assert verdicts["dspark_dp_meta"]["status"] == "skipped" and not res["dspark_imported"]  # inert: never imported
    # A process spawned from it (the scheduler) installs that plan: it applies the slots the plan lets apply.
    child = json.loads(res["child"])
    assert child["err"] is None and child["plan"] == res["exported"], res["child_err"]
    assert child["status"]["eagle_fixed_shape_tail"] == ["applied", ""], child["status"]
    assert child["status"]["isolation_snapshot"] == ["applied", ""], child["status"]
    assert child["status"]["dspark_dp_meta"][0] == "skipped", child["status"]


def test_a_launcher_started_from_another_launchs_environment_makes_its_own_plan():
    """A launcher whose environment holds a plan exported by another launch (a parent process that
    launched a server with other args, its env inherited) resolves its own, and its schedulers read that."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import ServingFacts

    env = clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="auto")
    other = ServingFacts(speculative_algorithm="STANDALONE", topk=1, page_size=16, attention_backends=("triton", "triton"))
    stale = plans.resolve(env, facts=other)
    assert "eagle_step_graph" in stale.selected and plans.inherited({**env, plans.ENV_PLAN: stale.to_json()}) == stale
    proc = run_process([sys.executable, "-c", LAUNCHER, "cli", CHILD], env={**env, plans.ENV_PLAN: stale.to_json()},
                       cwd=REPO, timeout=600)
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None, out(proc)
    assert res["exported"]["facts"]["topk"] == 4, res["exported"]["facts"]  # LAUNCHER's args, not the stale plan's
    assert "dropped the plan another launch exported" in proc.stderr, out(proc)
    assert proc.stderr.count("hostsync: plan resolved in") == 1, out(proc)
    assert res["exported"]["choice"].startswith("auto: EAGLE family, topk > 1"), res["exported"]["choice"]
    child = json.loads(res["child"])
    assert child["err"] is None and child["plan"] == res["exported"], res["child_err"]
    assert child["status"]["eagle_step_graph"][0] != "applied", child["status"]["eagle_step_graph"]


# SGLang's scheduler / detokenizer / DP controller process function, run for real with the
# launcher's plan in the environment; the first object it creates after load_plugins() is a probe
# that reports what this process registered and exits (the scheduler's through the plugin's gate).
PROCESS = """
import json, os, sys
role = os.environ["TEST_ROLE"]
from sglang.srt.server_args import ServerArgs
server_args = ServerArgs(model_path="dummy", device="cpu", speculative_algorithm="STANDALONE",  # LAUNCHER's args
                         speculative_draft_model_path="dummy", speculative_eagle_topk=4, speculative_num_steps=3,
                         speculative_num_draft_tokens=8, page_size=16, attention_backend="triton")

def report(*args, **kwargs):
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()
    print("RESULT" + json.dumps({"rt": rt is not None, "hooked": sorted(HookRegistry._hooks),
        "applied": sorted(rt.state.applied()) if rt else [], "reported": bool(rt and rt.reported),
        "engine_imported": "sglang.srt.entrypoints.engine" in sys.modules}), flush=True)
    os._exit(0)

class Probe:
    __init__ = report

if role == "scheduler":
    from sglang.srt.managers import scheduler

    class SchedulerProbe(scheduler.Scheduler):  # the hook targets resolve through it: the gate runs around it
        __init__ = report

    scheduler.Scheduler = SchedulerProbe
    scheduler.run_scheduler_process(server_args, None, 0, 0, 0, None, None)
elif role == "detokenizer":
    from sglang.srt.managers import detokenizer_manager
    detokenizer_manager.run_detokenizer_process(server_args, None, Probe)
else:
    from sglang.srt.managers import data_parallel_controller
    data_parallel_controller.DataParallelController = Probe
    data_parallel_controller.run_data_parallel_controller_process(server_args, None, None)
"""


ROLES = ("scheduler", "detokenizer", "dp_controller")
_launches: dict[bool, subprocess.CompletedProcess] = {}


def _process_of_a_launch(role, enabled):
    """What ``role``'s process registered, spawned by a launcher (with or without the plugin enabled)
    that starts one process of each role at once, as SGLang does; one launcher per ``enabled``."""
    if enabled not in _launches:
        env = clean_env(SGLANG_HOSTSYNC_SLOTS="default,eagle_host")
        if enabled:
            env["SGLANG_ENABLE_HOSTSYNC_PLUGIN"] = "1"
        # The role is set before anything else runs, as TEST_ROLE in the child's environment.
        children = [f"import os\nos.environ['TEST_ROLE'] = {r!r}\n" + PROCESS for r in ROLES]
        _launches[enabled] = run_process([sys.executable, "-c", LAUNCHER, "cli", *children], env=env, cwd=REPO,
                                         timeout=600)
    launcher = _launches[enabled]
    assert launcher.returncode == 0, out(launcher)
    res = json.loads(launcher.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and (res["exported"] is not None) == enabled, out(launcher)
    child, child_err = res["children"][ROLES.index(role)]
    return json.loads(child), child_err


@pytest.mark.parametrize("role", ["detokenizer", "dp_controller"])
@pytest.mark.parametrize("enabled", [True, False])
def test_the_detokenizer_and_the_dp_controller_register_nothing(role, enabled):
    child, err = _process_of_a_launch(role, enabled)
    # With the plan inherited or the plugin off: no hook, no slot target, not even the engine module.
    assert child == {"rt": False, "hooked": [], "applied": [], "reported": False, "engine_imported": False}, (child, err)


def test_a_scheduler_registers_its_slots_and_its_gate_only():
    child, err = _process_of_a_launch("scheduler", True)
    assert child["rt"] and child["reported"], (child, err)  # the gate ran its startup check around __init__
    assert {"eagle_fixed_shape_tail", "isolation_snapshot"} <= set(child["applied"]), child
    assert "sglang.srt.managers.scheduler.Scheduler.__init__" in child["hooked"], child
    assert not {"sglang.srt.entrypoints.engine._set_envs_and_config", "sglang.srt.server_args.ServerArgs.add_cli_args",
                "sglang.srt.server_args.prepare_server_args"} & set(child["hooked"]), child
    child, err = _process_of_a_launch("scheduler", False)
    assert child == {"rt": False, "hooked": [], "applied": [], "reported": False, "engine_imported": False}, (child, err)


def test_a_process_is_told_by_the_caller_of_load_plugins():
    from sglang_hostsync_plugin import runtime

    def stack(*frames):
        """Nested calls, outermost first: (file, function); the innermost returns its frame."""
        inner = "import sys\ndef f():\n    return sys._getframe()\n"
        scope = {}
        exec(compile(inner, frames[-1][0], "exec"), scope)
        fn = scope["f"]
        fn.__code__ = fn.__code__.replace(co_name=frames[-1][1])
        for path, name in reversed(frames[:-1]):
            scope = {"callee": fn}
            exec(compile("def f():\n    return callee()\n", path, "exec"), scope)
            scope["f"].__code__ = scope["f"].__code__.replace(co_name=name)
            fn = scope["f"]
        return fn()

    sgl = "/x/site-packages/sglang/srt/"
    load = (sgl + "plugins/__init__.py", "load_plugins")
    register = ("/x/sglang_hostsync_plugin/__init__.py", "register")
    detok = (sgl + "managers/detokenizer_manager.py", "run_detokenizer_process")
    dpc = (sgl + "managers/data_parallel_controller.py", "run_data_parallel_controller_process")
    sched = (sgl + "managers/scheduler.py", "run_scheduler_process")
    assert runtime.process_role(stack(detok, load, register)) == "detokenizer"
    assert runtime.process_role(stack(dpc, load, register)) == "dp_controller"
    assert runtime.process_role(stack(sched, load, register)) == "scheduler"
    # A scheduler forked from the DP controller keeps its frames above its own caller.
    assert runtime.process_role(stack(dpc, sched, load, register)) == "scheduler"
    assert runtime.process_role(stack(sched, dpc, load, register)) == "dp_controller"
    assert runtime.process_role(stack(detok, register)) is None  # not through load_plugins
    assert runtime.process_role(stack((sgl + "managers/other.py", "run_detokenizer_process"), load, register)) is None
    assert runtime.process_role() is None  # pytest's own stack


# Two embedded Engines in one process (topk 4 page 16; attention backends: argv[2]), each through the
# launcher's gate; after each: the exported plan and the switch flags on in the environment. argv[3]:
# an environment variable set between the two (NAME=VALUE).
TWO_ENGINES = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO)
from sglang.srt.plugins import load_plugins
if sys.argv[1] == "engine":
    from sglang.srt.entrypoints import engine
    try:  # SGLang's embedded-Engine launcher: load_plugins() from engine.py (the plan is deferred)
        engine.Engine(not_a_server_arg=1)
    except TypeError:
        pass
else:  # a process that loads the plugins itself, enabled: the plugin is active in it
    load_plugins()
    from sglang.srt.entrypoints import engine
from sglang.srt.server_args import ServerArgs
out = []
for i, backend in enumerate(sys.argv[2].split(",")):
    if i and len(sys.argv) > 3:
        os.environ.update([sys.argv[3].split("=", 1)])
    sa = ServerArgs(model_path="dummy", device="cpu", attention_backend=backend, speculative_algorithm="STANDALONE",
                    speculative_draft_model_path="dummy", speculative_eagle_topk=4, speculative_num_steps=3,
                    speculative_num_draft_tokens=8, page_size=16)
    err = None
    try:
        engine._set_envs_and_config(sa)
    except Exception as exc:  # SGLang's own check after the gate: no FlashInfer on a CPU box
        err = f"{type(exc).__name__}: {exc}"
    plan = json.loads(os.environ["SGLANG_HOSTSYNC_PLAN"]) if "SGLANG_HOSTSYNC_PLAN" in os.environ else None
    out.append({"err": err, "backends": plan and plan["facts"]["attention_backends"],
                "verdicts": plan and {v["name"]: v["status"] for v in plan["verdicts"]},
                "reasons": plan and {v["name"]: v["reason"] for v in plan["verdicts"]},
                "flags": sorted(k for k, v in os.environ.items() if k.startswith("SGLANG_OPT_FLASHINFER") and v == "1")})
print("RESULT" + json.dumps(out))
"""


def _two_engines(mode, backends="flashinfer,triton", *between, slots="default,flashinfer"):
    proc = run_process([sys.executable, "-c", TWO_ENGINES, mode, backends, *between], cwd=REPO,
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS=slots), timeout=600)
    assert proc.returncode == 0, out(proc)
    return (*json.loads(proc.stdout.split("RESULT", 1)[1]), proc)


def test_a_second_engine_with_other_args_gets_its_own_plan():
    first, second, proc = _two_engines("engine")
    assert "flashinfer" in first["err"] and second["err"] is None, out(proc)
    assert first["backends"] == ["flashinfer", "flashinfer"] and second["backends"] == ["triton", "triton"]
    assert first["verdicts"]["flashinfer_draft_host_indptr"] == "would apply"
    assert first["flags"] == ["SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR"]
    # The triton Engine's schedulers get a plan for triton, and the first Engine's switch flag is off.
    assert second["verdicts"]["flashinfer_draft_host_indptr"] == "skipped", second["verdicts"]
    assert second["verdicts"]["flashinfer_plan_guard"] == "skipped" and second["flags"] == [], second


def test_a_second_engine_with_the_same_args_keeps_the_plan_unless_the_environment_changed():
    first, second, proc = _two_engines("engine", "triton,triton")
    assert first["err"] is None and second == first, out(proc)
    assert proc.stderr.count("hostsync: plan resolved in") == 1, out(proc)
    assert proc.stderr.count("the same server facts and environment") == 1, out(proc)
    # SGLang's kill switch of the replay set between the two: the second Engine's plan says so.
    first, second, proc = _two_engines("engine", "triton,triton", "SGLANG_DIFFUSION_TRITON_FAST_LAUNCH=0",
                                       slots="default,spec_kernel_replay")
    assert proc.stderr.count("hostsync: plan resolved in") == 2 and "the same server facts" not in proc.stderr, out(proc)
    assert first["verdicts"] == second["verdicts"] and first["reasons"]["spec_kernel_replay"] == "", out(proc)
    assert "replay_launches off" in second["reasons"]["spec_kernel_replay"], second


def test_a_process_set_up_for_one_engine_refuses_another_with_other_args():
    first, second, proc = _two_engines("self")
    assert "flashinfer" in first["err"], out(proc)  # the gate passed; SGLang's own check stopped it
    assert second["err"].startswith("HostsyncStartupError") and "other server arguments" in second["err"], second
    assert "attention_backends: ['flashinfer', 'flashinfer'] -> ['triton', 'triton']" in second["err"], second


def test_a_runtime_set_up_for_one_args_object_refuses_other_args_naming_the_difference():
    from sglang.srt.server_args import ServerArgs

    from sglang_hostsync_plugin import plan as plans, runtime

    first = ServerArgs(model_path="dummy", device="cpu", page_size=1)
    rt = runtime.Runtime()
    rt.plan = plans.Plan(spec="none", strict=True, sglang=None, version_warning=None, verdicts=(), inputs="")
    runtime.apply_facts(rt, first)
    assert rt.plan.facts_applied and rt.plan.facts["topk"] == 1 and rt.args is first
    runtime.apply_facts(rt, first)  # the same launch again (argument preparation, then the gate)
    runtime.apply_facts(rt, ServerArgs(model_path="dummy", device="cpu", page_size=1))  # another Engine, the same args
    # A page size left to SGLang is unknown before its resolution: it may well be 1, so no refusal.
    runtime.apply_facts(rt, ServerArgs(model_path="dummy", device="cpu"))
    other = ServerArgs(model_path="dummy", device="cpu", page_size=16)
    with pytest.raises(plans.HostsyncStartupError, match="other server arguments \\(page_size: 1 -> 16\\)"):
        runtime.apply_facts(rt, other)


def test_a_plan_matches_args_it_left_unresolved():
    from sglang_hostsync_plugin.slot import ServingFacts

    made = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16, attention_backends=(None, None))
    assert ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                        attention_backends=("fa3", "fa3"), env={"X": "1"}).matches(made.record())
    assert made.matches(ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                                     attention_backends=("fa3", None)).record())
    assert not ServingFacts(speculative_algorithm="STANDALONE", topk=1, page_size=16).matches(made.record())
    resolved = ServingFacts(speculative_algorithm="NGRAM", attention_backends=("triton", "triton")).record()
    assert not ServingFacts(speculative_algorithm="NGRAM", attention_backends=("flashinfer", "triton")).matches(resolved)
    assert not ServingFacts(speculative_algorithm="NGRAM").matches({**resolved, "new_field": 1})


def test_a_launcher_with_bad_input_stops_when_the_args_come():
    proc = run_process([sys.executable, "-c", LAUNCHER, "cli", CHILD],
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,nope"),
                       cwd=REPO, timeout=600)
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"].startswith("HostsyncConfigError") and "'nope'" in res["err"], res
    assert res["exported"] is None and res["child"] is None


def test_the_launcher_is_told_by_sglangs_entry_point_files():
    from sglang_hostsync_plugin import runtime

    def frame_in(path):
        code = compile("import sys\nf = sys._getframe()", path, "exec")
        scope = {}
        exec(code, scope)
        return scope["f"]

    for path in ("/x/site-packages/sglang/launch_server.py", "/x/site-packages/sglang/cli/serve.py",
                 "/x/site-packages/sglang/srt/entrypoints/engine.py"):
        assert runtime.called_from_launcher(frame_in(path)), path
    for path in ("/x/site-packages/sglang/srt/managers/scheduler.py", "/x/my_launch_server.py", "<string>"):
        assert not runtime.called_from_launcher(frame_in(path)), path
    assert not runtime.called_from_launcher()  # pytest's own stack


def test_a_dependent_of_a_badly_configured_slot_is_refused_for_input_not_drift():
    from sglang_hostsync_plugin import config
    from sglang_hostsync_plugin.checks import CANNOT_APPLY
    from sglang_hostsync_plugin.plan import Verdict
    from sglang_hostsync_plugin.slot import Status

    bad = f"{config.BAD_CONFIGURATION}X='y': use a number"
    nested = f"requires slot 'b'{CANNOT_APPLY}requires slot 'a'{CANNOT_APPLY}{bad}"
    drift = f"requires slot 'a'{CANNOT_APPLY}source of sglang.x changed"
    assert Verdict("a", False, Status.FAILED, bad).input_caused
    assert Verdict("c", False, Status.FAILED, nested).input_caused and not Verdict("c", False, Status.FAILED, nested).bad_config
    assert not Verdict("c", False, Status.FAILED, drift).input_caused


def test_the_doctor_says_whether_sglangs_process_functions_still_call_load_plugins(monkeypatch, capsys):
    from sglang_hostsync_plugin import doctor, runtime

    assert runtime.process_roles_found() == {"scheduler": True, "detokenizer": True, "dp_controller": True}
    assert doctor.main(["doctor"]) == 0
    assert "process roles: scheduler found, detokenizer found, dp_controller found\n" in capsys.readouterr().out
    # An SGLang that moved one: reported, the slots unaffected (exit 0).
    monkeypatch.setattr(runtime, "PROCESS_CALLERS", {
        **runtime.PROCESS_CALLERS,
        ("sglang/srt/managers/detokenizer_manager.py", "run_detokenizer_process_v2"): "detokenizer"})
    monkeypatch.setitem(runtime.PROCESS_CALLERS, ("sglang/srt/managers/detokenizer_manager.py",
                                                   "run_detokenizer_process"), "old_detokenizer")
    roles = runtime.process_roles_found()
    assert roles["detokenizer"] is False and roles["old_detokenizer"] is True
    assert doctor.main(["doctor"]) == 0
    assert "detokenizer NOT FOUND" in capsys.readouterr().out


# A launcher whose user left the topk to SGLang: load_plugins() as SGLang's Engine entry point calls it,
# prepare_server_args (the plan, from unresolved args), SGLang's resolution, then the launcher gate
# around _set_envs_and_config, as Engine._launch_subprocesses runs them; then a scheduler child.
AUTO_TOPK_LAUNCH = SPAWN + """
import json, os, sys, tempfile
from sglang.srt.entrypoints import engine
try:
    engine.Engine(not_a_server_arg=1)
except TypeError:
    pass
from sglang_hostsync_plugin.e2e import matrix
models = matrix.write_models(tempfile.mkdtemp())
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(["--model-path", models["target"], "--load-format", "dummy", "--speculative-algorithm",
                            sys.argv[1], "--speculative-draft-model-path", models["draft"], "--page-size", "16",
                            "--attention-backend", "triton", "--skip-tokenizer-init", "--device", "cuda"])
def plan():
    p = json.loads(os.environ["SGLANG_HOSTSYNC_PLAN"])
    return [p["facts"]["topk"], {v["name"]: [v["status"], v["reason"]] for v in p["verdicts"]}["eagle_fixed_shape_tail"]]
before = plan()
args.resolve_once()
engine._set_envs_and_config(args)
child = spawn(sys.argv[2], dict(os.environ))
print("RESULT" + json.dumps({"before": before, "after": plan(), "child": child.stdout.split("RESULT", 1)[-1],
                             "child_err": child.stderr[-3000:]}))
"""


@pytest.mark.parametrize("algorithm, topk", [("EAGLE", 4), ("STANDALONE", 1)])
def test_the_launcher_refines_its_plan_once_sglang_resolved_the_args(algorithm, topk):
    """Without --speculative-eagle-topk SGLang picks it in its resolution, after prepare_server_args:
    4 for EAGLE on a Llama target, 1 for STANDALONE. The launcher's first plan holds it unknown and
    keeps the topk > 1 tail slot; the gate (args resolved, no scheduler spawned yet) refines it, and
    a scheduler reads the refined plan. Before 2026-12-05 the first plan read a missing topk as 1 and
    skipped the tail slot for EAGLE, whose server then ran topk 4 with stock's tail-copy syncs."""
    proc = run_process([sys.executable, "-c", AUTO_TOPK_LAUNCH, algorithm, CHILD], cwd=REPO, timeout=600,
                       env=clean_env(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", PYTHONPATH=f"{REPO}/tests"))
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["before"] == [None, ["would apply", ""]]
    assert res["after"][0] == topk
    child = json.loads(res["child"])
    assert child["err"] is None, res["child_err"]
    assert child["plan"]["facts"]["topk"] == topk
    if topk > 1:
        assert res["after"][1] == ["would apply", ""] and child["status"]["eagle_fixed_shape_tail"][0] == "applied"
    else:
        assert res["after"][1][0] == "skipped" and "--speculative-eagle-topk is 1" in res["after"][1][1]
        assert child["status"]["eagle_fixed_shape_tail"][0] == "skipped"


def test_a_value_sglang_overrides_in_its_resolution_resolves_the_plan_again(monkeypatch):
    """A fact the launcher's plan had as known and SGLang's resolution changed (not a refinement):
    the gate resolves the plan again for the resolved args instead of keeping the stale verdicts."""
    from sglang_hostsync_plugin import plan as plans, runtime
    from sglang_hostsync_plugin.slot import ServingFacts

    made = plans.resolve({}, facts=ServingFacts("EAGLE", topk=4, page_size=1, attention_backends=("triton", "triton")))
    monkeypatch.setattr(plans, "inherited", lambda env=None: made)
    resolved = ServingFacts("EAGLE", topk=4, page_size=64, attention_backends=("triton", "triton"))
    monkeypatch.setattr(runtime.ServingFacts, "from_server_args", classmethod(lambda cls, args, env: resolved))
    again = []
    monkeypatch.setattr(runtime, "validate", lambda args: again.append(args) or "resolved again")
    args = object()
    assert runtime.refine_exported(args) == "resolved again" and again == [args]
    # The same facts: nothing to do; facts that only fill unknowns: refined without resolving again.
    monkeypatch.setattr(runtime.ServingFacts, "from_server_args",
                        classmethod(lambda cls, a, env: ServingFacts("EAGLE", topk=4, page_size=1,
                                                                     attention_backends=("triton", "triton"))))
    assert runtime.refine_exported(args) is None and again == [args]
