"""The decode-loop bench runs, reduced, on the CPU and says what needs a GPU."""

import json

import pytest
import torch

import importlib.util
import os

from helpers import REPO

_spec = importlib.util.spec_from_file_location("bench_decode_loop", os.path.join(REPO, "benchmarks", "bench_decode_loop.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reduced mode is what runs without CUDA")
def test_bench_reduced_on_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--steps", "3", "--bs", "1", "--repeats", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "needs a GPU (not reported here): syncs_per_step, run_ahead_fraction" in text
    assert "paths event_ring, accept_lens_snapshot, pinned_d2h_ring" in text
    data = json.loads(out.read_text())
    assert data["needs_gpu"] == list(bench.GPU_ONLY) and data["steps"] == 3
    rows = data["rows"]
    assert {(r["algorithm"], r["arm"]) for r in rows} == {(a, arm) for a in bench.ALGORITHMS for arm in ("stock", "plugin")}
    for r in rows:
        expected = set(bench.ALGORITHMS[r["algorithm"]]) - set(bench.GPU_PATHS)
        assert r["host_us_per_step_median"] > 0 and set(r["host_us_per_path_median"]) == expected
        assert len(r["host_us_per_step_median_runs"]) == 2
        assert "run_ahead_fraction" not in r  # not measured without a GPU
        slow = r["slowest_steps"]
        assert len(slow) == 3 and all(s["host_us"] >= sum(s[p] for p in expected) for s in slow)


def test_merge_repeats_reports_the_median_run_and_the_worst_run_ahead():
    runs = [{"host_us_per_step_median": h, "run_ahead_fraction": f, "syncs_per_step": 0.0,
             "allowlisted_per_step": a, "tag": t}
            for h, f, a, t in ((300.0, 1.0, 0.0, "a"), (100.0, 0.99, 1.0, "b"), (200.0, 1.0, 0.0, "c"))]
    row = bench.merge_repeats(runs)
    assert row["tag"] == "c" and row["host_us_per_step_median_runs"] == [300.0, 100.0, 200.0]
    assert row["run_ahead_fraction"] == 0.99 and row["allowlisted_per_step"] == 1.0


def test_png_writer(tmp_path):
    path = tmp_path / "lead.png"
    bench.line_plot(str(path), {"stock": [-0.1, -0.2, -0.05], "plugin": [1.9, 2.0, 2.1]}, width=40, height=20)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in data and data.endswith(b"IEND\xaeB`\x82")


def test_abba_interleaves_and_collects_every_run():
    from hostsync_drivers import abba

    calls = []
    out = abba({"a": lambda: calls.append("a") or len(calls), "b": lambda: calls.append("b") or len(calls)}, 4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert out == {"a": [1, 4, 5, 8], "b": [2, 3, 6, 7]}
