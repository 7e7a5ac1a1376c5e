"""A run folder's raw files (server logs, audit and profiler traces, py-spy dumps) in one ``raw.tar.xz``.

Each folder under ``benchmarks/results/`` keeps in git its README, reports (``e2e.md`` ...), small text
summaries, device scripts and JSON results (``.json.xz`` over 20 KB). The bulky raw files of the run
are packed into ``RUN/raw.tar.xz`` (xz -9, the files byte for byte under their paths in RUN), which git
ignores (``benchmarks/results/.gitignore``), so neither a checkout nor the copy sent to a GPU machine
carries them. ``RUN/raw.tar.xz.txt`` (tracked) lists them: the commit whose tree still holds them,
then the bytes and path of each, so a clone without the archive rebuilds it from git history:

    python benchmarks/raw_archive.py restore benchmarks/results/2026-12-04-h200   # RUN... (each folder's raw.tar.xz)
    python benchmarks/raw_archive.py list benchmarks/results/2026-12-04-h200
    tar -xJf benchmarks/results/2026-12-04-h200/raw.tar.xz -C /tmp/run   # unpack, outside the checkout
    python benchmarks/raw_archive.py pack benchmarks/results/NEW_RUN   # then: git add benchmarks/results/NEW_RUN

``pack`` moves the raw files of RUN into its archive (deleting them from the folder), writes the list
and compresses the JSON files over 20 KB; commit the raw files once before packing, or the list
records no commit for them and only this machine's archive holds them.

The scripts that read a finished run (``e2e_rereport.py``, ``compare_kernels.py``,
``benchmarks/analysis/``) read a file through ``read_bytes`` / ``read_text``: from the folder if it is
there, else from the ``raw.tar.xz`` of the folder that holds it, so they need no unpacking.
"""

from __future__ import annotations

import argparse
import functools
import io
import lzma
import os
import subprocess
import sys
import tarfile

ARCHIVE = "raw.tar.xz"
LISTING = "raw.tar.xz.txt"
JSON_XZ_OVER = 20_000  # bytes: a JSON result larger than this is kept as .json.xz
PNG_PACK_OVER = 200_000  # bytes: a larger PNG is packed unless a markdown file of the folder names it
RAW_ENDINGS = (".log.xz", ".log.tail", ".tar.xz", ".csv.xz")


def is_raw(rel: str, size: int, named_in_docs: str = "") -> bool:
    """Whether a file of a run folder (path relative to it) belongs in the archive."""
    base = os.path.basename(rel)
    if base in (ARCHIVE, LISTING):
        return False
    if ".trace.tsv" in base or ".gpu.tsv" in base:  # the audit's traces, the profiler's kernel traces
        return True
    if base.endswith(RAW_ENDINGS) or "log-tail" in base:  # server logs and their tails, py-spy dumps, clocks
        return True
    if base.endswith(".log") and "__" in base:  # a server's log (CONFIG__ARM.log); test logs stay
        return True
    return base.endswith(".png") and size > PNG_PACK_OVER and base not in named_in_docs


def _git(*args: str, cwd: str = ".") -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True).stdout


def _repo_root(path: str) -> str:
    return _git("rev-parse", "--show-toplevel", cwd=path).decode().strip()


def _xz(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


def _tar_xz(files: dict[str, bytes]) -> bytes:
    """Deterministic: sorted paths, no owners, mtime 0, mode 0644."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(files[rel]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[rel]))
    return _xz(buf.getvalue())


def _write_listing(run: str, commit: str, files: dict[str, bytes]) -> None:
    name = os.path.basename(os.path.normpath(run))
    lines = [
        f"# Inside {ARCHIVE} (not tracked; read by benchmarks/raw_archive.py, or tar -xJf {ARCHIVE} -C /tmp/{name}).",
        f"# Not here (a fresh clone): python benchmarks/raw_archive.py restore benchmarks/results/{name}",
        f"commit {commit}",
    ]
    lines += [f"{len(files[rel])} {rel}" for rel in sorted(files)]
    with open(os.path.join(run, LISTING), "w") as f:
        f.write("\n".join(lines) + "\n")


def read_listing(run: str) -> tuple[str, list[tuple[int, str]]]:
    """The commit that holds the packed files ("-": none), and each file's bytes and path."""
    commit, rows = "-", []
    with open(os.path.join(run, LISTING)) as f:
        for line in f:
            if line.startswith("commit "):
                commit = line.split()[1]
            elif line.strip() and not line.startswith("#"):
                size, rel = line.rstrip("\n").split(" ", 1)
                rows.append((int(size), rel))
    return commit, rows


def pack(run: str) -> None:
    root = _repo_root(run)
    docs = ""
    for dirpath, _, names in os.walk(run):
        for n in names:
            if n.endswith(".md"):
                with open(os.path.join(dirpath, n), errors="replace") as f:
                    docs += f.read()
    raw, big_json = {}, []
    for dirpath, _, names in os.walk(run):
        for n in names:
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, run)
            size = os.path.getsize(path)
            if is_raw(rel, size, docs):
                with open(path, "rb") as f:
                    raw[rel] = f.read()
            elif n.endswith(".json") and size > JSON_XZ_OVER:
                big_json.append(path)
    if os.path.exists(os.path.join(run, ARCHIVE)):
        sys.exit(f"{run}: {ARCHIVE} exists already")
    # The commit whose tree holds every raw file unchanged (HEAD, if they are committed).
    commit = _git("rev-parse", "HEAD", cwd=root).decode().strip()
    prefix = os.path.relpath(os.path.abspath(run), root)
    for rel, data in raw.items():
        try:
            same = _git("cat-file", "blob", f"{commit}:{prefix}/{rel}", cwd=root) == data
        except subprocess.CalledProcessError:
            same = False
        if not same:
            print(f"{run}: {rel} is not committed as it is here: the listing names no commit", file=sys.stderr)
            commit = "-"
    if raw:
        with open(os.path.join(run, ARCHIVE), "wb") as f:
            f.write(_tar_xz(raw))
        _write_listing(run, commit, raw)
        for rel in raw:
            os.remove(os.path.join(run, rel))
    for path in big_json:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".xz", "wb") as f:
            f.write(_xz(data))
        os.remove(path)
    print(f"{run}: {len(raw)} files ({sum(map(len, raw.values()))} bytes) -> {ARCHIVE}, "
          f"{len(big_json)} JSON -> .json.xz")


def restore(run: str) -> None:
    """Rebuild RUN/raw.tar.xz from the commit its listing names (git history)."""
    target = os.path.join(run, ARCHIVE)
    if not os.path.exists(os.path.join(run, LISTING)):
        print(f"{run}: nothing packed")
        return
    if os.path.exists(target):
        print(f"{run}: {ARCHIVE} is there")
        return
    commit, rows = read_listing(run)
    if commit == "-":
        sys.exit(f"{run}: its listing names no commit; the files exist only in the machine's {ARCHIVE} that packed them")
    root = _repo_root(run)
    prefix = os.path.relpath(os.path.abspath(run), root)
    files = {}
    for size, rel in rows:
        data = _git("cat-file", "blob", f"{commit}:{prefix}/{rel}", cwd=root)
        if len(data) != size:
            sys.exit(f"{run}: {rel} at {commit} is not the listed file")
        files[rel] = data
    with open(target, "wb") as f:
        f.write(_tar_xz(files))
    print(f"{run}: {len(files)} files -> {ARCHIVE} (from {commit[:12]})")


def _archive_of(path: str) -> tuple[str, str] | None:
    """The nearest folder above PATH with a raw.tar.xz (or its listing), and PATH relative to it."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    while True:
        if os.path.exists(os.path.join(folder, ARCHIVE)) or os.path.exists(os.path.join(folder, LISTING)):
            return folder, os.path.relpath(path, folder)
        parent = os.path.dirname(folder)
        if parent == folder or os.path.basename(folder) == "results":
            return None
        folder = parent


@functools.lru_cache(maxsize=4)
def _members(archive: str) -> dict[str, bytes]:
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


class ArchiveMissing(RuntimeError):
    """A file that was packed into a raw.tar.xz that is not on this machine (a fresh clone)."""


def read_bytes(path: str) -> bytes:
    """The file at PATH as the run wrote it: from the folder, else from its run folder's raw.tar.xz."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    found = _archive_of(path)
    if found is None:
        raise FileNotFoundError(path)
    folder, rel = found
    archive = os.path.join(folder, ARCHIVE)
    if os.path.exists(archive):
        members = _members(archive)
        if rel in members:
            return members[rel]
    elif any(member == rel for _, member in read_listing(folder)[1]):
        raise ArchiveMissing(f"{path} is packed into {archive}, which is not here: "
                             f"python benchmarks/raw_archive.py restore {folder}")
    raise FileNotFoundError(path)


def read_text(path: str) -> str:
    """PATH's text, from PATH or PATH.xz (decompressed), in the folder or in its raw.tar.xz."""
    for candidate in ((path,) if path.endswith(".xz") else (path, path + ".xz")):
        try:
            data = read_bytes(candidate)
        except FileNotFoundError:
            if candidate.endswith(".xz"):
                raise
            continue
        return (lzma.decompress(data) if candidate.endswith(".xz") else data).decode()
    raise FileNotFoundError(path)


def listdir(folder: str) -> list[str]:
    """The names in FOLDER, the files packed from it into its run folder's raw.tar.xz included."""
    names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    found = _archive_of(os.path.join(folder, "x"))
    if found is not None:
        run, rel = found
        sub = os.path.dirname(rel)
        try:
            _, rows = read_listing(run)
        except OSError:
            rows = []
        for _, member in rows:
            if os.path.dirname(member) == sub:
                names.add(os.path.basename(member))
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("pack", "restore", "list"))
    p.add_argument("runs", nargs="+", metavar="RUN")
    args = p.parse_args(argv)
    for run in args.runs:
        if args.action == "pack":
            pack(run)
        elif args.action == "restore":
            restore(run)
        elif not os.path.exists(os.path.join(run, LISTING)):
            print(f"{run}: nothing packed")
        else:
            commit, rows = read_listing(run)
            print(f"{run}: {len(rows)} files from commit {commit}")
            for size, rel in rows:
                print(f"{size:>10} {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
