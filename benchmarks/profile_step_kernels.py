"""Where a real server's GPU time per speculative step goes: graph vs eager kernels.

Starts the e2e benchmark's servers for each configuration and arm (all at once, as the e2e
does), then, one server at a time while the others idle: a warm-up, ``--profile-requests`` long
greedy requests at once (1: concurrency 1), and SGLang's own profiler (``/start_profile``, GPU
activity only, no stacks) over ``--steps`` scheduler steps of them, started once every request has
streamed ``--profile-after`` output tokens (the same position, so the same KV length, in every
arm). Each trace is reduced to per-step figures:

- GPU busy µs (the union of kernel, memcpy and memset intervals) and the GPU-idle µs inside
  the profiled span: a GPU-bound step has little idle, so only less GPU work makes it faster;
- kernels launched by CUDA graphs vs eager (launched one by one from the host), with their
  GPU µs, and the eager kernels, memcpys and memsets ranked by count.

The profiler's host callbacks slow the host, so the idle figures are an upper bound; kernel
durations are the GPU's own. Output under ``--out``: ``profile.json``, ``profile.md``, each
server's log, and per arm ``<config>__<arm>.gpu.tsv.xz`` (every GPU event of the window).

    python benchmarks/profile_step_kernels.py --configs standalone-t1-p16 \\
        --arms stock --slots default,eagle_host,-audit --out /tmp/prof
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import lzma
import os
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_hostsync_plugin.e2e import client, matrix, run  # noqa: E402

GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def reduce_trace(events: list[dict], steps: int) -> dict:
    """Per-step figures from a Kineto chrome trace's events (see the module docstring).
    A kernel counts as graph-launched when its correlation id belongs to a graph-launch call
    (or it carries a graph id); the step count is the most-launched graph's launch count when
    graphs ran, else ``steps`` (what was asked of the profiler)."""
    launcher = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {}):
            launcher[e["args"]["correlation"]] = e.get("name", "")
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    if not gpu:
        return {"error": "no GPU events in the trace"}
    rows = []
    for e in gpu:
        args = e.get("args") or {}
        via = launcher.get(args.get("correlation"), "")
        graph_id = args.get("graph id") or args.get("graph_id")
        in_graph = bool(graph_id) or via.startswith(GRAPH_LAUNCH)
        rows.append((float(e["ts"]), float(e.get("dur", 0.0)), e["cat"], e.get("name", ""), in_graph, via, graph_id))
    graph_launches = sum(1 for name in launcher.values() if name.startswith(GRAPH_LAUNCH))
    seen = collections.defaultdict(set)  # graph id -> the launches (correlation ids) it ran in
    for e in gpu:
        args = e.get("args") or {}
        gid = args.get("graph id") or args.get("graph_id")
        if gid:
            seen[gid].add(args.get("correlation"))
    launches_by_graph = {str(g): len(c) for g, c in seen.items()}
    n = max(launches_by_graph.values()) if launches_by_graph else steps
    t0 = min(r[0] for r in rows)
    t1 = max(r[0] + r[1] for r in rows)
    busy = _union_us([(r[0], r[0] + r[1]) for r in rows])
    kern = [r for r in rows if r[2] == "kernel"]
    graph_k = [r for r in kern if r[4]]
    eager_k = [r for r in kern if not r[4]]
    copies = [r for r in rows if r[2] != "kernel"]

    def ranked(rs, top=25):
        by = collections.defaultdict(lambda: [0, 0.0])
        for r in rs:
            key = r[3][:90]
            by[key][0] += 1
            by[key][1] += r[1]
        return [{"name": k, "per_step": c / n, "us_per_step": d / n}
                for k, (c, d) in sorted(by.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:top]]

    return {
        "steps": n,
        "steps_source": "most-launched graph" if launches_by_graph else "profiler num_steps",
        "span_us_per_step": (t1 - t0) / n,
        "gpu_busy_us_per_step": busy / n,
        "gpu_idle_us_per_step": (t1 - t0 - busy) / n,
        "graph_launches_per_step": graph_launches / n,
        "launches_by_graph": launches_by_graph,
        "graph_kernels_per_step": len(graph_k) / n,
        "graph_kernel_us_per_step": sum(r[1] for r in graph_k) / n,
        "eager_kernels_per_step": len(eager_k) / n,
        "eager_kernel_us_per_step": sum(r[1] for r in eager_k) / n,
        "copies_per_step": len(copies) / n,
        "copy_us_per_step": sum(r[1] for r in copies) / n,
        "eager_kernels": ranked(eager_k),
        "copies": ranked(copies, 10),
        "rows": rows,
    }


def arm_stem(key: str) -> str:
    """A result key (``config/arm``) as this script names that arm's files (``<stem>.gpu.tsv.xz``): the e2e's
    file stem, cut with a hash where a long slot list would make the name too long."""
    config, arm = key.split("/", 1)
    return matrix.file_stem(config, arm)


def _tsv(rows) -> bytes:
    lines = ["ts_us\tdur_us\tcat\tin_graph\tgraph_id\tlauncher\tname"]
    lines += [f"{r[0]:.3f}\t{r[1]:.3f}\t{r[2]}\t{int(r[4])}\t{r[6] or ''}\t{r[5]}\t{r[3]}" for r in rows]
    return lzma.compress(("\n".join(lines) + "\n").encode())


def _stream(base: str, prompt: list[int], max_new_tokens: int, start_after: int, reached: threading.Event) -> None:
    """One greedy streamed request; sets ``reached`` once ``start_after`` tokens came back."""
    payload = {"input_ids": list(prompt), "stream": True,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
    req = urllib.request.Request(f"{base}/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            meta = json.loads(line[5:]).get("meta_info", {})
            if meta.get("completion_tokens", 0) >= start_after:
                reached.set()


def profile_one(srv: run.Server, prompts: list[list[int]], out_dir: str, name: str, steps: int, max_new_tokens: int,
                start_after: int) -> dict:
    """Profiles ``len(prompts)`` long requests decoding together."""
    client.run_load(srv.base, prompts + prompts[:1], len(prompts), 64)  # warm-up at the profiled batch size
    prof_dir = os.path.join(out_dir, "traces", name)
    os.makedirs(prof_dir, exist_ok=True)
    errors = []

    def long_request(prompt, reached):
        try:
            _stream(srv.base, prompt, max_new_tokens, start_after, reached)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            errors.append(f"/generate: {exc}")
        reached.set()

    reached = [threading.Event() for _ in prompts]
    threads = [threading.Thread(target=long_request, args=(p, r)) for p, r in zip(prompts, reached)]
    for t in threads:
        t.start()
    # Every arm from the same output position: attention time grows with the KV length, so a
    # faster arm profiled after the same wall time would pay for its longer sequence.
    deadline = time.perf_counter() + 300
    for r in reached:
        r.wait(timeout=max(0.0, deadline - time.perf_counter()))
    body = {"output_dir": prof_dir, "num_steps": steps, "activities": ["GPU"], "with_stack": False,
            "record_shapes": False, "profile_id": name}
    req = urllib.request.Request(f"{srv.base}/start_profile", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:  # answers (plain text) once the steps ran and the trace is written
        urllib.request.urlopen(req, timeout=300).read()
    except (urllib.error.URLError, OSError) as exc:
        errors.append(f"/start_profile: {exc}")
    for t in threads:
        t.join()
    paths = sorted(glob.glob(os.path.join(prof_dir, "*.trace.json.gz")))
    if not paths:
        return {"error": f"no trace written under {prof_dir}; request errors: {errors}"}
    with gzip.open(paths[-1], "rt") as f:
        events = json.load(f)["traceEvents"]
    fig = reduce_trace(events, steps)
    rows = fig.pop("rows", [])
    with open(os.path.join(out_dir, f"{name}.gpu.tsv.xz"), "wb") as f:
        f.write(_tsv(rows))
    for p in paths:
        os.remove(p)
    fig["request_errors"] = errors
    return fig


def markdown(results: dict) -> str:
    lines = ["| config / arm | steps | span µs/step | GPU busy | GPU idle | graph launches | graph kernels (µs) | "
             "eager kernels (µs) | copies (µs) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, f in results.items():
        if "error" in f:
            lines.append(f"| {key} | error: {f['error']} |")
            continue
        lines.append(f"| {key} | {f['steps']} | {f['span_us_per_step']:.0f} | {f['gpu_busy_us_per_step']:.0f} | "
                     f"{f['gpu_idle_us_per_step']:.0f} | {f['graph_launches_per_step']:.1f} | "
                     f"{f['graph_kernels_per_step']:.0f} ({f['graph_kernel_us_per_step']:.0f}) | "
                     f"{f['eager_kernels_per_step']:.1f} ({f['eager_kernel_us_per_step']:.0f}) | "
                     f"{f['copies_per_step']:.1f} ({f['copy_us_per_step']:.0f}) |")
    for key, f in results.items():
        if "error" in f:
            continue
        lines += ["", f"{key}: eager kernels per step (count, GPU µs)", ""]
        lines += [f"- {k['per_step']:.2f} x {k['us_per_step']:.1f} µs `{k['name']}`" for k in f["eager_kernels"]]
        lines += [f"- copy {k['per_step']:.2f} x {k['us_per_step']:.1f} µs `{k['name']}`" for k in f["copies"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = run.build_parser()
    ap.prog, ap.description = "benchmarks/profile_step_kernels.py", __doc__.split("\n\n")[0]
    ap.add_argument("--steps", type=int, default=40, help="scheduler steps per profile")
    ap.add_argument("--profile-tokens", type=int, default=1500, help="the profiled request's max_new_tokens")
    ap.add_argument("--profile-after", type=int, default=300,
                    help="output tokens streamed before the profile starts (the same position in every arm)")
    ap.add_argument("--profile-requests", type=int, default=1,
                    help="long requests decoding together during the profile (the batch size)")
    args = ap.parse_args(argv)
    if args.profile_requests < 1:
        ap.error(f"--profile-requests {args.profile_requests} must be at least 1")
    if not 0 < args.profile_after < args.profile_tokens:
        ap.error(f"--profile-after {args.profile_after} must be above 0 and below --profile-tokens "
                 f"{args.profile_tokens}: the profile starts while the request still decodes")
    configs, arms, opts = run.plan(args)
    out_dir = os.path.abspath(args.out or "hostsync-profile")
    if args.dry_run:
        for ln in run.launches(configs, arms, opts, out_dir, {"target": "<target>", "draft": "<draft>"}, args.port):
            print(f"{ln.config} / {ln.arm}:\n  {ln.shell()}")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    models = run.write_models(opts, out_dir)
    vocab = run.model_vocab(opts)
    prompts = run.prompts(args.profile_requests, args.prompt_len, vocab, args.random_seed)
    results = {}
    for config in configs:
        servers = {}
        try:  # a failed launch stops the servers already started (the e2e's run_config does the same)
            for i, arm in enumerate(arms):
                ln = matrix.launch(config, arm, args.port + i, opts, models, out_dir)
                run.say(f"{config.name}/{arm.name}: {ln.shell()}")
                servers[arm.name] = run.Server(ln)
            for name, srv in servers.items():
                key = f"{config.name}/{name}"
                try:
                    client.wait_ready(srv.base, args.ready_timeout - (time.perf_counter() - srv.t0), srv.alive)
                    results[key] = profile_one(srv, prompts, out_dir, arm_stem(key),
                                               args.steps, args.profile_tokens, args.profile_after)
                except client.ClientError as exc:
                    results[key] = {"error": str(exc), "log_tail": srv.log_tail()}
                f = results[key]
                run.say(f"{key}: " + (f"error {f['error']}" if "error" in f else
                        f"GPU busy {f['gpu_busy_us_per_step']:.0f} µs/step, idle {f['gpu_idle_us_per_step']:.0f}, "
                        f"eager kernels {f['eager_kernels_per_step']:.1f}/step ({f['eager_kernel_us_per_step']:.0f} µs)"))
        finally:
            for srv in servers.values():
                srv.stop()
    with open(os.path.join(out_dir, "profile.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(out_dir, "profile.md"), "w") as f:
        f.write(f"# GPU time per step\n\n`{' '.join(['python benchmarks/profile_step_kernels.py', *(argv or sys.argv[1:])])}`\n\n" + md)
    print(md)
    return 0 if all("error" not in f for f in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
