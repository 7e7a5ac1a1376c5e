"""eagle_step_graph in a real server: weight updates with a CUDA-graph recapture, and forced capture
failures, each compared token for token with a stock server (a CUDA machine with SGLang 0.5.23).

Three servers of one configuration start together (STANDALONE topk 1 page 16, triton, the e2e's written
random-weight checkpoints, real acceptance):
  stock   SGLang alone
  auto    SGLANG_HOSTSYNC_SLOTS=auto (topk 1 triton: it picks default,eagle_step_graph)
  fault   default,eagle_step_graph, whose first captures are made to fail (``sitecustomize`` below:
          a host synchronize right after the capture opens, the failure a real host sync in the step gives)
The real-traffic mix (``e2e.traffic``) runs one request at a time on each and is compared with stock's;
then every server takes ``/update_weights_from_disk`` (the same checkpoint, ``recapture_cuda_graph``
true: SGLang replaces its CUDA-graph runners; it flushes the radix cache), and the mix runs and is
compared again. Exit 1 on any
difference, error or missing log evidence.

    python benchmarks/step_graph_weights.py --out /tmp/sgw     # prints one JSON summary
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import urllib.request

from sglang_hostsync_plugin.e2e import checkpoints, client, matrix, run, traffic

SITECUSTOMIZE = '''
import importlib.abc, importlib.util, os, sys
_LEFT = [int(os.environ.get("HOSTSYNC_FAIL_CAPTURES", "0"))]
_NAME = "sglang_hostsync_plugin.slots.eagle_step_graph"

def _patch(module):
    opened = module.Capture.open
    def open(self):
        opened(self)
        if _LEFT[0] > 0:
            _LEFT[0] -= 1
            import torch
            torch.cuda.synchronize()  # inside a capture: the capture fails here
    module.Capture.open = open

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

if _LEFT[0] > 0:
    sys.meta_path.insert(0, _Finder())
'''

ARMS = {"stock": None, "auto": "auto", "fault": "default,eagle_step_graph"}


def post(base: str, path: str, body: dict, timeout: float = 300.0) -> dict:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def without_injected(log: str) -> str:
    """The fault server's log less each failed capture's warning and its traceback (up to the next log
    record), which the injected synchronize causes: every other line is still checked."""
    kept, skipping = [], False
    for line in log.splitlines():
        if re.search(r"capturing the bs \d+ step failed", line):
            skipping = True
            continue
        if skipping and line.startswith("["):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="hostsync-sgw-"))
    ap.add_argument("--port", type=int, default=32000)
    ap.add_argument("--fail-captures", type=int, default=2, help="captures made to fail in the fault server")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    models = checkpoints.write_checkpoints(os.path.join(args.out, "models"))
    config = matrix.CONFIGS["standalone-t1-p16"]
    opts = matrix.Options(cuda_graph_max_bs=8, extra_server_args=("--disable-prefill-cuda-graph",))
    site = os.path.join(args.out, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    servers = {}
    summary: dict = {"out": args.out, "failures": []}
    fail = summary["failures"].append
    try:  # a failed launch stops the servers already started
        for i, (name, slots) in enumerate(ARMS.items()):
            launch = matrix.launch(config, matrix.Arm(name, slots), args.port + i, opts, models, args.out)
            if name == "fault":
                path = os.environ.get("PYTHONPATH", "")
                launch.env.update(HOSTSYNC_FAIL_CAPTURES=str(args.fail_captures),
                                  PYTHONPATH=site + (os.pathsep + path if path else ""))
            servers[name] = run.Server(launch)
        ready = client.wait_ready_all({n: (s.base, s.t0, s.alive) for n, s in servers.items()}, args.ready_timeout)
        summary["ready_s"] = {n: (round(v, 1) if isinstance(v, float) else str(v)) for n, v in ready.items()}
        if any(not isinstance(v, float) for v in ready.values()):
            fail("a server did not start")
            return 1
        mix = traffic.request_mix(checkpoints.CHECKPOINT_SHAPES["small"]["vocab_size"], seed=7)
        for phase in ("before", "after"):
            outs = {n: traffic.sequential(s.base, mix) for n, s in servers.items()}
            for name in ("auto", "fault"):
                verdict = traffic.compare(outs["stock"], outs[name])
                summary[f"{phase}/{name}"] = {k: verdict[k] for k in ("identical", "compared", "same", "errors")}
                if not verdict["identical"]:
                    fail(f"{phase}: {name} differs from stock: {json.dumps(verdict)[:400]}")
            if phase == "before":
                for name in servers:  # every server, so their radix caches stay alike (the update flushes it)
                    got = post(servers[name].base, "/update_weights_from_disk",
                               {"model_path": models["target"], "recapture_cuda_graph": True})
                    summary[f"update/{name}"] = got
                    if not got.get("success"):
                        fail(f"{name}: /update_weights_from_disk failed: {got}")
        logs = {n: s.log_text() for n, s in servers.items()}
        lines = {n: [ln for ln in text.splitlines() if "hostsync: " in ln and ("eagle_step_graph" in ln or "auto:" in ln)]
                 for n, text in logs.items() if n != "stock"}
        summary["log_lines"] = {n: [ln[ln.find("hostsync: "):][:300] for ln in v][-12:] for n, v in lines.items()}
        auto_log, fault_log = "\n".join(lines["auto"]), "\n".join(lines["fault"])
        if "auto: EAGLE family, topk 1, triton" not in auto_log:
            fail("auto: no pick line for topk 1 triton in its log")
        if "captured" not in auto_log or "replayed" not in auto_log:
            fail("auto: no step graph captured and replayed")
        if not re.search(r"capturing the bs \d+ step failed", fault_log):
            fail("fault: no failed capture logged")
        summary["fault_failed_captures"] = len(re.findall(r"capturing the bs \d+ step failed", fault_log))
        for name, text in logs.items():
            problems = traffic.log_problems(without_injected(text) if name == "fault" else text)
            if problems:
                fail(f"{name}: log problems: {problems[:3]}")
    finally:
        run.stop_all(servers.values())
        print(json.dumps(summary, indent=1))
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
