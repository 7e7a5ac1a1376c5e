"""Slot ``flashinfer_device_plan`` (not registered; through the entry-point group) in a real SGLang 0.5.23
server with FlashInfer, STANDALONE topk 1 and topk 4 page 16, real acceptance: started and applied; greedy outputs,
logprobs and the real-traffic mix identical to stock; every skipped step planned on the device with no rescue;
the audit's syncs per step about one fewer than the same server without the slot (the per-step seq-lens read),
with its run-ahead printed. The kernel itself against FlashInfer's planners: tests/test_gpu_flashinfer_device_plan.py.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIGS = ("standalone-t1-p16", "standalone-t4-p16")
BASE_SPEC = "default,flashinfer,eagle_host,-metadata_glue_graph"  # what auto picks on this server
DEVICE_SPEC = BASE_SPEC + ",flashinfer_device_plan"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from helpers import e2e_with_slot

    return e2e_with_slot(
        tmp_path_factory.mktemp("device_plan_dist"), "HOSTSYNC_DEVICE_PLAN_E2E_DIR",
        "test_gpu_flashinfer_device_plan_slot",
        "flashinfer_device_plan", "hostsync_device_plan_slot",
        ["--configs", ",".join(CONFIGS), "--attention-backend", "flashinfer", "--arms", "stock", "--slots", BASE_SPEC + ",-audit",
         "--slots", DEVICE_SPEC + ",-audit", "--slots", BASE_SPEC, "--slots", DEVICE_SPEC, "--concurrency", "1", "8",
         "--rounds", "6", "--requests", "2", "--max-new-tokens", "64", "--traffic-requests", "48", "--traffic-aborts",
         "8", "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "300", "--time-budget", "450"],
        timeout=480)


def _key(config, spec):
    return f"{config}/slots:{spec}"


@pytest.mark.parametrize("config", CONFIGS)
def test_the_servers_started_and_the_slot_applied(e2e, config):
    from helpers import assert_started_and_applied

    assert_started_and_applied(e2e, _key(config, DEVICE_SPEC), "flashinfer_device_plan")


@pytest.mark.parametrize("config", CONFIGS)
def test_outputs_logprobs_and_the_real_traffic_mix_identical_to_stock(e2e, config):
    from sglang_hostsync_plugin.e2e.run import traffic_failures

    for spec in (DEVICE_SPEC, DEVICE_SPEC + ",-audit"):
        verdict = e2e["identity"][_key(config, spec)]
        assert verdict["identical"] and verdict["logprobs_compared"], (spec, verdict)
        t = e2e["traffic"][_key(config, spec)]
        assert not t.get("errors") and t["sequential"]["identical"] and t["sequential"]["compared"] > 0, t
        assert t["after_aborts"]["identical"] and t["tokens_after_drain"] == 0 and not t.get("log_problems"), t
    bad = [b for b in traffic_failures(e2e) if b.startswith(config + "/")]
    assert not bad, bad


@pytest.mark.parametrize("config", CONFIGS)
def test_every_step_planned_on_the_device_without_a_rescue(e2e, config):
    import re

    lines = e2e["servers"][_key(config, DEVICE_SPEC)].get("slot_checks") or []
    (line,) = [x for x in lines if x.startswith("flashinfer_device_plan")]
    print(line)
    m = re.search(r"check: (\d+) device plans, (\d+) rescues; (\d+) of (\d+) decode steps skipped", line)
    assert m, line
    plans, rescues, skipped, steps = map(int, m.groups())
    assert plans > 0 and rescues == 0 and skipped > 0 and steps > 0, line


@pytest.mark.parametrize("config", CONFIGS)
def test_the_audit_counts_no_seq_lens_sync_with_the_slot(e2e, config):
    cells = {(c["arm"], c["concurrency"]): c["audit"] for c in e2e["cells"] if c["config"] == config and c["audit"]}
    for conc in (1, 8):
        base, mine = cells.get((f"slots:{BASE_SPEC}", conc)), cells.get((f"slots:{DEVICE_SPEC}", conc))
        assert base and mine, sorted(cells)
        print(f"c{conc}: syncs/step {base['syncs_per_step']:.3f} -> {mine['syncs_per_step']:.3f}, run-ahead "
              f"{base.get('run_ahead_fraction')} -> {mine.get('run_ahead_fraction')}")
        assert base["steps"] > 50 and mine["steps"] > 50
        assert mine["syncs_per_step"] <= base["syncs_per_step"] - 0.9, (base, mine)  # the per-step read is gone
