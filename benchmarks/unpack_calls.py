"""Unpack device calls (``scripts/device_call.sh`` archives) into one results folder.

    python benchmarks/unpack_calls.py benchmarks/results/2026-12-08-h100 /work/.device/3 /work/.device/4

Each argument after the folder is what one call brought back (the device tool's ``files_at``): its
``NAME.tar.xz`` and any folders the GPU tests wrote under ``$OUT`` (``test_gpu_x/``: an e2e of their
own). Into the folder go, per call: the archive itself (raw, for ``raw_archive.py pack``), the e2e's
report as ``NAME-e2e.md`` / ``.json`` / ``.png``, the GPU tests' log as ``NAME-gpu_tests.log``; per test
folder, its report as ``test_gpu_x-e2e.*`` and its server logs as ``test_gpu_x-servers.tar.xz`` (audit
traces left out, as the call's archive leaves them; the same test in a later call: ``NAME-test_gpu_x-*``). It prints what the README needs: the plugin
digest, the GPU, each e2e's command and stop, and the test summary lines. Then write the README, commit,
and ``python benchmarks/raw_archive.py pack FOLDER``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile

E2E_FILES = ("e2e.md", "e2e.json", "e2e.png")


def _copy(src: str, dst: str, copied: list[str]) -> None:
    shutil.copyfile(src, dst)
    copied.append(os.path.basename(dst))


def _summary(lines: list[str], wanted: tuple[str, ...]) -> list[str]:
    return [ln.rstrip() for ln in lines if any(w in ln for w in wanted)]


def _e2e_meta(name: str, path: str) -> list[str]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        meta = json.load(f).get("meta", {})
    return [f"{name}: {meta.get('date')}: {meta.get('command')}"] + (
        [f"{name}: stopped: {meta['stopped']}"] if meta.get("stopped") else [])


def unpack_archive(archive: str, folder: str, copied: list[str], report: list[str]) -> None:
    name = os.path.basename(archive)[: -len(".tar.xz")]
    _copy(archive, os.path.join(folder, os.path.basename(archive)), copied)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        root = os.path.join(tmp, f"hostsync-{name}")
        for meta in ("digest.txt", "gpu.txt"):
            path = os.path.join(root, meta)
            if os.path.isfile(path):
                report.append(f"{name}: {meta[:-4]} {open(path).read().strip()}")
        e2e = os.path.join(root, "run", "e2e")
        for f in E2E_FILES:
            if os.path.isfile(os.path.join(e2e, f)):
                _copy(os.path.join(e2e, f), os.path.join(folder, f"{name}-{f}"), copied)
        report += _e2e_meta(name, os.path.join(e2e, "e2e.json"))
        run_log = os.path.join(root, "gpu_run.log")
        if os.path.isfile(run_log):
            report += [f"{name}: {ln}" for ln in _summary(open(run_log).readlines(), ("gpu_run rc", "FAILED", "DIED",
                                                                                     "interrupted", "failed"))][:12]
        tests = os.path.join(root, "gpu_tests.log")
        if os.path.isfile(tests):
            _copy(tests, os.path.join(folder, f"{name}-gpu_tests.log"), copied)
            report += [f"{name}: {ln}" for ln in _summary(open(tests).readlines(), (" passed", " failed", "rc "))][-3:]


def unpack_test_dir(path: str, folder: str, copied: list[str], report: list[str], call: str = "") -> None:
    name = os.path.basename(path.rstrip("/"))
    if call and any(c.startswith(f"{name}-") for c in copied):
        name = f"{call}-{name}"  # the same GPU test in two calls of one folder: the later one named by its call
    for f in E2E_FILES:
        if os.path.isfile(os.path.join(path, f)):
            _copy(os.path.join(path, f), os.path.join(folder, f"{name}-{f}"), copied)
    logs = sorted(f for f in os.listdir(path) if f.endswith(".log"))
    if logs:
        dst = os.path.join(folder, f"{name}-servers.tar.xz")
        with tarfile.open(dst, "w:xz") as tar:
            for f in logs:
                tar.add(os.path.join(path, f), arcname=f"{name}/{f}")
        copied.append(os.path.basename(dst))
    report += _e2e_meta(name, os.path.join(path, "e2e.json")) + [f"{name}: {len(logs)} server log(s)"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the results folder (created if missing)")
    ap.add_argument("calls", nargs="+", help="what each call brought back (the device tool's files_at)")
    args = ap.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    copied: list[str] = []
    report: list[str] = []
    for call in args.calls:
        entries = sorted(os.listdir(call))
        archives = [e for e in entries if e.endswith(".tar.xz")]
        if not archives:
            print(f"{call}: no NAME.tar.xz (not a device_call.sh output)", file=sys.stderr)
            return 2
        for a in archives:
            unpack_archive(os.path.join(call, a), args.folder, copied, report)
        for e in entries:
            if os.path.isdir(os.path.join(call, e)):
                unpack_test_dir(os.path.join(call, e), args.folder, copied, report, archives[0][: -len(".tar.xz")])
    for f in copied:
        os.chmod(os.path.join(args.folder, f), 0o644)  # the tool's copies are read-only
    print("\n".join(report))
    print(f"into {args.folder}: {', '.join(copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
