"""dflash_step_graph (not registered yet) in a real DFlash server: the e2e benchmark's ``dflash-p16``
(random-weight checkpoints with a DFlash draft: real acceptance) with stock, ``default`` and
``default,dflash_step_graph``, the slot's eager self-check on (``SGLANG_HOSTSYNC_STEP_GRAPH_CHECK``,
read as eagle_step_graph reads it), c1 and c4, 2 rounds. The servers start and the slot reads
applied; greedy token ids are identical to stock in both plugin arms (no logprobs in the identity
pass: a logprob request keeps its steps eager); the self-check counts checks and no mismatch; the
audit's host work per step is lower with the slot than with ``default`` at both concurrencies.

The slot is not in the catalogue: the e2e and its servers get it through an entry-point package on
``PYTHONPATH`` (``helpers.write_slot_dist``). ``HOSTSYNC_DFLASH_GRAPH_E2E_DIR``: check an e2e output
directory made by the same command instead of starting the servers here. DFlash's worker needs
FlashInfer's sampling module at start (``.device-bundle-fi`` on the offline device, docs/gpu.md).

Skipped without CUDA (CI); run by scripts/gpu_run.sh."""

import re

import pytest
import torch

from sglang_hostsync_plugin.slots import dflash_step_graph as dsg
from sglang_hostsync_plugin.slots import eagle_step_graph as es

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIG = "dflash-p16"
BASE_SPEC = "default"
GRAPH_SPEC = "default,dflash_step_graph"
CHECK_EVERY = 16  # replayed steps per eager check (a checked step does both: keeps the host figure honest)
CHECK_LINE = r"check: (\d+) checks, (\d+) mismatches"


def _arm(spec):
    return f"slots:{spec}"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from helpers import e2e_with_slot

    return e2e_with_slot(tmp_path_factory.mktemp("dflash_graph_dist"), "HOSTSYNC_DFLASH_GRAPH_E2E_DIR",
                         "test_gpu_dflash_step_graph", dsg.NAME, "hostsync_dflash_graph_slot",
                         ["--configs", CONFIG, "--arms", "stock", "--slots", BASE_SPEC, "--slots", GRAPH_SPEC,
                          "--concurrency", "1", "4", "--rounds", "2", "--traffic", "off", "--top-logprobs", "0",
                          "--plugin-env", f"{es.ENV_CHECK}={CHECK_EVERY}",
                          "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "300",
                          "--time-budget", "420"], timeout=540)


def test_the_dflash_servers_started_and_the_slot_applied(e2e):
    from helpers import assert_started_and_applied

    assert_started_and_applied(e2e, f"{CONFIG}/{_arm(GRAPH_SPEC)}", dsg.NAME)


def test_greedy_outputs_are_identical_to_stock(e2e):
    for spec in (BASE_SPEC, GRAPH_SPEC):
        verdict = e2e["identity"][f"{CONFIG}/{_arm(spec)}"]
        assert verdict["identical"] and verdict["prompts"] > 0, (spec, verdict)
        distinct = e2e["servers"][f"{CONFIG}/{_arm(spec)}"].get("distinct_tokens")
        print(f"{spec}: greedy ids identical to stock over {verdict['prompts']} prompts ({distinct} distinct tokens)")


def test_the_self_check_found_no_mismatch(e2e):
    lines = e2e["servers"][f"{CONFIG}/{_arm(GRAPH_SPEC)}"].get("slot_checks") or []
    (line,) = [x for x in lines if x.startswith(dsg.NAME)]
    m = re.search(CHECK_LINE, line)
    assert m, line
    checks, mismatches = map(int, m.groups())
    print(line)
    assert checks > 0 and mismatches == 0, line


def test_host_work_per_step_is_lower_than_defaults(e2e):
    cells = {(c["arm"], c["concurrency"]): c for c in e2e["cells"] if c["config"] == CONFIG}
    for conc in (1, 4):
        base, mine = cells.get((_arm(BASE_SPEC), conc)), cells.get((_arm(GRAPH_SPEC), conc))
        assert base and mine and base["audit"] and mine["audit"], sorted(cells)
        b, g = base["audit"], mine["audit"]
        print(f"dflash c{conc}: host work {b['host_work_us_per_step']:.0f} -> {g['host_work_us_per_step']:.0f} us/step "
              f"({g['host_work_us_per_step'] / b['host_work_us_per_step']:.2f}x default's), syncs/step "
              f"{b['syncs_per_step']:.3f} -> {g['syncs_per_step']:.3f}, run-ahead {b['run_ahead_fraction']} -> "
              f"{g['run_ahead_fraction']}, accept length {base['accept_length']} -> {mine['accept_length']}, "
              f"tok/s/user {base['tok_s_user_median']:.1f} -> {mine['tok_s_user_median']:.1f}")
        assert b["steps"] > 50 and g["steps"] > 50
        assert g["host_work_us_per_step"] < b["host_work_us_per_step"], (b["attribution"], g["attribution"])
