"""dspark_dp_meta on a CUDA device: identical values, no syncs, and the WAR guard,
with the stager's copies issued from Python and from csrc.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from hostsync_drivers.dp_meta import (NoWaitStager, compare_stock_and_plugin, make_batch, make_forward_batch, make_proposer,
                           plugin_classes, random_case)
from sglang_hostsync_plugin.staging import TwoSlotStager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def test_gpu_random_inputs_bit_identical(nnp_enabled, staging_impl):
    _, cls, make_nnp = plugin_classes()
    rng = random.Random(31468)
    for _ in range(300):
        compare_stock_and_plugin(random_case(rng), nnp_enabled, cls, make_nnp, DEV)


def test_gpu_no_sync_and_no_allocation_in_steady_state(nnp_enabled, staging_impl):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEV)
    rng = random.Random(1)
    batches = [make_batch([rng.randint(0, 64) for _ in range(16)], [rng.randint(0, 8) for _ in range(16)])
               for _ in range(1000)]
    fbs = [make_forward_batch(32, DEV, make_nnp) for _ in range(1010)]
    for i in range(10):  # warm-up: allocates the stager once
        p._fill_dp_moe_sync_metadata(fbs[1000 + i], batches[i])
    torch.cuda.synchronize()
    assert p._hs_stager.impl == staging_impl
    torch.cuda.set_sync_debug_mode("error")
    try:
        for fb, b in zip(fbs, batches):
            p._fill_dp_moe_sync_metadata(fb, b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert p._hs_stager.allocations == 1
    assert fbs[-11].global_num_tokens_gpu.tolist() == [4 * x for x in batches[-1].global_num_tokens]
    assert p._num_token_non_padded.tolist() == [32]


def test_gpu_fills_do_not_wait_for_a_busy_device(nnp_enabled, staging_impl):
    """Sync-debug mode sees only torch's syncs; csrc's copies are raw CUDA calls. Two
    fills (one per slot) behind ~50 ms of device work must return with it still running."""
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEV)
    fbs = [make_forward_batch(32, DEV, make_nnp) for _ in range(3)]
    p._fill_dp_moe_sync_metadata(fbs[0], make_batch([1, 2], [1, 1]))  # allocates
    torch.cuda.synchronize()
    busy = torch.cuda.Event()
    torch.cuda._sleep(100_000_000)
    busy.record()
    p._fill_dp_moe_sync_metadata(fbs[1], make_batch([3, 4], [1, 2]))
    p._fill_dp_moe_sync_metadata(fbs[2], make_batch([5, 6], [2, 2]))
    still_busy = not busy.query()
    torch.cuda.synchronize()
    assert still_busy, "a fill waited for the device"
    assert p._hs_stager.blocking_waits == 0
    assert fbs[1].global_num_tokens_gpu.tolist() == [12, 16] and fbs[2].global_num_tokens_gpu.tolist() == [20, 24]


def _war_stress(stager_cls, impl, fills=10_000, dp=8, sleep_cycles=400_000):
    _, cls, make_nnp = plugin_classes()
    p = make_proposer(cls, DEV, per_req=1, logprob_per_req=1)
    p._hs_stager = stager_cls(rows=2, scalar=True, impl=impl)
    rng = random.Random(7)
    counts = [([rng.randint(0, 1 << 20) for _ in range(dp)], [rng.randint(0, 1 << 20) for _ in range(dp)])
              for _ in range(fills)]
    batches = [make_batch(gnt, lp, coordination=True) for gnt, lp in counts]
    expected = torch.tensor(counts, dtype=torch.int64)
    seen = torch.empty((fills, 2, dp), dtype=torch.int64, device=DEV)
    fb = make_forward_batch(8, DEV, make_nnp)
    for i in range(fills):
        torch.cuda._sleep(sleep_cycles)  # ~200 us of device work per fill: the host runs ahead
        p._fill_dp_moe_sync_metadata(fb, batches[i])
        seen[i, 0].copy_(fb.global_num_tokens_gpu)  # the delayed device reader
        seen[i, 1].copy_(fb.global_num_tokens_for_logprob_gpu)
    torch.cuda.synchronize()
    mismatches = int((seen.cpu() != expected).any(dim=(1, 2)).sum())
    return mismatches, p._hs_stager.blocking_waits


def test_gpu_war_stress_zero_mismatches(staging_impl):
    mismatches, waits = _war_stress(TwoSlotStager, staging_impl)
    print(f"WAR stress ({staging_impl}) with event guard: mismatches={mismatches} blocking_waits={waits}")
    assert mismatches == 0
    assert waits > 0, "the device never lagged: the stress did not exercise the guard"


def test_gpu_war_stress_detects_hazard_without_the_wait(staging_impl):
    mismatches, _ = _war_stress(NoWaitStager, staging_impl)
    print(f"WAR stress ({staging_impl}) without event guard: mismatches={mismatches}")
    assert mismatches > 0, "the stress test cannot see the hazard it guards against"


def test_gpu_auto_stages_from_python_while_csrc_builds_then_switches(tmp_path):
    """A cold extension cache in a fresh process: a stager made before the slot's prepare
    stages from Python (starting the load itself), prepare returns within AUTO_WAIT_S, and
    every stage reads back exactly its rows and scalar before, during and after the switch."""
    code = textwrap.dedent("""
        import logging, random, time
        logging.basicConfig(level=logging.INFO)
        import torch
        from sglang_hostsync_plugin import csrc, staging
        from sglang_hostsync_plugin.staging import TwoSlotStager

        rng = random.Random(0)
        stager = TwoSlotStager(rows=2, scalar=True)
        dst = torch.zeros(1, dtype=torch.int32, device="cuda")

        def stage():
            rows = [[rng.randrange(1 << 40) for _ in range(7)] for _ in range(2)]
            value = rng.randrange(1 << 30)
            out = stager.stage("cuda", *rows, scalar_into=dst, scalar_value=value)
            assert [r.tolist() for r in out] == rows and dst.item() == value

        prebuild = csrc.start_prebuild(("h2d_stage",))
        stage()  # the first allocation: auto chose csrc, not loaded yet
        assert stager.impl == "python" and stager._csrc_pending
        t0 = time.perf_counter()
        note = staging.prepare_staging("target_dp_meta", True)
        print(f"PREPARE {time.perf_counter() - t0:.2f} s: {note}", flush=True)
        assert "still building" in note, note
        n = 1
        while stager._stage_op is None and n < 100000:
            stage()
            n += 1
            time.sleep(0.01)
        assert csrc.wait_loaded("h2d_stage", 600) and stager.impl == "cuda" and staging._impl == "cuda"
        for _ in range(200):
            stage()
        assert prebuild.wait(600) == 0
        print(f"SWITCHED after {n} Python stages, {time.perf_counter() - t0:.1f} s", flush=True)
    """)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    env.pop("SGLANG_HOSTSYNC_STAGING_IMPL", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    print(proc.stdout + "\n".join(line for line in proc.stderr.splitlines() if "hostsync" in line))
    assert proc.returncode == 0 and "SWITCHED" in proc.stdout, (proc.stdout + proc.stderr)[-6000:]
    assert "serves from now on" in proc.stderr
