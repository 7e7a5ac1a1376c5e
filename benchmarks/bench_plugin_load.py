"""What loading the plugin costs a process before it serves: the launcher and a scheduler,
stock vs enabled, in fresh interpreters (no GPU work; SGLang 0.5.23).

Each sample is one new ``python`` that does what the process does first:

- launcher: ``import sglang.launch_server`` (its module imports), ``load_plugins()`` as SGLang's
  launcher entry points call it (here through ``Engine``, which imports the engine module first),
  ``prepare_server_args`` of a STANDALONE topk 4 page 16 server (where the plugin resolves its
  plan for those arguments), then the imports ``launch_server`` reaches next
  (``sglang.srt.entrypoints.http_server``);
- scheduler: SGLang's ``run_scheduler_process`` with the launcher's plan in the environment (as a
  spawned scheduler inherits it), up to ``Scheduler.__init__`` (a probe subclass that reports
  and exits; the plugin's gate, where enabled, runs around it: its startup check is included);
- detokenizer: SGLang's ``run_detokenizer_process`` with the launcher's plan in the environment,
  up to the manager it creates after ``load_plugins()`` (a probe that reports and exits).

Arms: "no plugin" (SGLang's ``SGLANG_PLUGINS`` whitelist leaves it out: as if not installed),
"disabled" (installed, not enabled: the e2e's stock servers) and each ``--slots`` value,
interleaved, ``--repeats`` times. Printed: the median seconds per stage and in total (the
interpreter's start included), the peak resident memory, and each arm's total minus "no plugin":
the plugin's cost per process start.

    python benchmarks/bench_plugin_load.py --slots default --slots default,eagle_host --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LAUNCHER = r"""
import json, os, resource, sys, time
ARGV = json.loads(sys.argv[1])
t0 = time.perf_counter()
import sglang.launch_server
t1 = time.perf_counter()
from sglang.srt.entrypoints import engine
try:  # SGLang's embedded-Engine launcher: load_plugins() from engine.py, then ServerArgs refuses the keyword
    engine.Engine(not_a_server_arg=1)
except TypeError:
    pass
t2 = time.perf_counter()
from sglang.srt.server_args import prepare_server_args
prepare_server_args(ARGV)
t3 = time.perf_counter()
try:
    import sglang.srt.entrypoints.http_server
    err = None
except Exception as exc:  # a CPU-only venv lacks some of the server's packages
    err = f"{type(exc).__name__}: {exc}"
t4 = time.perf_counter()
out = {"import launch_server": t1 - t0, "load_plugins": t2 - t1, "prepare_server_args": t3 - t2,
       "import http_server": t4 - t3, "modules": len(sys.modules), "http_server_error": err,
       "plan": os.environ.get("SGLANG_HOSTSYNC_PLAN"), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if os.environ.get("SGLANG_ENABLE_HOSTSYNC_PLUGIN") == "1":
    from sglang_hostsync_plugin import runtime
    rt = runtime.current()  # None where the launcher deferred the plan to the server args
    out["setup_s"] = rt.setup_s if rt is not None else runtime.plan_resolved_s
print("RESULT " + json.dumps(out), flush=True)
"""

# The server arguments the launcher samples prepare (the e2e's STANDALONE topk 4 page 16).
ARGV = ["--model-path", "dummy", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "dummy",
        "--speculative-eagle-topk", "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8",
        "--page-size", "16", "--attention-backend", "triton"]

# The scheduler and detokenizer samples run SGLang's own process function (load_plugins() is
# called by it, as in a server) up to the object it creates next: a probe that reports and exits.
SCHEDULER = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
from sglang.srt.managers import scheduler
from sglang.srt.server_args import prepare_server_args
server_args = prepare_server_args(json.loads(sys.argv[1]))  # before load_plugins(): SGLang's own parsing
t1 = time.perf_counter()

class SchedulerProbe(scheduler.Scheduler):  # the plugin's gate (where enabled) runs around this __init__
    def __init__(self, *args, **kwargs):
        t2 = time.perf_counter()
        from sglang.srt.plugins.hook_registry import HookRegistry
        out = {"import scheduler": t1 - t0, "load_plugins": t2 - t1, "modules": len(sys.modules),
               "hooked": len(HookRegistry._hooks), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        try:
            from sglang_hostsync_plugin import runtime
            rt = runtime.current()
            if rt is not None:
                out["setup_s"] = rt.setup_s
                out["plan_inherited"] = rt.plan_inherited
        except ImportError:
            pass
        print("RESULT " + json.dumps(out), flush=True)
        os._exit(0)

scheduler.Scheduler = SchedulerProbe
scheduler.run_scheduler_process(server_args, None, 0, 0, 0, None, None)
"""

DETOKENIZER = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
from sglang.srt.managers import detokenizer_manager
from sglang.srt.server_args import prepare_server_args
server_args = prepare_server_args(json.loads(sys.argv[1]))  # before load_plugins(): SGLang's own parsing
t1 = time.perf_counter()

class Probe:  # the manager run_detokenizer_process creates after load_plugins()
    def __init__(self, *args, **kwargs):
        t2 = time.perf_counter()
        from sglang.srt.plugins.hook_registry import HookRegistry
        print("RESULT " + json.dumps({"import detokenizer": t1 - t0, "load_plugins": t2 - t1, "modules": len(sys.modules),
              "hooked": len(HookRegistry._hooks), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
              flush=True)
        os._exit(0)

detokenizer_manager.run_detokenizer_process(server_args, None, Probe)
"""

# Stages: "load_plugins" of the scheduler and detokenizer runs to the probe (SGLang's own set-up
# between load_plugins() and the object, and the plugin's gate, are included).
KINDS = (("launcher", ["import launch_server", "load_plugins", "prepare_server_args", "import http_server"]),
         ("scheduler", ["import scheduler", "load_plugins"]),
         ("detokenizer", ["import detokenizer", "load_plugins"]))

NO_PLUGIN, DISABLED = "no plugin", "disabled"


def _env(arm: str, plan: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_HOSTSYNC_", "SGLANG_ENABLE_HOSTSYNC")) and k != "SGLANG_PLUGINS"}
    if arm == NO_PLUGIN:  # SGLang's whitelist without this plugin: as if it were not installed
        env["SGLANG_PLUGINS"] = "no-such-plugin"
    elif arm != DISABLED:
        env.update(SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS=arm)
    if plan:
        env["SGLANG_HOSTSYNC_PLAN"] = plan
    return env


def sample(code: str, env: dict, *argv: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    line = next((line for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"sample failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(line[len("RESULT "):])
    result["total"] = wall
    return result


def median_table(rows: list[dict], stages: list[str]) -> dict:
    return {s: statistics.median(r[s] for r in rows) for s in stages}


def report(samples: dict, arms: list[str]) -> list[str]:
    """Markdown lines: per process kind sampled, each arm's median stages, total and peak
    RSS, and total - stock."""
    lines = []
    for kind, stages in KINDS:
        if not samples.get((kind, NO_PLUGIN)):
            continue
        lines += [f"### {kind}", "",
                  "| arm | " + " | ".join(f"{s} s" for s in stages) + " | total s (interpreter included) | "
                  f"minus {NO_PLUGIN} s | peak RSS MB | plugin set-up or plan resolve s (its log line) |",
                  "| --- | " + " | ".join("---" for _ in stages) + " | --- | --- | --- | --- |"]
        base = median_table(samples[(kind, NO_PLUGIN)], ["total"])["total"]
        for arm in arms:
            rows = samples[(kind, arm)]
            med = median_table(rows, [*stages, "total"])
            rss = [r["rss_mb"] for r in rows if r.get("rss_mb") is not None]
            setup = [r["setup_s"] for r in rows if r.get("setup_s") is not None]
            lines.append(f"| {arm} | " + " | ".join(f"{med[s]:.2f}" for s in stages)
                         + f" | {med['total']:.2f} | {med['total'] - base:+.2f} | "
                         + (f"{statistics.median(rss):.0f}" if rss else "-") + " | "
                         + (f"{statistics.median(setup):.2f}" if setup else "-") + " |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", action="append", default=[], help="an enabled arm with this SGLANG_HOSTSYNC_SLOTS")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="start no new repeat after S seconds; report the repeats that finished")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="appended to the launcher's server arguments (e.g. --server-arg=--device --server-arg=cpu)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    slot_arms = args.slots or ["default"]
    arms = [NO_PLUGIN, DISABLED, *slot_arms]
    samples: dict = {(kind, arm): [] for kind, _ in KINDS for arm in arms}
    t_start, done = time.perf_counter(), 0
    for rep in range(args.repeats):
        if rep and args.time_budget is not None and time.perf_counter() - t_start > args.time_budget:
            print(f"time budget {args.time_budget:.0f} s spent: {rep} of {args.repeats} repeats", flush=True)
            break
        order = arms if rep % 2 == 0 else arms[::-1]
        for arm in order:
            launcher = sample(LAUNCHER, _env(arm), json.dumps(ARGV + args.server_arg))
            samples[("launcher", arm)].append(launcher)
            samples[("scheduler", arm)].append(
                sample(SCHEDULER, _env(arm, launcher.get("plan")), json.dumps(ARGV + args.server_arg)))
            samples[("detokenizer", arm)].append(
                sample(DETOKENIZER, _env(arm, launcher.get("plan")), json.dumps(ARGV + args.server_arg)))
            print(f"[{rep}] {arm}: launcher {launcher['total']:.2f} s, scheduler "
                  f"{samples[('scheduler', arm)][-1]['total']:.2f} s, detokenizer "
                  f"{samples[('detokenizer', arm)][-1]['total']:.2f} s", flush=True)
        done = rep + 1
    errors = {r["http_server_error"] for r in samples[("launcher", NO_PLUGIN)] if r.get("http_server_error")}
    lines = [f"# plugin load cost per process start ({done} repeats, medians)", ""]
    if errors:
        lines += [f"`import http_server` failed here ({'; '.join(sorted(errors))}): that stage is partial.", ""]
    lines += report(samples, arms)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k}/{a}": [{key: v for key, v in r.items() if key != "plan"} for r in rows]
                       for (k, a), rows in samples.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
