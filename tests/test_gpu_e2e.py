"""Real servers (GPU; skipped without CUDA and SGLang's GPU stack): the plugin server
starts with every default slot applied (or skipped where its inert rule says the
server's arguments never reach it), its greedy outputs equal stock's, a
deliberately wrong slot (tests/perturb_slot) is caught by the same comparison, and
the audit counts no sync per step in EAGLE topk 4 page 16 with the plugin while it
counts stock's.

``HOSTSYNC_E2E_DIR``: check an e2e output directory made in the same device run
(scripts/gpu_run.sh, BENCHES=e2e), so the servers start once; else the test runs a
reduced e2e itself."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO
from sglang_hostsync_plugin.e2e.matrix import CONFIGS
from sglang_hostsync_plugin.slots.audit_phases import DEFAULT_PHASE_EVERY

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and a real SGLang server")

PERTURB = os.path.join(REPO, "tests", "perturb_slot")
CONFIG = "standalone-t4-p16"
PERTURB_ARM = "slots:default,perturb_kv"


@pytest.fixture(scope="module")
def e2e():
    path = os.environ.get("HOSTSYNC_E2E_DIR")
    if not path:
        path = os.path.join(os.environ.get("OUT", "/tmp"), "test_gpu_e2e")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([PERTURB, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, "-m", "sglang_hostsync_plugin.e2e", "--configs", CONFIG, "--slots",
                        "default,perturb_kv", "--concurrency", "1", "--rounds", "1", "--out", path],
                       env=env, timeout=1200, check=False)
    with open(os.path.join(path, "e2e.json")) as f:
        return json.load(f)


def test_every_server_started(e2e):
    failed = {k: s.get("error") for k, s in e2e["servers"].items() if s.get("ready_s") is None}
    assert not failed, failed


def test_plugin_status_block_has_every_default_slot_applied_or_inert(e2e):
    """Every default slot is applied (or verified upstream), except exactly those whose
    inert rule says this server's arguments never reach them."""
    from sglang_hostsync_plugin import registry
    from sglang_hostsync_plugin.e2e.matrix import CONFIGS
    from sglang_hostsync_plugin.slot import ServingFacts, inert_reason

    catalogue = registry.catalogue()
    defaults = [n for n, s in catalogue.items() if s.default]
    backend = e2e["meta"]["options"]["attention_backend"]
    for key, server in e2e["servers"].items():
        if not key.endswith("/plugin"):
            continue
        config = CONFIGS[key.split("/")[0]]
        facts = ServingFacts(speculative_algorithm=config.algorithm, topk=config.topk, page_size=config.page_size,
                             attention_backends=(backend, backend))
        block = server["status_block"]
        assert block and "SGLANG_HOSTSYNC_SLOTS='default,audit'" in block[0], block
        status = {line.split()[0]: line.split(None, 1)[1] for line in block[1:]}
        for name in defaults + ["audit"]:
            inert = inert_reason(catalogue[name], facts)
            want = (f"skipped ({inert})",) if inert else ("applied", "upstream present")
            assert status.get(name, "").startswith(want), (key, name, status.get(name))


def test_greedy_outputs_identical_to_stock(e2e):
    mine = {k: v for k, v in e2e["identity"].items() if not k.endswith(PERTURB_ARM)}
    assert mine, "no arm was compared with stock"
    assert all(v["identical"] for v in mine.values()), mine
    assert all(v["logprobs_compared"] for v in mine.values()), mine


def test_a_wrong_slot_breaks_identity(e2e):
    perturbed = {k: v for k, v in e2e["identity"].items() if k.endswith(PERTURB_ARM)}
    if not perturbed:
        pytest.skip("this e2e run has no perturbed arm")
    assert not any(v["identical"] for v in perturbed.values()), perturbed


def _status(e2e, config: str, arm: str, slot: str) -> str | None:
    """``slot``'s status word in that server's own startup status block (None: not listed)."""
    block = e2e["servers"].get(f"{config}/{arm}", {}).get("status_block") or []
    for line in block[1:]:
        words = line.split()
        if words[:1] == [slot] and len(words) > 1:
            return words[1]
    return None


def test_plugin_has_no_sync_per_step_in_topk4_page16(e2e):
    audited = [c for c in e2e["cells"] if c["config"] == CONFIG and c["audit"]]
    stock_code = [c for c in audited if c["arm"] == "audit"]
    status = {c["arm"]: _status(e2e, CONFIG, c["arm"], "eagle_fixed_shape_tail") for c in audited if c["arm"] != "audit"}
    # Every plugin server's block lists every slot: one that does not was not read, so no skip below.
    assert all(v is not None for v in status.values()), status
    plugin = [c for c in audited if status.get(c["arm"]) == "applied"]
    if not plugin:
        pytest.skip(f"this e2e run has no audited arm with eagle_fixed_shape_tail applied at {CONFIG}")
    for c in plugin:
        assert c["audit"]["steps"] > 100 and c["audit"]["syncs_per_step"] == 0, c["audit"]
    # The same audit in the stock-code arm sees SGLang's tail-copy syncs.
    for c in stock_code:
        assert c["audit"]["syncs_per_step"] > 1, c["audit"]


def test_audited_cells_attribute_host_time_by_phase(e2e):
    # The phases below are the EAGLE v2 worker's (STANDALONE and EAGLE3 run it; NGRAM does not).
    audited = [c for c in e2e["cells"] if c["audit"] and CONFIGS[c["config"]].uses_draft_model]
    assert audited, "no audited EAGLE-family cell"
    for c in audited:
        att = c["audit"]["attribution"]
        # One window in SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY (default 8) is timed; decode pairs only.
        assert att["attributed_steps"] >= max(20, c["audit"]["steps"] / (2 * DEFAULT_PHASE_EVERY)), (c["arm"], att)
        names = {r["phase"] for r in att["phases"]}
        assert {"run_batch", "verify", "draft", "schedule", "result", "other", "@clock"} <= names, names
        covered = sum(r["host_us_per_step"] for r in att["phases"] if not r["phase"].startswith("@"))
        assert covered == pytest.approx(att["window_us_per_step"], rel=1e-3)
        idle = sum(r["gpu_idle_us_per_step"] for r in att["phases"] if not r["phase"].startswith("@"))
        assert idle == pytest.approx(att["gpu_idle_us_per_step"], rel=1e-3, abs=0.5)
        clock = next(r["host_us_per_step"] for r in att["phases"] if r["phase"] == "@clock")
        print(f"{c['config']} c{c['concurrency']} {c['arm']}: phase clock {clock:.1f} us/step of a "
              f"{att['window_us_per_step']:.0f} us window ({clock / att['window_us_per_step']:.2%})")


def test_slot_self_checks_found_no_mismatch(e2e):
    """Where a run turned a slot's self-check on (e2e --plugin-env, e.g.
    SGLANG_HOSTSYNC_GLUE_CHECK), its last line counts checks and no mismatch."""
    import re

    lines = {k: s.get("slot_checks") or [] for k, s in e2e["servers"].items()}
    checked = {k: v for k, v in lines.items() if v}
    if not checked:
        pytest.skip("no slot self-check in this run")
    for server, found in checked.items():
        for line in found:
            m = re.search(r"check: (\d+) checks, (\d+) mismatches", line)
            assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, (server, line)
