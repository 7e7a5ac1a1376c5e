"""The decode-loop bench runs, reduced, on the CPU and says what needs a GPU."""

import argparse
import json

import pytest
import torch

import importlib.util
import os
import re

from helpers import REPO, free_port_base

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


_pspec = importlib.util.spec_from_file_location("profile_step_kernels", os.path.join(REPO, "benchmarks", "profile_step_kernels.py"))
prof = importlib.util.module_from_spec(_pspec)
_pspec.loader.exec_module(prof)


def _kineto_steps(n_steps: int) -> list[dict]:
    """A Kineto-shaped trace: per step one graph launch (3 kernels, graph id 7), two eager kernels
    (one runtime launch, one Triton driver launch), one H2D copy; the GPU is idle 10 µs per step."""
    ev, corr, t = [], 0, 0.0
    for _ in range(n_steps):
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5, "args": {"correlation": corr}})
        for k in range(3):
            ev.append({"ph": "X", "cat": "kernel", "name": f"gemm{k}", "ts": t + 10 * k, "dur": 10,
                       "args": {"correlation": corr, "graph id": 7}})
        t += 30
        for name, api in (("index_kernel", "cudaLaunchKernel"), ("_fused_triton", "cuLaunchKernelEx")):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime" if api.startswith("cuda") else "cuda_driver", "name": api,
                       "ts": t, "dur": 3, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": 4, "args": {"correlation": corr}})
            t += 4
        corr += 1
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": t, "dur": 2,
                   "args": {"correlation": corr}})
        t += 2 + 10
    return ev


def test_profile_reduction_splits_graph_and_eager_time_per_step():
    f = prof.reduce_trace(_kineto_steps(5), steps=99)
    assert f["steps"] == 5 and f["steps_source"] == "most-launched graph"  # not the asked-for 99
    assert f["graph_kernels_per_step"] == 3 and f["graph_kernel_us_per_step"] == 30
    assert f["eager_kernels_per_step"] == 2 and f["eager_kernel_us_per_step"] == 8
    assert f["copies_per_step"] == 1 and f["copy_us_per_step"] == 2
    assert f["gpu_busy_us_per_step"] == 40 and f["graph_launches_per_step"] == 1
    # 5 steps of 50 µs, less the idle tail after the last copy
    assert f["span_us_per_step"] == (5 * 50 - 10) / 5 and f["gpu_idle_us_per_step"] == (5 * 50 - 10 - 200) / 5
    assert [k["name"] for k in f["eager_kernels"]] == ["_fused_triton", "index_kernel"]
    assert f["eager_kernels"][0]["per_step"] == 1


def test_profile_reduction_uses_the_launch_call_without_graph_ids():
    ev = _kineto_steps(4)
    for e in ev:
        (e.get("args") or {}).pop("graph id", None)
    f = prof.reduce_trace(ev, steps=4)
    assert f["steps_source"] == "profiler num_steps" and f["graph_kernels_per_step"] == 3
    assert f["eager_kernels_per_step"] == 2
    assert "no GPU events" in prof.reduce_trace([e for e in ev if e["cat"] not in prof.GPU_CATS], 4)["error"]


@pytest.mark.parametrize("after", ["0", "40", "90"])
def test_profile_refuses_a_start_outside_the_request(after, capsys):
    with pytest.raises(SystemExit):
        prof.main(["--profile-tokens", "40", "--profile-after", after, "--dry-run"])
    assert "--profile-after" in capsys.readouterr().err


def test_profile_run_against_fake_servers(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "prof"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t1-p16", "--arms", "stock",
            "--slots", "default,-audit", "--steps", "6", "--profile-tokens", "40", "--profile-after", "25", "--out", str(out),
            "--port", str(free_port_base(2))]
    assert prof.main(argv) == 0
    res = json.loads((out / "profile.json").read_text())
    assert set(res) == {"standalone-t1-p16/stock", "standalone-t1-p16/slots:default,-audit"}
    for f in res.values():
        assert f["steps"] == 6 and f["eager_kernels_per_step"] == 1 and f["graph_kernel_us_per_step"] == 50
        assert f["gpu_idle_us_per_step"] == (600 - 20 - 6 * 70) / 6 and not f["request_errors"]
    assert (out / "standalone-t1-p16__stock.gpu.tsv.xz").exists() and not list((out / "traces").rglob("*.gz"))
    assert "`eager_add`" in (out / "profile.md").read_text()
    for log in ("standalone-t1-p16__stock.log", "standalone-t1-p16__slots_default_-audit.log"):
        at = re.search(r"profile started at streamed tokens ([\d,]+)\n", (out / log).read_text())
        assert at and 25 <= int(at.group(1)) < 40, log  # after --profile-after tokens, while the request streams


def test_profile_starts_once_every_concurrent_request_streamed(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "prof"
    argv = ["--server-module", "fake_sglang_server", "--weights", "dummy", "--configs", "standalone-t1-p16", "--arms", "stock",
            "--steps", "4", "--profile-tokens", "400", "--profile-after", "60", "--profile-requests", "3",
            "--out", str(out), "--port", str(free_port_base(1))]
    assert prof.main(argv) == 0
    res = json.loads((out / "profile.json").read_text())
    assert not res["standalone-t1-p16/stock"]["request_errors"]
    at = re.search(r"profile started at streamed tokens ([\d,]+)\n", (out / "standalone-t1-p16__stock.log").read_text())
    counts = [int(v) for v in at.group(1).split(",")]
    # The fake server starts the three 0.1 s (50 tokens) apart: each must be past 60, all still streaming.
    assert len(counts) == 3 and all(60 <= c < 400 for c in counts), counts
    with pytest.raises(SystemExit):
        prof.main(["--profile-requests", "0", "--dry-run"])


_cspec = importlib.util.spec_from_file_location("compare_kernels", os.path.join(REPO, "benchmarks", "compare_kernels.py"))
cmp_kernels = importlib.util.module_from_spec(_cspec)
_cspec.loader.exec_module(cmp_kernels)


def test_compare_kernels_reads_a_profile_folder(tmp_path, capsys):
    # Two arms' per-event files as profile_step_kernels writes them (4 steps): the other arm swaps a
    # 30 µs radix select for a 10 µs kernel, and its attention calls sit later in the request.
    def trace(rows):
        return prof._tsv([(t, d, cat, name, False, "", None) for t, d, cat, name in rows])

    steps = 4
    base = [(10.0 * i, 30.0, "kernel", "mbtopk::radix") for i in range(steps)] + \
        [(100.0 + i, 5.0 + i, "kernel", "_fwd_kernel") for i in range(steps)] + [(0.0, 9.0, "gpu_memcpy", "Memcpy")]
    other = [(10.0 * i, 10.0, "kernel", "_block_topk_kernel") for i in range(steps)] + \
        [(100.0 + i, 7.0 + i, "kernel", "_fwd_kernel") for i in range(steps)]
    for arm, rows in (("stock", base), ("slots_default_eagle_host_-audit", other)):
        (tmp_path / f"cfg__{arm}.gpu.tsv.xz").write_bytes(trace(rows))
    (tmp_path / "profile.json").write_text(json.dumps({"cfg/stock": {"steps": steps},
                                                       "cfg/slots:default,eagle_host,-audit": {"steps": steps}}))
    assert cmp_kernels.main([str(tmp_path), "cfg"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "all kernels µs/step: stock 36.5, slots_default_eagle_host_-audit 18.5"  # copies are not kernels
    assert out[1] == "stock: _fwd_kernel µs, first 4 calls mean 6.5, last 4 mean 6.5"
    rows = {line.rsplit("| ", 1)[1]: line for line in out if line.count("|") == 3 and "kernel (" not in line}
    assert rows["mbtopk::radix"].split("|")[2].strip() == "-30.0" and rows["_block_topk_kernel"].split("|")[2].strip() == "+10.0"
    assert rows["_fwd_kernel"].split("|")[2].strip() == "+2.0"
    assert any(line.startswith("stock: softmax / top-k kernels µs per step: mbtopk 30.0,") for line in out)
    (tmp_path / "profile.json").write_text(json.dumps({"cfg/stock": {"steps": steps}, "cfg/slots:default,eagle_host,-audit": {"steps": 5}}))
    with pytest.raises(SystemExit):
        cmp_kernels.main([str(tmp_path), "cfg"])  # windows of different lengths are not compared per step


def _pyspy():
    spec = importlib.util.spec_from_file_location("pyspy_schedulers", os.path.join(REPO, "benchmarks", "pyspy_schedulers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pyspy_report(tmp_path, capsys, config, arm, chunks, step, window=(9.0, 12.0), **opts):
    """``pyspy_schedulers.py report`` over one arm's py-spy chunks (monotonic span -> collapsed stacks),
    its timed window and a decode step of ``step`` µs at concurrency 1 (accept length 2); its output."""
    sub = f"{config}__{arm.replace(':', '_')}"
    (tmp_path / sub).mkdir()
    for span, lines in chunks.items():
        (tmp_path / sub / f"{span}.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "arms.tsv").write_text(f"{config}\t{arm}\t1\t{sub}\n")
    rows = [{"config": config, "arm": arm, "concurrency": 1, "t_start": window[0], "t_end": window[1],
             "load": {"accept_length": 2.0, "tok_s_user_median": 2e6 / step}}]
    (tmp_path / "e2e.json").write_text(json.dumps({"rows": rows}))
    ns = dict(folder=str(tmp_path), e2e_json=str(tmp_path / "e2e.json"), concurrency=1, top=5, callers=[], depth=3,
              under=[]) | opts
    assert _pyspy().report(argparse.Namespace(**ns)) == 0
    return capsys.readouterr().out


def test_pyspy_report_keeps_the_timed_windows_and_splits_waits_from_work(tmp_path, capsys):
    loop = "thread (7): MainThread;run (scheduler.py:1);event_loop_overlap (scheduler.py:2)"
    chunks = {  # monotonic span -> collapsed stacks (py-spy raw)
        "10.000-11.000": [f"{loop};process_batch_result (scheduler.py:3);Event.synchronize (torch/cuda/streams.py:254) 60",
                          f"{loop};run_batch (scheduler.py:4);prepare (eagle_utils.py:9) 30",
                          f"{loop};Scheduler.on_idle (scheduler.py:5) 10",
                          "thread (8): Watchdog;sleep (w.py:1) 500"],  # another thread: left out
        "11.000-12.000": [f"{loop};run_batch (scheduler.py:4);prepare (eagle_utils.py:9) 100"],
        "20.000-21.000": [f"{loop};run_batch (scheduler.py:4);other (x.py:1) 999"],  # outside every window
    }
    out = _pyspy_report(tmp_path, capsys, "cfg", "slots:x", chunks, 8000, window=(9.5, 12.5))
    # 200 main-thread samples in the two chunks inside the window; a step is 3 / 375 s = 8000 µs;
    # host work = (130 run_batch) / 200 = 65% -> 5200 µs per step.
    assert "| cfg/slots:x | 200 (2) | 8000 | 0.0% | 30.0% | 0.0% | 5.0% | 65.0% | 5200 |" in out
    assert "| `eagle_utils.py:9 (prepare)` | 65.0 |" in out and "x.py" not in out and "w.py" not in out


def test_pyspy_report_lists_the_working_samples_through_a_frame_by_caller(tmp_path, capsys):
    loop = "thread (7): MainThread;run (scheduler.py:1)"
    walk = "mambaish_config (configs/hybrid_arch.py:{})"
    lines = [f"{loop};verify (eagle_worker_common.py:736);commit (spec_utils.py:1025);{walk.format(147)} 30",
             f"{loop};verify (eagle_worker_common.py:736);commit (spec_utils.py:1025);{walk.format(149)};getattr (c.py:5) 20",
             f"{loop};prepare (forward_batch_info.py:1853);{walk.format(147)} 10",
             f"{loop};wait (x.py:1);mambaish_config (configs/hybrid_arch.py:147);Event.synchronize (torch/cuda/streams.py:254) 40",
             f"{loop};other (y.py:2) 100"]
    out = _pyspy_report(tmp_path, capsys, "cfg", "stock", {"10.000-11.000": lines}, 8000, callers=["mambaish_config"],
                        depth=1).split("## Working samples through `mambaish_config`", 1)[1]
    # 200 samples; the waiting one (40) is left out: 60 working samples through the walk = 2400 µs.
    assert "- cfg/stock: 2400.0 in all" in out
    assert "  - 2000.0: `mambaish_config (configs/hybrid_arch.py) <- commit (spec_utils.py:1025)`" in out
    assert "  - 400.0: `mambaish_config (configs/hybrid_arch.py) <- prepare (forward_batch_info.py:1853)`" in out


def test_pyspy_report_counts_ngrams_step_wait_and_lists_the_work_under_a_frame(tmp_path, capsys):
    loop = "thread (7): MainThread;run (scheduler.py:1);run_batch (scheduler.py:4704)"
    fwd = "forward_batch_generation (speculative/ngram_worker.py:{})"
    prep = f"{fwd.format(430)};_prepare_for_speculative_decoding (speculative/ngram_worker.py:{{}})"
    lines = [  # py-spy names methods without their class here: "synchronize", not "Stream.synchronize"
        f"{loop};resolve_seq_lens_cpu (managers/overlap_utils.py:639);synchronize (torch/cuda/streams.py:108) 300",
        f"{loop};{prep.format(334)};draft_tokens_hook (sglang_hostsync_plugin/slots/ngram_late_wait.py:139);"
        "finish (sglang_hostsync_plugin/slots/ngram_late_wait.py:117);synchronize (torch/cuda/streams.py:108) 200",
        f"{loop};{prep.format(335)} 30",
        f"{loop};{prep.format(356)};full_mask (sglang_hostsync_plugin/slots/ngram_full_mask.py:95) 20",
        f"{loop};{fwd.format(437)};forward_batch_generation (managers/tp_worker.py:675) 40",
        f"{loop};{fwd.format(479)} 10",
        "thread (7): MainThread;run (scheduler.py:1);process_batch_result (scheduler.py:3);"
        "synchronize (torch/cuda/streams.py:254) 100",
        "thread (7): MainThread;run (scheduler.py:1);other (y.py:2) 300"]
    out = _pyspy_report(tmp_path, capsys, "ngram", "p", {"10.000-11.000": lines}, 10000, depth=2,
                        under=["forward_batch_generation (speculative/ngram_worker.py"])
    # 1000 samples: 500 in the step wait (at the resolve or at the late wait), 100 in the result wait.
    assert "| ngram/p | 1000 (1) | 10000 | 50.0% | 10.0% | 0.0% | 0.0% | 40.0% | 4000 |" in out
    under = out.split("## Working samples under `forward_batch_generation (speculative/ngram_worker.py`", 1)[1]
    # The working samples below the worker's forward (the waits left out): 100 of 1000 = 1000 µs per step.
    assert "- ngram/p: 1000.0 in all" in under
    assert ("  - 400.0: `forward_batch_generation (speculative/ngram_worker.py:437) > "
            "forward_batch_generation (managers/tp_worker.py:675)`") in under
    assert ("  - 300.0: `forward_batch_generation (speculative/ngram_worker.py:430) > "
            "_prepare_for_speculative_decoding (speculative/ngram_worker.py:335)`") in under
    assert ("  - 200.0: `forward_batch_generation (speculative/ngram_worker.py:430) > "
            "_prepare_for_speculative_decoding (speculative/ngram_worker.py:356) > "
            "full_mask (sglang_hostsync_plugin/slots/ngram_full_mask.py:95)`") in under
    assert "  - 100.0: `forward_batch_generation (speculative/ngram_worker.py:479)`" in under
    assert "ngram_late_wait.py" not in under


def test_ramp_pace_lists_each_prefill_with_its_start_lead_and_catch_up(tmp_path, capsys):
    from sglang_hostsync_plugin.slots.audit import TraceStep, format_trace_line

    spec = importlib.util.spec_from_file_location("ramp_pace", os.path.join(REPO, "benchmarks", "ramp_pace.py"))
    pace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pace)
    # A prefill (step 0) finishes 4 ms before the first decode launch; the host takes 5 ms per step
    # against the GPU's 7 ms, so each lead gains 2 ms. A second prefill (step 5) has no decode step
    # after it within the trace.
    steps = [TraceStep(0, 0.000, 0.006, False, 9000.0, ())]
    for k in range(1, 5):
        t = 0.010 + (k - 1) * 0.005
        steps.append(TraceStep(k, t, 0.006 + k * 0.007, True, 5000.0, ()))
    steps.append(TraceStep(5, 0.040, 0.041, False, 100.0, ()))
    ramps = pace.ramps(steps, 2)
    assert len(ramps) == 1 and ramps[0]["prefill"] == 0
    assert ramps[0]["start_lead_ms"] == pytest.approx(-4.0)
    got = [(s["gap_ms"], s["cpu_ms"], s["lead_ms"]) for s in ramps[0]["steps"]]
    assert got == [(pytest.approx(5.0), 5.0, pytest.approx(-2.0)), (pytest.approx(5.0), 5.0, pytest.approx(0.0))]
    trace = tmp_path / "t.tsv"
    trace.write_text("#hostsync-audit-trace v3\n" + "".join(format_trace_line(s) for s in steps))
    assert pace.main([str(trace), "--steps", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["prefill      0 at      0.00 s  start   -4.0 ms | 5.0/5.0/-2.0 5.0/5.0/+0.0 5.0/5.0/+2.0"]


def test_startup_log_facts_tell_a_takeover_after_ready_from_a_load_before(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_startup", os.path.join(REPO, "benchmarks", "bench_startup.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    head = [
        "[2026-12-04 08:36:01] hostsync: building csrc eagle_tail.cu in the background, or loading it (pid 7)",
        "[2026-12-04 08:37:10 TP0] hostsync: eagle_fixed_shape_tail prepared in 1.0 s: csrc/eagle_tail.cu still "
        "building after 1.0 s (the launcher's prebuild); the fallback serves until it is loaded",
        "[2026-12-04 08:37:12] The server is fired up and ready to roll!",
    ]
    tail = [
        "hostsync prebuild: csrc/eagle_tail.cu ready (52.4 s)",
        "[2026-12-04 08:37:13 TP0] hostsync: eagle_fixed_shape_tail: csrc/eagle_tail.cu loaded 3.1 s after "
        "its load began (background thread); it serves from now on",
    ]
    cold = tmp_path / "cold.log"
    cold.write_text("\n".join(head + tail) + "\n")
    facts = bench.log_facts(str(cold))
    assert facts["build_started"] == 1 and facts["build_results"] == ["eagle_tail ready"]
    assert not facts["build_done_before_ready"] and facts["switched_after_ready"] == ["eagle_tail"]
    assert facts["prepared"][0].startswith("eagle_fixed_shape_tail prepared in 1.0 s: csrc/eagle_tail.cu still")
    warm = tmp_path / "warm.log"
    warm.write_text("\n".join([head[0], tail[0], head[1].replace("still building", "loaded in 0.1 s, not"), head[2]]))
    facts = bench.log_facts(str(warm))
    assert facts["build_done_before_ready"] and facts["switched_after_ready"] == []


def test_startup_extra_arms_are_unaudited_e2e_arms():
    """bench_startup's ``--slots`` arms name what the e2e calls them (the audit left out), so their
    ready times are found in e2e.json."""
    from sglang_hostsync_plugin.e2e import matrix

    spec = importlib.util.spec_from_file_location("bench_startup", os.path.join(REPO, "benchmarks", "bench_startup.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for given in ("default,eagle_host", "default,eagle_host,audit", "default,eagle_host,-audit"):
        value = bench.extra_arm(given)
        assert value == "default,eagle_host,-audit"
        arm = matrix.parse_arms("stock", [value])[1]
        assert arm.name == f"slots:{value}" and not arm.audited and arm.slots == "default,eagle_host"
    with pytest.raises(SystemExit):
        bench.extra_arm("audit")
    assert bench.fmt_delta(70.5, 68.0) == "70.5 s (+2.5 s against stock)" and bench.fmt_delta(None, 68.0) == "failed"


def test_startup_takes_no_difference_to_a_server_restarted_alone():
    """A server the e2e restarted by itself (it lost SGLang's KV-sizing memory race in the shared start;
    H100 2026-12-06) started without contention: its ready time is shown, never a difference to stock's."""
    spec = importlib.util.spec_from_file_location("bench_startup", os.path.join(REPO, "benchmarks", "bench_startup.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    c, extra = bench.CONFIG, "default,eagle_host,-audit"
    servers = {f"{c}/stock": {"ready_s": 93.2}, f"{c}/{bench.ARM}": {"ready_s": 91.3},
               f"{c}/slots:{extra}": {"ready_s": 72.6, "restarted_alone": "kill_process_tree called"}}
    got = bench.ready_times(servers, [extra])
    assert got["plugin_minus_stock_s"] == pytest.approx(-1.9) and not got["plugin_restarted_alone"]
    assert got["extra"][extra] == (72.6, True)
    assert bench.fmt_delta(72.6, 93.2, alone=True) == "72.6 s (restarted alone: not comparable)"
    servers[f"{c}/{bench.ARM}"]["restarted_alone"] = "x"
    got = bench.ready_times(servers, [extra])
    assert got["plugin_minus_stock_s"] is None and got["plugin_restarted_alone"]


def test_plugin_load_report_takes_each_arm_against_no_plugin():
    spec = importlib.util.spec_from_file_location("bench_plugin_load", os.path.join(REPO, "benchmarks", "bench_plugin_load.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    env = bench._env(bench.NO_PLUGIN)
    assert env["SGLANG_PLUGINS"] == "no-such-plugin" and "SGLANG_ENABLE_HOSTSYNC_PLUGIN" not in env
    assert "SGLANG_PLUGINS" not in bench._env(bench.DISABLED)
    env = bench._env("default,eagle_host", plan="{}")
    assert env["SGLANG_HOSTSYNC_SLOTS"] == "default,eagle_host" and env["SGLANG_HOSTSYNC_PLAN"] == "{}"

    def launcher(total, load, setup=None):
        return {"import launch_server": 3.0, "load_plugins": load, "prepare_server_args": 0.5, "import http_server": 1.0,
                "total": total, "setup_s": setup}

    def scheduler(total, rss=None):
        return {"import scheduler": 5.0, "load_plugins": 0.1, "total": total, "rss_mb": rss}

    arms = [bench.NO_PLUGIN, bench.DISABLED, "default"]
    samples = {("launcher", bench.NO_PLUGIN): [launcher(6.0, 0.0), launcher(6.4, 0.0), launcher(9.0, 0.0)],
               ("launcher", bench.DISABLED): [launcher(6.5, 2.0)],
               ("launcher", "default"): [launcher(7.0, 2.5, 2.2), launcher(7.4, 2.7, 2.4)],
               ("scheduler", bench.NO_PLUGIN): [scheduler(6.0)],
               ("scheduler", bench.DISABLED): [scheduler(6.3)],
               ("scheduler", "default"): [scheduler(6.5, 900.0), scheduler(6.7, 1000.0)]}
    lines = bench.report(samples, arms)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in lines if line.startswith("| ") and not line.startswith("| arm") and not line.startswith("| ---")}
    # launcher medians: no plugin 6.4, default 7.2 (+0.80), its set-up 2.30; then the scheduler table
    launcher_rows = lines[:lines.index("### scheduler")]
    default_launcher = next(line for line in launcher_rows if line.startswith("| default |"))
    assert [c.strip() for c in default_launcher.split("|")[2:-1]] == ["3.00", "2.60", "0.50", "1.00", "7.20", "+0.80", "-", "2.30"]
    assert rows["default"][-3:] == ["+0.60", "950", "-"]  # the scheduler table's row (read last)
    assert "### detokenizer" not in lines  # a kind without samples is left out


def _auto_verdicts():
    spec = importlib.util.spec_from_file_location("auto_verdicts", os.path.join(REPO, "benchmarks", "auto_verdicts.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_auto_verdicts_say_which_runs_auto_picks_differently_today(tmp_path, capsys, monkeypatch):
    """A run where auto had no row (it ran default) against today's row for that server, read from the
    server's own launch command; a run that picked today's set says so. Today's rows stand in (by topk)."""
    av = _auto_verdicts()
    seen = []

    def pick(facts):
        seen.append((facts.speculative_algorithm, facts.topk, facts.page_size))
        return av.choice.Choice("x", "default,eagle_step_graph" if facts.topk == 1 else "default,eagle_host", None)

    monkeypatch.setattr(av.choice, "pick", pick)
    rows = [{"config": c, "concurrency": 1, "arm": a, "round": r, "errors": [],
             "load": {"requests": 1, "tok_s_user_median": v, "tok_s_total": v, "accept_length": 1.5,
                      "tok_s_user_all": [v]}}
            for c in ("standalone-t1-p1", "eagle3-t4-p16") for a, v in (("stock", 100), ("slots:auto,-audit", 101))
            for r in range(2)]
    args = {"standalone-t1-p1": "--speculative-algorithm STANDALONE --speculative-eagle-topk 1 --page-size 1",
            "eagle3-t4-p16": "--speculative-algorithm EAGLE3 --speculative-eagle-topk 4 --page-size 16"}
    picked = {"standalone-t1-p1": "default", "eagle3-t4-p16": "default,eagle_host"}
    result = {"meta": {"arm_slots": {"stock": None, "slots:auto,-audit": "auto"}}, "rows": rows,
              "identity": {}, "traffic": {}, "servers": {
                  f"{c}/slots:auto,-audit": {
                      "command": f"SGLANG_HOSTSYNC_SLOTS=auto /usr/bin/python3 -m sglang.launch_server --model-path /m "
                                 f"--attention-backend triton --speculative-num-steps 3 --speculative-num-draft-tokens 4 "
                                 f"{args[c]} --enable-hostsync-plugin",
                      "status_block": [f"  auto: x; pin it with SGLANG_HOSTSYNC_SLOTS={picked[c]}"]} for c in args}}
    (tmp_path / "e2e.json").write_text(json.dumps(result))
    by = {v["config"]: av.today_cell(v) for v in av.verdicts(str(tmp_path / "e2e.json"))}
    assert by == {"standalone-t1-p1": "`default,eagle_step_graph` (not run here)", "eagle3-t4-p16": "the same"}
    assert sorted(seen) == [("EAGLE3", 4, 16), ("STANDALONE", 1, 1)]  # the facts of each server's own arguments
    assert av.main([str(tmp_path)]) == 0
    assert "| `default,eagle_step_graph` (not run here) |" in capsys.readouterr().out


def test_auto_verdicts_matrix_takes_the_newest_run_of_todays_pick_per_cell(tmp_path, capsys, monkeypatch):
    """--matrix: per cell and concurrency the newest run whose auto arm ran today's pick (an older run with
    another pick and an older run of the same pick are passed over); a cell no run covers says so."""
    av = _auto_verdicts()
    monkeypatch.setattr(av.choice, "pick", lambda facts: av.choice.Choice("x", "default,eagle_step_graph", None))

    def run(folder, date, picked, auto_tok_s, asleep=""):
        rows = [{"config": "standalone-t1-p1", "concurrency": c, "arm": a, "round": r, "errors": [],
                 "load": {"requests": 1, "tok_s_user_median": v, "tok_s_total": v, "accept_length": 1.5,
                          "tok_s_user_all": [v]}}
                for c in (1, 8) for a, v in (("stock", 100), ("slots:auto,-audit", auto_tok_s)) for r in range(2)]
        command = ("SGLANG_HOSTSYNC_SLOTS=auto python3 -m sglang.launch_server --model-path /m --attention-backend "
                   "triton --speculative-algorithm STANDALONE --speculative-eagle-topk 1 --page-size 1 "
                   f"--speculative-num-steps 3 --speculative-num-draft-tokens 4 {asleep}--enable-hostsync-plugin")
        result = {"meta": {"date": date, "arm_slots": {"stock": None, "slots:auto,-audit": "auto"}}, "rows": rows,
                  "identity": {}, "traffic": {}, "servers": {"standalone-t1-p1/slots:auto,-audit": {
                      "command": command, "status_block": [f"  auto: x; pin it with SGLANG_HOSTSYNC_SLOTS={picked}"]}}}
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "e2e.json").write_text(json.dumps(result))

    run("a", "2026-12-07T10:00:00+00:00", "default,eagle_step_graph", 110)
    run("b", "2026-12-07T12:00:00+00:00", "default,eagle_step_graph", 120)
    run("c", "2026-12-07T14:00:00+00:00", "default", 130)
    assert av.main([str(tmp_path / f) for f in "abc"] + ["--matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [x for x in lines if x.startswith("| standalone-t1-p1 | triton |")]
    assert len(cells) == 2 and all("| b/e2e.json (idle arms spinning) |" in x and "| 1.200 (1.200) |" in x
                                   for x in cells), cells
    assert "| standalone-t1-p16 | triton | 1 | not run (runs with an older pick: none) |" in lines
    run("d", "2026-12-08T10:00:00+00:00", "default,eagle_step_graph", 125, asleep="--sleep-on-idle ")
    assert av.main([str(tmp_path / f) for f in "abcd"] + ["--matrix"]) == 0
    cells = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| standalone-t1-p1 | triton |")]
    assert all("| d/e2e.json | " in x and "| 1.250 (1.250) |" in x for x in cells), cells
    assert len([x for x in lines if x.startswith("| ") and "| --- " not in x]) == 1 + 2 * len(av.MATRIX)
