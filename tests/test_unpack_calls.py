"""benchmarks/unpack_calls.py over fake device-call outputs: what lands in the results folder."""

import importlib.util
import io
import json
import os
import tarfile

from helpers import REPO

_spec = importlib.util.spec_from_file_location("unpack_calls", os.path.join(REPO, "benchmarks", "unpack_calls.py"))
unpack_calls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unpack_calls)


def _call(root, name, files, test_dir=None):
    """A device call's files_at: NAME.tar.xz holding hostsync-NAME/<files>, and a GPU test's folder."""
    os.makedirs(root)
    with tarfile.open(os.path.join(root, f"{name}.tar.xz"), "w:xz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"hostsync-{name}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if test_dir:
        os.makedirs(os.path.join(root, test_dir))
        for rel, text in {"e2e.md": "# t", "e2e.json": json.dumps({"meta": {"date": "D", "command": "python -m x"}}),
                          "a__stock.log": "log", "a__stock.trace.tsv": "trace"}.items():
            with open(os.path.join(root, test_dir, rel), "w") as f:
                f.write(text)
    return str(root)


def test_each_calls_reports_and_logs_land_under_the_calls_name(tmp_path, capsys):
    first = _call(tmp_path / "3", "triton", {
        "digest.txt": "185d996c02507075\n", "gpu.txt": "NVIDIA H100 80GB HBM3\n",
        "run/e2e/e2e.md": "# e2e", "run/e2e/e2e.png": "png",
        "run/e2e/e2e.json": json.dumps({"meta": {"date": "D1", "command": "python -m sglang_hostsync_plugin.e2e --configs ngram-p1",
                                                 "stopped": "interrupted (signal 15)"}}),
        "gpu_run.log": "start\n[e2e 04:54:06] interrupted (signal 15): reporting\ngpu_run rc 1\n",
        "gpu_tests.log": "........\n8 passed in 16.37s\ngpu tests rc 0\n"})
    second = _call(tmp_path / "5", "dflash_graph", {"gpu_tests.log": "1 failed, 4 passed in 125.86s\ngpu tests rc 1\n"},
                   test_dir="test_gpu_dflash_step_graph")
    out = tmp_path / "results"
    assert unpack_calls.main([str(out), first, second]) == 0
    assert sorted(os.listdir(out)) == [
        "dflash_graph-gpu_tests.log", "dflash_graph.tar.xz", "test_gpu_dflash_step_graph-e2e.json",
        "test_gpu_dflash_step_graph-e2e.md", "test_gpu_dflash_step_graph-servers.tar.xz", "triton-e2e.json",
        "triton-e2e.md", "triton-e2e.png", "triton-gpu_tests.log", "triton.tar.xz"]
    with tarfile.open(out / "test_gpu_dflash_step_graph-servers.tar.xz") as tar:
        assert tar.getnames() == ["test_gpu_dflash_step_graph/a__stock.log"]  # traces left out
    printed = capsys.readouterr().out
    for line in ("triton: digest 185d996c02507075", "triton: D1: python -m sglang_hostsync_plugin.e2e --configs ngram-p1",
                 "triton: stopped: interrupted (signal 15)", "triton: gpu_run rc 1", "triton: 8 passed in 16.37s",
                 "dflash_graph: 1 failed, 4 passed in 125.86s", "test_gpu_dflash_step_graph: D: python -m x"):
        assert line in printed, (line, printed)


def test_the_same_gpu_test_in_two_calls_keeps_both(tmp_path, capsys):
    first = _call(tmp_path / "3", "plan_t1", {"gpu_tests.log": "4 passed\n"}, test_dir="test_gpu_plan")
    second = _call(tmp_path / "4", "plan_8b", {"gpu_tests.log": "1 failed, 3 passed\n"}, test_dir="test_gpu_plan")
    out = tmp_path / "results"
    assert unpack_calls.main([str(out), first, second]) == 0
    names = sorted(os.listdir(out))
    for kept in ("test_gpu_plan-e2e.md", "test_gpu_plan-servers.tar.xz", "plan_8b-test_gpu_plan-e2e.md",
                 "plan_8b-test_gpu_plan-servers.tar.xz"):
        assert kept in names, names
    assert "plan_8b-test_gpu_plan: D: python -m x" in capsys.readouterr().out


def test_a_folder_without_a_call_archive_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert unpack_calls.main([str(tmp_path / "out"), str(tmp_path / "empty")]) == 2
