import os
import socket
import subprocess
import sys
import threading
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_concurrently(calls):
    """Call each of ``calls`` (each starts and waits for its own child process) on a thread of its own,
    as many at a time as there are cores, and return their results in order. The children are fresh
    interpreters that share nothing, so only the wall time differs from running them one by one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda call: call(), calls))


def run_process(argv, *, env: dict, cwd: str = REPO, timeout: float | None = None,
                fresh: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)`` for
    ``[sys.executable, "-c" or "-m", ...]`` (or a script run by this interpreter): a new process with
    nothing of this one's state (no HookRegistry patch, no SGLang module), forked from the tests' fork
    server (tests/forkserver.py: third-party packages preloaded) where that is the same as a fresh
    interpreter, else a fresh interpreter. ``fresh``: always a fresh interpreter (a child that must
    start without torch & co. imported, e.g. one that blocks their import)."""
    if fresh:
        return subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    import forkserver

    return forkserver.run(argv, env=env, cwd=cwd, timeout=timeout)


def run_python(code: str, timeout: float = 300, pythonpath: str | None = None, fresh: bool = False,
               **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a new process (see run_process): HookRegistry patches are process-global."""
    e = clean_env(**env)
    # tests/ on the path: the child imports hostsync_drivers and the shared helpers.
    e["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, os.path.join(REPO, "tests"), e.get("PYTHONPATH")) if p)
    return run_process([sys.executable, "-c", textwrap.dedent(code)], env=e, cwd=REPO, timeout=timeout, fresh=fresh)


# load_plugins() and the startup gate's check, in a child; leaves ``rt`` and ``err``
# (None, or "Type: message").
LOAD_AND_STARTUP_CHECK = """
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang_hostsync_plugin import runtime
rt = runtime.current()
try:
    runtime.startup_check(rt)
    err = None
except Exception as exc:
    err = f"{type(exc).__name__}: {exc}"
"""


def out(proc: subprocess.CompletedProcess) -> str:
    return f"--- rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-6000:]}"


# The catalogue as SPEC.md lists it; tests compare the registry against these.
SWITCH_FLAGS = {
    "fused_accept_tail": "SGLANG_DSPARK_FUSED_ACCEPT_TAIL",
    "prepare_inputs_once": "SGLANG_OPT_DSV41_DSPARK_PREPARE_INPUTS_ONCE",
    "mid_fold": "SGLANG_OPT_DSV41_DSPARK_MID_FOLD",
    "defer_context_kv": "SGLANG_DSPARK_DEFER_CONTEXT_KV",
    "fill_fast_path": "SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH",
    "target_verify_metadata_glue": "SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE",
    "post_forward_graph": "SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH",
    "draft_prep_fork": "SGLANG_OPT_DSV41_DSPARK_DRAFT_PREP_FORK",
    "post_fold": "SGLANG_OPT_DSV41_DSPARK_POST_FOLD",
    "one_launch_commit_stage": "SGLANG_OPT_DSV41_DSPARK_ONE_LAUNCH_COMMIT_STAGE",
    "target_metadata_early": "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY",
    "skip_prefilled_inputs": "SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS",
    "skip_glued_replay_view": "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW",
    "sim_draw_ahead": "SGLANG_OPT_DSV41_DSPARK_SIM_DRAW_AHEAD",
    "blockwise_rejection": "SGLANG_OPT_DSV41_BLOCKWISE_REJECTION",
    "sampling_accept_graph": "SGLANG_OPT_DSV41_SAMPLING_ACCEPT_GRAPH",
    "mxfp4_finalized_shape": "SGLANG_OPT_MXFP4_DEFERRED_FINALIZED_SHAPE",
}
# SGLang 0.5.23's other opt-ins (slots/upstream_host_plans.py), outside dspark_mega.
HOST_PLAN_FLAGS = {
    "metadata_glue_graph": "SGLANG_ENABLE_METADATA_GLUE_GRAPH",
    "flashinfer_verify_host_plan": "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN",
    "flashinfer_draft_host_indptr": "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR",
}
# Rules read from SGLang 0.5.23 (see slots/upstream_switches.py for the functions).
SWITCH_REQUIRES = {
    "target_metadata_early": "target_verify_metadata_glue",
    "one_launch_commit_stage": "defer_context_kv",
}
BUILTINS = (
    "fused_compact_rebuild", "host_envelope_bound", "hybrid_needs_cpu_seq_lens",
    "draft_sampler_in_graph", "filter_batch_host_keep_list", "trtllm_mla_host_max",
)


def cuda_call(call, strict: bool = True):
    """``call()`` after the device is idle, under torch's sync-debug mode "error" when ``strict``:
    a synchronizing CUDA operation inside it raises."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error" if strict else "default")
    try:
        return call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def install_eagle_host_with_audit(slot: str) -> list[tuple[str, str]]:
    """Install `default,eagle_host,audit,audit_fine` for a STANDALONE topk 4 page 16 triton server
    with a recording register (no HookRegistry): (path, hook qualname) in install order. Asserts
    that ``slot`` would apply and that no slot failed."""
    from sglang_hostsync_plugin import installer, plan as plans, registry
    from sglang_hostsync_plugin.slot import ServingFacts, Status

    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                         attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host,audit,audit_fine"}, facts=facts)
    assert plan.verdict(slot).status is Status.WOULD_APPLY
    assert not [v for v in plan.verdicts if v.status is Status.FAILED]
    order = []
    installer.install(installer.InstallState(), plan, registry.catalogue(),
                      lambda path, hook, kind: order.append((path, hook.__qualname__)))
    return order


class BlockingBuild:
    """Stands in for ``csrc.load`` (or ``csrc._build``): blocks until released (a build still running),
    then loads or fails; a 60 s timer releases it so a blocked test fails, never hangs."""

    def __init__(self, fail: bool = False):
        self.released = threading.Event()
        self.by_timer = threading.Event()
        self.fail = fail
        self.threads: list[str] = []
        self.timer = threading.Timer(60, lambda: (self.by_timer.set(), self.released.set()))
        self.timer.start()

    def __call__(self, name, verbose=False):
        self.threads.append(threading.current_thread().name)
        self.released.wait()
        if self.fail:
            raise RuntimeError("nvcc error: stand-in")
        return object()


# Fake servers listen below Linux's ephemeral port range (32768-60999 by default): a port there can be
# held by any outgoing connection of this box (pip, the e2e client, gloo), which made "Address already in
# use" flakes in CI. Each base is checked by binding its ports first.
PORT_LO, PORT_HI = 20000, 32000


def free_port_base(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that are free now (a per-process start,
    so parallel runs spread out)."""
    span = PORT_HI - PORT_LO - count
    start = (os.getpid() * 7919) % span
    for step in range(0, span, 97):
        base = PORT_LO + (start + step) % span
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports in {PORT_LO}-{PORT_HI}")


def write_slot_dist(root, module: str, dist: str) -> str:
    """A package under ``root`` that registers ``sglang_hostsync_plugin.slots.<module>.SLOT`` through the
    third-party slot entry-point group (``registry.SLOT_ENTRY_POINT_GROUP``): a slot not yet in the
    catalogue, for a test's subprocesses and servers. Put ``root`` on ``PYTHONPATH``; returns it."""
    files = {
        f"{dist}.py": ("from sglang_hostsync_plugin.hookspecs import hookimpl\n"
                       f"from sglang_hostsync_plugin.slots.{module} import SLOT\n\n\n"
                       "@hookimpl\n"
                       "def hostsync_slots():\n"
                       "    return [SLOT]\n"),
        f"{dist}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 0.1\n",
        f"{dist}-0.1.dist-info/entry_points.txt": f"[sglang_hostsync.slots]\n{module} = {dist}\n",
    }
    for rel, text in files.items():
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


def e2e_with_slot(tmp_dir, reuse_var: str, name: str, module: str | None, dist: str | None, e2e_args: list[str],
                  timeout: float) -> dict:
    """The e2e benchmark's ``e2e.json`` for a slot's GPU test: run with ``e2e_args`` under ``$OUT/<name>``
    (a slot not yet in the catalogue, ``module``, reaches its servers through ``write_slot_dist`` on
    ``PYTHONPATH``; None: a catalogue slot), or read the directory ``$<reuse_var>`` names (a run made by
    the same command).
    A run past ``timeout`` gets SIGTERM (the e2e then stops its servers, which run in sessions of
    their own, and reports the rounds that finished; SIGKILL after 60 s more) and the ``e2e.json`` it
    wrote is read; where it wrote none, an AssertionError names the timeout."""
    import json
    import time

    stop_grace_s = 60  # the e2e's servers stop at once (SIGTERM, 30 s, SIGKILL), then it reports
    path = os.environ.get(reuse_var)
    timed_out, started = False, 0.0
    if not path:
        path = os.path.join(os.environ.get("OUT", "/tmp"), name)
        root = write_slot_dist(tmp_dir, module, dist) if module else None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        started = time.time()
        with subprocess.Popen([sys.executable, "-m", "sglang_hostsync_plugin.e2e", *e2e_args, "--out", path],
                              env=env) as proc:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.terminate()
                try:
                    proc.wait(timeout=stop_grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
            except BaseException:  # (as subprocess.run: the child does not outlive the caller)
                proc.kill()
                raise
    report = os.path.join(path, "e2e.json")
    if timed_out and not (os.path.exists(report) and os.path.getmtime(report) >= started - 1):
        raise AssertionError(f"the e2e run for {name} passed its {timeout:g} s timeout (subprocess.TimeoutExpired) "
                             f"and left no e2e.json of its own in {path}")
    if timed_out:
        print(f"{name}: the e2e passed its {timeout:g} s timeout; reading the e2e.json it left in {path}")
    with open(report) as f:
        return json.load(f)


def audited_pairs(e2e: dict, config: str, base_spec: str, spec: str, min_steps: int = 50):
    """Per concurrency (1 and 8), the audit of ``base_spec``'s and ``spec``'s audited arms in ``config``, printed
    (syncs per step, run-ahead, the second's sync sites); both must exist and have timed ``min_steps``."""
    cells = {(c["arm"], c["concurrency"]): c["audit"] for c in e2e["cells"] if c["config"] == config and c["audit"]}
    for conc in (1, 8):
        base, mine = cells.get((f"slots:{base_spec}", conc)), cells.get((f"slots:{spec}", conc))
        assert base and mine, sorted(cells)
        print(f"{config} c{conc}: syncs/step {base['syncs_per_step']:.3f} -> {mine['syncs_per_step']:.3f}, run-ahead "
              f"{base.get('run_ahead_fraction')} -> {mine.get('run_ahead_fraction')}; the slot's sites: "
              f"{mine['sync_sites']}")
        assert base["steps"] > min_steps and mine["steps"] > min_steps
        yield conc, base, mine


def assert_started_and_applied(e2e: dict, server: str, slot: str) -> None:
    """Every server of the run got ready, and ``slot`` reads applied in ``server``'s status block."""
    failed = {k: s.get("error") for k, s in e2e["servers"].items() if s.get("ready_s") is None}
    assert not failed, failed
    line = next(x for x in e2e["servers"][server]["status_block"] if x.split()[:1] == [slot])
    assert line.split()[1] == "applied", line
