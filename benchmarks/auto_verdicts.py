"""`auto` against stock and the best identical arm, over every e2e run of the given results folders.

    python benchmarks/auto_verdicts.py benchmarks/results/2026-12-07-h100-c benchmarks/results/2026-12-07-h100-d

Each folder's ``*e2e.json`` / ``*e2e.json.xz`` with an unaudited ``auto`` arm gives one row per configuration and
concurrency (``stats.auto_verdicts``, the table the e2e report has since 2026-12-07): what ``auto`` picked, whether
it was identical to stock, its ratio to stock and lowest round, the best unaudited arm identical to stock,
``auto`` over that arm by round, and what ``auto`` picks for that server today (a row whose pick changed since
needs a new run). The bar: identical, never below stock, within 2% of the best.

``--matrix`` prints the one-flag issue's configuration matrix instead: per configuration, attention backend and
concurrency, the newest run whose ``auto`` arm ran today's pick, its verdict, or that none did. A run whose
servers started without ``--sleep-on-idle`` (every run before 2026-12-08) is marked "idle arms spinning": each
other arm's scheduler spun a CPU through every timed window.
"""

from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import shlex
import sys

from sglang_hostsync_plugin import choice, doctor
from sglang_hostsync_plugin.e2e import stats


def load(path: str) -> dict:
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def todays_pick(command: str) -> str | None:
    """What ``auto`` picks today for the server a run launched (its command as e2e.json keeps it), from the
    doctor's reading of its arguments (the e2e's servers use none the doctor leaves out, such as
    ``--disable-cuda-graph`` or LoRA); None where the facts leave the class open."""
    words = shlex.split(command)
    if "sglang.launch_server" not in words:
        return None
    args, _ = doctor._parser().parse_known_args(["doctor", *words[words.index("sglang.launch_server") + 1:]])
    picked = choice.pick(doctor.facts_of(args))
    return None if picked is None else picked.spec


# The one-flag issue's matrix (STANDALONE topk 1 / 4 x page 1 / 16 on both backends, NGRAM, EAGLE3), then the
# block algorithms auto also has rows for.
MATRIX = tuple((c, be) for be in ("triton", "flashinfer") for c in (
    "standalone-t1-p1", "standalone-t1-p16", "standalone-t4-p1", "standalone-t4-p16", "ngram-p1")) + (
    ("eagle3-t1-p16", "triton"), ("dflash-p16", "triton"), ("dspark-p16", "triton"))


def backend_of(command: str) -> str | None:
    words = shlex.split(command)
    return words[words.index("--attention-backend") + 1] if "--attention-backend" in words[:-1] else None


def verdicts(path: str) -> list[dict]:
    """The run's ``auto`` verdicts, each with ``today``: what ``auto`` picks for that server now, ``backend``
    (its attention backend) and ``date`` (the run's)."""
    result = load(path)
    cell_rows = stats.cells(result.get("rows") or [])
    servers = result.get("servers") or {}
    out = stats.auto_verdicts(cell_rows, result["meta"].get("arm_slots") or {}, result.get("identity") or {},
                              result.get("traffic") or {}, servers)
    for v in out:
        command = (servers.get(f"{v['config']}/{v['arm']}") or {}).get("command", "")
        v["today"], v["backend"], v["date"] = todays_pick(command), backend_of(command), result["meta"].get("date", "")
        v["idle_spinning"] = "--sleep-on-idle" not in shlex.split(command)
    return out


def today_cell(v: dict) -> str:
    if v["today"] is None:
        return "-"
    same = v["picked"] is not None and {t.strip() for t in v["today"].split(",")} == {
        t.strip() for t in v["picked"].split(",")}
    return "the same" if same else f"`{v['today']}` (not run here)"


def matrix(rows: list[tuple[str, dict]]) -> list[str]:
    """One line per matrix cell and concurrency: the newest run of today's pick and its verdict."""
    out = ["| config | backend | conc | newest run of today's pick | " + stats.AUTO_HEADER.split(" | ", 2)[2],
           "| --- " * (stats.AUTO_HEADER.count(" | ") + 2) + "|"]
    for config, backend in MATRIX:
        for conc in (1, 8):
            cell = [(run, v) for run, v in rows
                    if (v["config"], v["backend"], v["concurrency"]) == (config, backend, conc)]
            today = [(run, v) for run, v in cell if today_cell(v) == "the same"]
            if not today:
                others = ", ".join(sorted({run for run, _ in cell})) or "none"
                out.append(f"| {config} | {backend} | {conc} | not run (runs with an older pick: {others}) |")
                continue
            run, v = max(today, key=lambda rv: rv[1]["date"])
            spun = " (idle arms spinning)" if v["idle_spinning"] else ""
            out.append(f"| {config} | {backend} | {conc} | {run}{spun} | " + stats.auto_row(v).split(" | ", 2)[2])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--matrix", action="store_true", help="the one-flag issue's matrix: the newest run of each cell")
    args = p.parse_args(argv)
    rows = []
    for folder in args.folders:
        for path in sorted(glob.glob(os.path.join(folder, "**", "*e2e.json*"), recursive=True)):
            if not path.endswith((".json", ".json.xz")) or "/rereport/" in path:
                continue
            for v in verdicts(path):
                rows.append((os.path.relpath(path, os.path.dirname(os.path.abspath(folder))), v))
    if not rows:
        print("no unaudited auto arm in these runs")
        return 0
    if args.matrix:
        print("\n".join(matrix(rows)))
        return 0
    print("| run " + stats.AUTO_HEADER + " auto's pick today |")
    print("| --- " * (stats.AUTO_HEADER.count(" | ") + 3) + "|")
    for run, v in rows:
        print(f"| {run} " + stats.auto_row(v) + f" {today_cell(v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
