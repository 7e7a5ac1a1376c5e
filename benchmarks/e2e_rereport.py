"""The e2e report of a finished run again, with the current statistics (columns added since).

    python benchmarks/e2e_rereport.py RUN_DIR [--out OUT_DIR]

RUN_DIR holds the run's ``e2e.json`` (or ``e2e.json.xz``) and its audited servers' traces, plain
or xz-compressed, under the names the run wrote; in a folder under ``benchmarks/results/`` the traces
are read from the run folder's ``raw.tar.xz`` (``raw_archive.py``: no unpacking; a clone without the
archive rebuilds it with ``python benchmarks/raw_archive.py restore RUN``). The rounds' windows are
cut from the traces again, as the e2e does at the end of a run; OUT_DIR (default RUN_DIR/rereport)
gets e2e.md, e2e.png and e2e.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile

from sglang_hostsync_plugin.e2e import run
from sglang_hostsync_plugin.slots.audit import ENV_TRACE, rank_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raw_archive  # noqa: E402


def _read(path: str) -> str:
    """PATH or PATH.xz, in RUN_DIR or in its run folder's raw.tar.xz."""
    return raw_archive.read_text(path)


def trace_names(result: dict) -> dict[tuple, str]:
    """(config, arm) -> the file name of that server's trace, from its launch command."""
    names = {}
    for key, info in result["servers"].items():
        config, arm = key.split("/", 1)
        for word in shlex.split(info.get("command", "")):
            if word.startswith(ENV_TRACE + "="):
                names[(config, arm)] = os.path.basename(word.split("=", 1)[1])
    return names


def rereport(run_dir: str, out_dir: str) -> str:
    result = json.loads(_read(os.path.join(run_dir, "e2e.json")))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for cell, name in trace_names(result).items():
            rank = 0
            while True:  # rank 0's trace, then each further rank's (multi-process servers)
                try:
                    text = _read(os.path.join(run_dir, rank_path(name, rank)))
                except OSError:
                    break  # an arm whose trace did not come back: its cells stay unaudited
                with open(os.path.join(tmp, rank_path(name, rank)), "w") as f:
                    f.write(text)
                paths[cell] = os.path.join(tmp, name)
                rank += 1
        windows = run.attach_audit(result, paths)
        md = run.report(result, out_dir, windows)
    with open(os.path.join(out_dir, "e2e.json"), "w") as f:
        json.dump(result, f, indent=1)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--out", help="default: RUN_DIR/rereport")
    args = p.parse_args(argv)
    print(rereport(args.run_dir, args.out or os.path.join(args.run_dir, "rereport")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
