"""Slot ``flashinfer_device_plan`` in a real SGLang 0.5.23
server with FlashInfer, STANDALONE topk 1 and topk 4 page 16, real acceptance: started and applied; greedy outputs,
logprobs and the real-traffic mix identical to stock; every skipped step planned on the device with no rescue;
the audit finds no ``resolve_seq_lens_cpu`` synchronize in the slot's servers, which the same server without
the slot has every step; on a target whose GPU step outlasts the host's (``HOSTSYNC_DEVICE_PLAN_SHAPE=
llama-8b-bigram``, CALL=14b) the run-ahead at c1 is at least 0.99. The kernel itself against FlashInfer's
planners: tests/test_gpu_flashinfer_device_plan.py. Skipped without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIGS = tuple(os.environ.get("HOSTSYNC_DEVICE_PLAN_CONFIGS", "standalone-t1-p16,standalone-t4-p16").split(","))
SHAPE = os.environ.get("HOSTSYNC_DEVICE_PLAN_SHAPE", "small")  # the e2e's checkpoint shape
GPU_BOUND = {"llama-8b-bigram"}  # shapes whose GPU step outlasts the host's work (run-ahead can show)
BASE_SPEC = "default,flashinfer,eagle_host,-metadata_glue_graph"  # what auto picks on this server
DEVICE_SPEC = BASE_SPEC + ",flashinfer_device_plan"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from helpers import e2e_with_slot

    # Five 15 GB servers do not fit one 80 GB card: the 8B-shaped target drops the unaudited base arm (8c's four).
    speed_base = [] if SHAPE in GPU_BOUND else ["--slots", BASE_SPEC + ",-audit"]
    return e2e_with_slot(
        tmp_path_factory.mktemp("device_plan_dist"), "HOSTSYNC_DEVICE_PLAN_E2E_DIR",
        "test_gpu_flashinfer_device_plan_slot", None, None,
        ["--configs", ",".join(CONFIGS), "--checkpoint-shape", SHAPE, "--attention-backend", "flashinfer", "--arms",
         "stock", *speed_base, "--slots", DEVICE_SPEC + ",-audit", "--slots", BASE_SPEC,
         "--slots", DEVICE_SPEC, "--concurrency", "1", "8",
         "--rounds", "6", "--requests", "2", "--max-new-tokens", "64", "--traffic-requests", "48", "--traffic-aborts",
         "8", "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "420", "--time-budget", "450"],
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
def test_the_audit_finds_no_seq_lens_read_with_the_slot(e2e, config):
    from helpers import audited_pairs

    for conc, base, mine in audited_pairs(e2e, config, BASE_SPEC, DEVICE_SPEC):
        reads = [site for site in mine["sync_sites"] if "resolve_seq_lens_cpu" in site]
        assert not reads and any("resolve_seq_lens_cpu" in site for site in base["sync_sites"]), (base, mine)
        if conc == 1 and SHAPE in GPU_BOUND:
            assert mine["run_ahead_fraction"] >= 0.99, mine
