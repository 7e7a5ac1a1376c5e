"""docs/writing-a-slot.md's third-party example, run as written: installed as a package on PYTHONPATH (its
entry point as a dist-info), the doctor checks it and refuses it once its fingerprint no longer matches."""

from __future__ import annotations

import json
import os
import re
import sys

from helpers import REPO, out, run_process, clean_env

DOC = os.path.join(REPO, "docs", "writing-a-slot.md")


def _blocks() -> dict[str, str]:
    text = open(DOC, encoding="utf-8").read()
    return dict(re.findall(r"```(python|toml)\n(.*?)```", text, flags=re.S))


def _install(tmp_path, module: str, toml: str) -> str:
    group, name, value = re.fullmatch(r'\[project\.entry-points\."([^"]+)"\]\n(\w+) = "(\w+)"\n', toml).groups()
    (tmp_path / f"{value}.py").write_text(module)
    info = tmp_path / f"{value}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {value}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n")
    return str(tmp_path)


def _doctor(path: str):
    env = clean_env(SGLANG_HOSTSYNC_SLOTS="default,example_first_decode")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    proc = run_process([sys.executable, "-m", "sglang_hostsync_plugin", "doctor", "--json"], env=env, cwd=REPO,
                       timeout=300)
    rows = {r["name"]: r for r in json.loads(proc.stdout)["slots"]} if proc.stdout.strip() else {}
    return proc, rows


def test_the_docs_example_slot_is_checked_and_would_apply(tmp_path):
    blocks = _blocks()
    proc, rows = _doctor(_install(tmp_path, blocks["python"], blocks["toml"]))
    assert proc.returncode == 0, out(proc)
    assert rows["example_first_decode"]["status"] == "would apply", rows.get("example_first_decode")


def test_the_docs_example_slot_is_refused_when_its_fingerprint_is_stale(tmp_path):
    blocks = _blocks()
    module = blocks["python"].replace('source_sha="4e9bb4d5e649e2f1"', 'source_sha="0000000000000000"')
    assert module != blocks["python"]
    proc, rows = _doctor(_install(tmp_path, module, blocks["toml"]))
    assert proc.returncode == 1, out(proc)
    assert rows["example_first_decode"]["status"] == "failed", rows.get("example_first_decode")


def test_the_docs_example_hook_logs_the_first_decode_batch_once_and_passes_through(caplog):
    from types import SimpleNamespace

    namespace: dict = {}
    exec(compile(_blocks()["python"], "hostsync_example.py", "exec"), namespace)
    hook, calls = namespace["run_batch_hook"], []

    def original(self, batch, pp_proxy_tensors=None):
        calls.append(batch)
        return f"result {len(calls)}"

    def batch(decode: bool):
        return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode), batch_size=lambda: 3)

    caplog.set_level("INFO", logger="sglang.srt.plugins.hostsync")
    results = [hook(original, None, b) for b in (batch(False), batch(True), batch(True))]
    assert results == ["result 1", "result 2", "result 3"] and len(calls) == 3
    assert [r.getMessage() for r in caplog.records] == ["example_first_decode: first decode batch, 3 requests"]


def test_the_docs_fingerprint_command_prints_the_examples_params_and_sha(capsys):
    code = re.search(r'`python -c "(.*?)"`', open(DOC, encoding="utf-8").read()).group(1)
    exec(compile(code, "doc-command", "exec"), {})
    module = _blocks()["python"]
    params, sha = capsys.readouterr().out.strip().rsplit(" ", 1)
    declared = re.search(r"params=(\(.*?\))", module).group(1)
    assert eval(declared) == eval(params) and f'source_sha="{sha}"' in module, (params, sha)
