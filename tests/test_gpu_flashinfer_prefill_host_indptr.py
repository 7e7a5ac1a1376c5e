"""Slot ``flashinfer_prefill_host_indptr`` in a real SGLang 0.5.23 server with FlashInfer (STANDALONE topk 4 page
16, real acceptance, beside ``auto``'s set there, which has ``flashinfer_device_plan``): started and applied;
greedy outputs, logprobs and the real-traffic mix identical to stock; every prefill plan from host indptrs
with 0 mismatches; the audit finds no FlashInfer ``prefill.py`` ``plan()`` read-back in the slot's servers,
which the same server without the slot has at every prefill (CALL=15). Skipped without CUDA."""

from __future__ import annotations

import os
import re

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIG = "standalone-t4-p16"
BASE_SPEC = "default,flashinfer,eagle_host,-metadata_glue_graph,flashinfer_device_plan"  # auto's pick here
SLOT_SPEC = BASE_SPEC + ",flashinfer_prefill_host_indptr"
# HOSTSYNC_PREFILL_QUICK=1 (CALL=15q, for a session with little device time): stock and the two audited arms,
# 3 rounds: identity, the check line and the sync sites, no speed arms. On a fresh machine FlashInfer's JIT holds
# the first request about 280 s (2026-12-07-h100-g): 260 s of e2e budget were too few, and 300 s of ready wait
# would have been close.
QUICK = os.environ.get("HOSTSYNC_PREFILL_QUICK") == "1"
CHECK_LINE = re.compile(r"check: (\d+) prefill plans from host indptrs \((\d+) batches\), (\d+) mismatches")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from helpers import e2e_with_slot

    # `auto` (which picks BASE_SPEC here) and `default` unaudited also give the one-flag issue's row for this server.
    speed = [] if QUICK else ["--slots", "default,-audit", "--slots", "auto,-audit", "--slots", SLOT_SPEC + ",-audit"]
    return e2e_with_slot(
        tmp_path_factory.mktemp("prefill_host_indptr"), "HOSTSYNC_PREFILL_HOST_INDPTR_E2E_DIR",
        "test_gpu_flashinfer_prefill_host_indptr", None, None,
        ["--configs", CONFIG, "--attention-backend", "flashinfer", "--arms", "stock", *speed, "--slots", BASE_SPEC,
         "--slots", SLOT_SPEC, "--concurrency", "1", "8", "--rounds", "3" if QUICK else "6", "--requests", "8",
         "--max-new-tokens", "64", "--traffic-requests", "48", "--traffic-aborts", "8",
         "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "420", "--time-budget",
         "380" if QUICK else "480"],
        timeout=410 if QUICK else 510)


def _key(spec):
    return f"{CONFIG}/slots:{spec}"


def test_the_servers_started_and_the_slot_applied(e2e):
    from helpers import assert_started_and_applied

    assert_started_and_applied(e2e, _key(SLOT_SPEC), "flashinfer_prefill_host_indptr")


def test_outputs_logprobs_and_the_real_traffic_mix_identical_to_stock(e2e):
    from sglang_hostsync_plugin.e2e.run import traffic_failures

    for spec in (SLOT_SPEC,) if QUICK else (SLOT_SPEC, SLOT_SPEC + ",-audit"):
        verdict = e2e["identity"][_key(spec)]
        assert verdict["identical"] and verdict["logprobs_compared"], (spec, verdict)
        t = e2e["traffic"][_key(spec)]
        assert not t.get("errors") and t["sequential"]["identical"] and t["sequential"]["compared"] > 0, t
        assert t["after_aborts"]["identical"] and t["tokens_after_drain"] == 0 and not t.get("log_problems"), t
    assert not traffic_failures(e2e), traffic_failures(e2e)


def test_every_prefill_planned_from_host_indptrs_without_a_mismatch(e2e):
    lines = e2e["servers"][_key(SLOT_SPEC)].get("slot_checks") or []
    (line,) = [x for x in lines if x.startswith("flashinfer_prefill_host_indptr")]
    print(line)
    m = CHECK_LINE.search(line)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0 and int(m.group(3)) == 0, line


def test_the_audit_finds_no_prefill_plan_read_back_with_the_slot(e2e):
    from helpers import audited_pairs

    for _, base, mine in audited_pairs(e2e, CONFIG, BASE_SPEC, SLOT_SPEC):
        assert any("prefill.py" in site for site in base["sync_sites"]), base
        assert not [site for site in mine["sync_sites"] if "prefill.py" in site], mine
