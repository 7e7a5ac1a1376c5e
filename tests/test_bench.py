"""The decode-loop bench runs, reduced, on the CPU and says what needs a GPU."""

import json

import pytest
import torch

from sglang_hostsync_plugin import bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reduced mode is what runs without CUDA")
def test_bench_reduced_on_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--steps", "3", "--bs", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "needs a GPU (not reported here): syncs_per_step, run_ahead_fraction" in text
    assert "paths event_ring, accept_lens_snapshot" in text
    data = json.loads(out.read_text())
    assert data["needs_gpu"] == list(bench.GPU_ONLY) and data["steps"] == 3
    rows = data["rows"]
    assert {(r["algorithm"], r["arm"]) for r in rows} == {(a, arm) for a in bench.ALGORITHMS for arm in ("stock", "plugin")}
    for r in rows:
        expected = set(bench.ALGORITHMS[r["algorithm"]]) - set(bench.GPU_PATHS)
        assert r["host_us_per_step_median"] > 0 and set(r["host_us_per_path_median"]) == expected
        assert "run_ahead_fraction" not in r  # not measured without a GPU
        slow = r["slowest_steps"]
        assert len(slow) == 3 and all(s["host_us"] >= sum(s[p] for p in expected) for s in slow)


def test_png_writer(tmp_path):
    path = tmp_path / "lead.png"
    bench._png(str(path), {"stock": [-0.1, -0.2, -0.05], "plugin": [1.9, 2.0, 2.1]}, width=40, height=20)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in data and data.endswith(b"IEND\xaeB`\x82")
