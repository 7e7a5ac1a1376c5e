"""Launch-to-ready of stock vs plugin in real servers, on a cold and then a warm
torch extension cache (GPU; SGLang 0.5.23).

Each run is one e2e benchmark pass (``python -m sglang_hostsync_plugin.e2e``, arms
stock and plugin-noaudit (the default slots) started together, one short window) with ``TORCH_EXTENSIONS_DIR``
pointing at a fresh directory for run 1 and the same, now filled, directory after.
It prints the ready times (launch to the first 200 on /health), their difference,
and from the plugin server's log how often the csrc build was started, whether it
finished before the server said it was ready, and which kernels took over from
their Triton path after ready (a build still running then does not hold the start).
``--slots LIST`` adds a server of that selection (without the audit) to every run, started
together with the other two: its time to ready beside stock's, e.g. a preset whose Triton
kernels compile during SGLang's CUDA-graph capture and warm-up.

    python benchmarks/bench_startup.py --out startup --runs 2 [--slots default,eagle_host] [--server-arg=...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

CONFIG = "standalone-t4-p16"
# What a user starts: the default slots, without the audit (whose 18 hooks, 29 with audit_fine, cost
# SGLang's HookRegistry a module scan each; runs before 2026-12-01 21:00 UTC measured
# "default,audit").
ARM = "plugin-noaudit"
BUILD_STARTED = "hostsync: building csrc"
BUILD_DONE = re.compile(r"hostsync prebuild: csrc/(\w+)\.cu (ready|FAILED)")
# Under auto a kernel still building at ready takes over later (csrc.load_in_background).
SWITCHED = re.compile(r"hostsync: (\w+): csrc/(\w+)\.cu loaded .* serves from now on")
READY = "The server is fired up and ready to roll!"


def log_facts(path: str) -> dict:
    """From a server log: csrc build starts, build results, and their order against ready."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    ready_at = next((i for i, line in enumerate(lines) if READY in line), None)
    started = [i for i, line in enumerate(lines) if BUILD_STARTED in line]
    done = [(i, m.group(1), m.group(2)) for i, line in enumerate(lines) if (m := BUILD_DONE.search(line))]
    loaded = [line.split("hostsync: ", 1)[1] for line in lines if "hostsync: " in line and "prepared in" in line]
    switched = [(i, m.group(2)) for i, line in enumerate(lines) if (m := SWITCHED.search(line))]
    return {
        "build_started": len(started),
        "build_results": [f"{name} {what}" for _, name, what in done],
        "build_done_before_ready": bool(done) and ready_at is not None and all(i < ready_at for i, _, _ in done),
        "prepared": loaded,
        "switched_after_ready": [name for i, name in switched if ready_at is not None and i > ready_at],
        "ready_logged": ready_at is not None,
    }


def extra_arm(spec: str) -> str:
    """The e2e ``--slots`` value of an extra arm: the selection without the audit, like the plugin arm."""
    tokens = [t.strip() for t in spec.split(",") if t.strip() and t.strip() not in ("audit", "-audit")]
    if not tokens:
        raise SystemExit(f"--slots {spec!r}: name a selection")
    return ",".join(tokens + ["-audit"])


def fmt_delta(ready, stock, alone=False) -> str:
    """``alone``: the e2e restarted that server by itself after it failed the shared start (SGLang's
    KV sizing lost a memory race): its ready time had no contention, so no difference is taken."""
    if ready is None:
        return "failed"
    if alone:
        return f"{ready:.1f} s (restarted alone: not comparable)"
    return f"{ready:.1f} s" + (f" ({ready - stock:+.1f} s against stock)" if stock is not None else "")


def ready_times(servers: dict, extra: list[str]) -> dict:
    """A run's ready times from ``e2e.json``'s servers; the difference only between two servers that
    both started in the shared start."""
    def ready(name):
        server = servers.get(f"{CONFIG}/{name}", {})
        return server.get("ready_s"), "restarted_alone" in server

    (stock, stock_alone), (plugin, plugin_alone) = ready("stock"), ready(ARM)
    return {"stock_ready_s": stock, "plugin_ready_s": plugin, "stock_restarted_alone": stock_alone,
            "plugin_restarted_alone": plugin_alone,
            "plugin_minus_stock_s": plugin - stock if plugin and stock and not (stock_alone or plugin_alone) else None,
            "extra": {spec: ready(f"slots:{spec}") for spec in extra}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=2, help="run 1 on a fresh extension cache, the rest warm")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--slots", action="append", default=[], metavar="LIST",
                    help="another server per run with this SGLANG_HOSTSYNC_SLOTS (the audit left out)")
    args = ap.parse_args(argv)
    extra = [extra_arm(spec) for spec in args.slots]
    os.makedirs(args.out, exist_ok=True)
    ext = os.path.abspath(os.path.join(args.out, "torch_extensions"))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext)
    rows = []
    for run in range(1, args.runs + 1):
        out = os.path.join(args.out, f"run{run}")
        cmd = [sys.executable, "-m", "sglang_hostsync_plugin.e2e", "--configs", CONFIG, "--arms", f"stock,{ARM}",
               "--concurrency", "1", "--rounds", "1", "--requests", "2", "--max-new-tokens", "64",
               "--identity-prompts", "2", "--identity-tokens", "16", "--out", out,
               *(f"--slots={spec}" for spec in extra), *(f"--server-arg={a}" for a in args.server_arg)]
        cache = "cold" if run == 1 else "warm"
        print(f"== run {run} ({cache} extension cache): {' '.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, env=env)
        with open(os.path.join(out, "e2e.json")) as f:
            servers = json.load(f)["servers"]
        rows.append({"run": run, "cache": cache, "rc": proc.returncode, **ready_times(servers, extra),
                     **log_facts(os.path.join(out, f"{CONFIG}__{ARM}.log"))})
    with open(os.path.join(args.out, "startup.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("\n| run | extension cache | stock ready s | plugin ready s | plugin - stock s | csrc builds started "
          "| build results | built before ready | csrc took over after ready |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fmt = lambda v: "failed" if v is None else f"{v:.1f}"  # noqa: E731
        alone = r["stock_restarted_alone"] or r["plugin_restarted_alone"]
        diff = "restarted alone" if alone else fmt(r["plugin_minus_stock_s"])
        print(f"| {r['run']} | {r['cache']} | {fmt(r['stock_ready_s'])} | {fmt(r['plugin_ready_s'])} | "
              f"{diff} | {r['build_started']} | {', '.join(r['build_results']) or '-'} | "
              f"{'yes' if r['build_done_before_ready'] else 'no'} | {', '.join(r['switched_after_ready']) or '-'} |")
    for spec in extra:
        print(f"\n`{spec}` (started with them): " + "; ".join(
            f"run {r['run']} ({r['cache']}) ready "
            f"{fmt_delta(r['extra'][spec][0], r['stock_ready_s'], r['extra'][spec][1] or r['stock_restarted_alone'])}"
            for r in rows))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
