"""Line-level host profile of real SGLang schedulers while the e2e benchmark drives them (issue 16:
where the host time per step goes below the audit's phases).

Record (beside ``python -m sglang_hostsync_plugin.e2e ... | tee E2E_TXT``): every
``sglang::scheduler`` process of the config's servers is sampled by py-spy (non-blocking: the
process is never paused) in back-to-back chunks of ``--chunk`` seconds, each file named by its
``time.monotonic()`` span, until the process exits. The arm comes from the e2e's launch line
with the parent's ``--port``.

    python benchmarks/pyspy_schedulers.py record --e2e-txt OUT/e2e.txt --config standalone-t4-p16 --out OUT/pyspy

Report: for each (config, arm), only the chunks that lie inside that arm's timed windows (the
e2e's ``t_start`` / ``t_end``, the same monotonic clock), the scheduler thread's busy samples
(py-spy leaves out idle ones) ranked by self time per source line and by inclusive time per
function, in % of the arm's samples.

    python benchmarks/pyspy_schedulers.py report OUT/pyspy --e2e-json OUT/e2e/e2e.json [--concurrency 1] [--top 40] \
        [--callers mambaish_config --depth 3]

``--callers`` (repeatable) adds, per arm, the working samples through a frame containing the
substring, grouped by that frame and its callers, in µs per decode step (how the
``mambaish_config`` walk inside the verify commit was found, 2026-12-04). ``--under`` (repeatable)
groups the working samples below such a frame by the frames it calls: with
``--under "forward_batch_generation (ngram_worker.py" --depth 2``, NGRAM's host work between its
per-step wait and the verify launch, by line (2026-12-05, ``benchmarks/results/2026-12-05-h200-d/``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from sglang_hostsync_plugin.e2e import matrix  # noqa: E402  (an arm's folder is named as its e2e files)


def scheduler_pids() -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sglang::scheduler"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def parent_port(pid: int) -> str | None:
    with open(f"/proc/{pid}/stat") as f:
        ppid = f.read().rsplit(")", 1)[1].split()[1]
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    return args[args.index(b"--port") + 1].decode() if b"--port" in args else None


def arms_by_port(e2e_txt: str, config: str) -> dict[str, str]:
    """``--port`` -> arm, from the e2e's launch lines ``[e2e t] config/arm: ... --port N ...``."""
    out = {}
    pat = re.compile(rf"\] {re.escape(config)}/(?P<arm>.+?): .* --port (?P<port>\d+)")
    for line in open(e2e_txt, errors="replace"):
        m = pat.search(line)
        if m:
            out[m["port"]] = m["arm"]
    return out


def _sample(ns, pid: int, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    while os.path.exists(f"/proc/{pid}"):
        t0 = time.monotonic()
        tmp = os.path.join(folder, f"{t0:.3f}.part")
        subprocess.run([ns.py_spy, "record", "--nonblocking", "--threads", "-r", str(ns.rate), "-d", str(ns.chunk),
                        "-f", "raw", "-o", tmp, "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.path.exists(tmp):
            os.replace(tmp, os.path.join(folder, f"{t0:.3f}-{time.monotonic():.3f}.txt"))


def record(ns) -> int:
    deadline = time.time() + ns.wait
    arms: dict[str, str] = {}
    while time.time() < deadline:  # the config's servers are up once every launched arm has a scheduler
        if os.path.exists(ns.e2e_txt):
            arms = arms_by_port(ns.e2e_txt, ns.config)
        pids = {}
        for pid in scheduler_pids():
            try:
                pids[pid] = arms.get(parent_port(pid))
            except (OSError, ValueError, IndexError):
                pass
        if arms and sorted(a for a in pids.values() if a) == sorted(arms.values()):
            break
        time.sleep(1)
    else:
        print(f"pyspy: {ns.config}: the servers' schedulers did not appear in {ns.wait} s", file=sys.stderr)
        return 1
    os.makedirs(ns.out, exist_ok=True)
    threads = []
    for pid, arm in pids.items():
        if arm is None:
            continue
        folder = os.path.join(ns.out, matrix.file_stem(ns.config, arm))
        with open(os.path.join(ns.out, "arms.tsv"), "a") as f:
            f.write(f"{ns.config}\t{arm}\t{pid}\t{os.path.basename(folder)}\n")
        print(f"pyspy: {ns.config}/{arm}: pid {pid} -> {folder}", flush=True)
        threads.append(threading.Thread(target=_sample, args=(ns, pid, folder)))
        threads[-1].start()
    for t in threads:
        t.join()
    return 0


FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")


def _short(path: str) -> str:
    for root in ("site-packages/", "dist-packages/"):
        if root in path:
            return path.split(root, 1)[1]
    return path


def load(path: str, thread: str | None, callers: tuple[str, ...] = (), depth: int = 3, under: tuple[str, ...] = ()):
    """(samples, self by line, inclusive by function, waits, caller chains) of ``thread``, else the
    main thread (the scheduler loop), else the busiest one. Caller chains: for each substring in
    ``callers``, the working (not waiting) samples through the outermost frame that contains it,
    keyed by that frame's function and up to ``depth`` of its callers (with their lines); for each
    in ``under``, keyed by up to ``depth`` of the frames it calls (with their lines)."""
    per_thread = collections.defaultdict(list)
    for raw in open(path, errors="replace"):
        stack, _, count = raw.replace("\0", "").rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        per_thread[frames[0]].append((frames[1:], int(count)))
    if not per_thread:
        return 0, {}, {}, {}, {}
    main = [t for t in per_thread if t.endswith(": MainThread")]  # the scheduler loop's thread
    name = thread if thread in per_thread else (main or [max(per_thread, key=lambda t: sum(c for _, c in per_thread[t]))])[0]
    total, self_line, incl, waits = 0, collections.Counter(), collections.Counter(), collections.Counter()
    chains = collections.Counter()
    for frames, count in per_thread[name]:
        total += count
        joined = ";".join(frames)
        wait = next((w for w, hit in WAITS if hit(joined)), None)
        if wait:
            waits[wait] += count
        for pattern in callers if not wait else ():
            at = next((i for i, f in enumerate(frames) if pattern in f), None)
            if at is not None:
                chain = " <- ".join([_short_frame(frames[at], line=False),
                                     *(_short_frame(f) for f in reversed(frames[max(0, at - depth): at]))])
                chains[(pattern, chain)] += count
        for pattern in under if not wait else ():
            at = next((i for i, f in enumerate(frames) if pattern in f), None)
            if at is not None:
                below = [_short_frame(f) for f in frames[at + 1:] if not _plumbing(f)][:depth]
                chains[(UNDER, pattern, " > ".join([_short_frame(frames[at]), *below]))] += count
        parsed = [FRAME.match(f) for f in frames]
        names = [(m["fn"], _short(m["file"]), m["line"]) if m else (f, "", "") for f, m in zip(frames, parsed)]
        if names:
            fn, file, line = names[-1]
            self_line[f"{file}:{line} ({fn})"] += count
        for key in {f"{file} {fn}" for fn, file, _ in names}:
            incl[key] += count
    return total, self_line, incl, waits, chains


UNDER = "under"  # chain keys of ``under`` patterns: (UNDER, pattern, chain)
# Hook plumbing between a hooked SGLang function's caller and the slot's code (SGLang's HookRegistry
# wrapper, the plugin's installer gate and source-edit hook): left out of ``under`` chains, as the
# frames that say where the time goes are below them (their own time stays in the self-time table).
_PLUMBING = ("wrapper (plugins/hook_registry.py:", "gated (sglang_hostsync_plugin/installer.py:",
             "hook (sglang_hostsync_plugin/source_edit.py:")


def _plumbing(frame: str) -> bool:
    return frame.startswith(_PLUMBING)


def _short_frame(frame: str, line: bool = True) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m['fn']} ({_short(m['file'])}:{m['line']})" if line else f"{m['fn']} ({_short(m['file'])})"


# Where the scheduler thread waits rather than works (SGLang 0.5.23): NGRAM's and FlashInfer's per-step
# wait for step N-1 (the synchronize in FutureMap.resolve_seq_lens_cpu, or where ngram_late_wait moved it),
# the result readback's wait, stock's tail-copy sync (boolean-mask gather, eagle_worker_common.py:102/105)
# and the idle loop between requests. py-spy names a method with or without its class
# ("Event.synchronize" or "synchronize"), so the CUDA waits are matched by file.
_CUDA_WAIT = re.compile(r"(^|;)(\w+\.)?synchronize \(torch/cuda/streams\.py:\d+\)")
WAITS = (
    ("step wait", lambda stack: bool(_CUDA_WAIT.search(stack)) and ("resolve_seq_lens_cpu" in stack
                                                                   or "ngram_late_wait.py" in stack)),
    ("result wait", lambda stack: bool(_CUDA_WAIT.search(stack))),
    ("stock tail-copy sync", lambda stack: stack.endswith(("duplicate_prefix_tail_to_draft_branches (eagle_worker_common.py:102)",
                                                         "duplicate_prefix_tail_to_draft_branches (eagle_worker_common.py:105)"))),
    ("idle loop", lambda stack: "Scheduler.on_idle (" in stack),
)


def windows(e2e_json: str, concurrency: int | None) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """(config, arm) -> its timed windows (t_start, t_end, decode step µs at concurrency 1: accept
    length over tok/s/user)."""
    rows = json.load(open(e2e_json))["rows"]
    if any(r.get("pass", 0) for r in rows):
        print(f"warning: {e2e_json} timed its rounds in passes (e2e --passes): a chunk counts only inside one "
              "window, and a pass may be shorter than a chunk", file=sys.stderr)
    out = collections.defaultdict(list)
    for r in rows:
        if concurrency is None or r["concurrency"] == concurrency:
            load = r.get("load") or {}
            step = (1e6 * load["accept_length"] / load["tok_s_user_median"]
                    if r["concurrency"] == 1 and load.get("tok_s_user_median") else float("nan"))
            out[(r["config"], r["arm"])].append((r["t_start"], r["t_end"], step))
    return out


def report(ns) -> int:
    arms = {}
    spans_of = windows(ns.e2e_json, ns.concurrency)
    for line in open(os.path.join(ns.folder, "arms.tsv")):
        config, arm, _, sub = line.rstrip("\n").split("\t")
        arms[f"{config}/{arm}"] = (os.path.join(ns.folder, sub), spans_of[(config, arm)])
    runs, steps = {}, {}
    for name, (folder, spans) in arms.items():
        files = []
        for f in sorted(os.listdir(folder)):
            m = re.match(r"(\d+\.\d+)-(\d+\.\d+)\.txt$", f)
            if m and any(a <= float(m[1]) and float(m[2]) <= b for a, b, _ in spans):
                files.append(os.path.join(folder, f))
        runs[name] = (*merge(load(f, None, tuple(ns.callers), ns.depth, tuple(ns.under)) for f in files), len(files))
        steps[name] = sorted(st for _, _, st in spans)[len(spans) // 2] if spans else float("nan")
    names = list(runs)
    print("\n## Scheduler thread inside the timed windows: waiting and working\n")
    print("| arm | busy samples (chunks) | decode step µs | " + " | ".join(w for w, _ in WAITS) + " | host work | host work µs per step |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in WAITS) + " | --- | --- |")
    for n in names:
        total, waits = runs[n][0], runs[n][3]
        work = 1 - sum(waits.values()) / max(total, 1)
        cells = " | ".join(f"{100 * waits[w] / max(total, 1):.1f}%" for w, _ in WAITS)
        print(f"| {n} | {total} ({runs[n][5]}) | {steps[n]:.0f} | {cells} | {100 * work:.1f}% | {work * steps[n]:.0f} |")
    for title, idx in (("self time by source line", 1), ("inclusive time by function", 2)):
        print(f"\n## Scheduler thread inside the timed windows: {title} (% of the arm's busy samples)\n")
        print("| " + " | ".join(["where", *names]) + " |")
        print("| " + " | ".join(["---"] * (len(names) + 1)) + " |")
        keys = collections.Counter()
        for total, *tables in runs.values():
            for k, v in tables[idx - 1].items():
                keys[k] = max(keys[k], v / max(total, 1))
        for key, _ in sorted(keys.items(), key=lambda kv: (-kv[1], kv[0]))[: ns.top]:
            cells = [f"{100 * runs[n][idx][key] / max(runs[n][0], 1):.1f}" for n in names]
            print(f"| `{key}` | " + " | ".join(cells) + " |")
    for pattern in ns.callers:
        print(f"\n## Working samples through `{pattern}`, by its frame and {ns.depth} callers (µs per decode step)\n")
        for n in names:
            total, chains = runs[n][0], runs[n][4]
            mine = sorted(((c, k[1]) for k, c in chains.items() if k[0] == pattern), key=lambda x: (-x[0], x[1]))
            print(f"- {n}: {sum(c for c, _ in mine) / max(total, 1) * steps[n]:.1f} in all")
            for c, chain in mine[: ns.top]:
                print(f"  - {c / max(total, 1) * steps[n]:.1f}: `{chain}`")
    for pattern in ns.under:
        print(f"\n## Working samples under `{pattern}`, by the {ns.depth} frames below it (µs per decode step)\n")
        for n in names:
            total, chains = runs[n][0], runs[n][4]
            mine = sorted(((c, k[2]) for k, c in chains.items() if k[0] is UNDER and k[1] == pattern),
                          key=lambda x: (-x[0], x[1]))
            print(f"- {n}: {sum(c for c, _ in mine) / max(total, 1) * steps[n]:.1f} in all")
            for c, chain in mine[: ns.top]:
                print(f"  - {c / max(total, 1) * steps[n]:.1f}: `{chain}`")
    return 0


def merge(parts):
    total, self_line, incl, waits = 0, collections.Counter(), collections.Counter(), collections.Counter()
    chains = collections.Counter()
    for t, s, i, w, c in parts:
        total += t
        self_line.update(s)
        incl.update(i)
        waits.update(w)
        chains.update(c)
    return total, self_line, incl, waits, chains


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--e2e-txt", required=True)
    r.add_argument("--config", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--rate", type=int, default=250)
    r.add_argument("--chunk", type=int, default=1, help="seconds per py-spy recording")
    r.add_argument("--wait", type=int, default=400)
    r.add_argument("--py-spy", default="py-spy")
    p = sub.add_parser("report")
    p.add_argument("folder")
    p.add_argument("--e2e-json", required=True)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--callers", action="append", default=[], metavar="SUBSTRING",
                   help="also list the working samples through the first frame containing this, by caller chain; repeatable")
    p.add_argument("--under", action="append", default=[], metavar="SUBSTRING",
                   help="also list the working samples under the first frame containing this, by the frames it calls; repeatable")
    p.add_argument("--depth", type=int, default=3, help="callers (--callers) or callees (--under) shown per chain")
    ns = ap.parse_args()
    return record(ns) if ns.cmd == "record" else report(ns)


if __name__ == "__main__":
    sys.exit(main())
