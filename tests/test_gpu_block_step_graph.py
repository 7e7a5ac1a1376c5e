"""dflash_step_graph and dspark_step_graph in real servers: the e2e benchmark's
``dflash-p16`` / ``dspark-p16`` (random-weight "small-bigram" checkpoints, whose block drafts accept;
DSpark in static verify, SGLang's default, its Markov and confidence heads zero; real acceptance) with
stock, ``default`` and ``default,<slot>``, the slot's eager self-check on
(``SGLANG_HOSTSYNC_STEP_GRAPH_CHECK``, read as eagle_step_graph reads it; it also compares the committed
draft-KV rows), c1 and c4, 2 rounds. The servers start and the slot reads applied and replays steps;
greedy token ids are identical to stock in both plugin arms (no logprobs in the identity pass: a
logprob request keeps its steps eager); greedy ids depend on the target alone, so a draft-side fault
(stale committed draft-KV rows, a bad bonus relay, a wrong draft req_to_token, stale draft block ids)
shows only in the acceptance: the slot arm's mean accept length at c1 equals ``default``'s and stock's
within ``ACCEPT_TOL``; the self-check counts checks and no mismatch; the audit's host work per step is
lower with the slot than with ``default`` at both concurrencies. Where the slot is not applied or
replayed nothing, the assertion carries its "stayed eager" (and "no step graph" / capture failure)
lines from the server log. ``-k dflash`` / ``-k dspark``: one algorithm.

Timeouts, for a fresh machine (cold FlashInfer JIT ~78 s, then the DFlash servers' start: 252 s on an
H200): servers ready within 420 s, rounds within a 480 s budget, the e2e stopped at 560 s (it then
reports the rounds that finished: ``helpers.e2e_with_slot``). ``--disable-prefill-cuda-graph`` in every
arm (the decode path is unchanged).

``HOSTSYNC_DFLASH_GRAPH_E2E_DIR`` /
``HOSTSYNC_DSPARK_GRAPH_E2E_DIR``: check an e2e output directory made by the same command instead of
starting the servers here. The DFlash family's workers need FlashInfer's sampling module at start
(``.device-bundle-fi`` on the offline device, docs/gpu.md).

Skipped without CUDA (CI); run by scripts/gpu_run.sh."""

import os
import re
from dataclasses import dataclass

import pytest
import torch

from sglang_hostsync_plugin.slots import dflash_step_graph, dspark_step_graph
from sglang_hostsync_plugin.slots import eagle_step_graph as es

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The block drafts of the e2e's "small" checkpoints are random and accept nothing (an H100, 2026-12-07:
# accept length 1.00 in every arm); "small-bigram"'s are built to accept (e2e/checkpoints.py).
SHAPE = "small-bigram"
BASE_SPEC = "default"
CHECK_EVERY = 16  # replayed steps per eager check (a checked step does both: keeps the host figure honest)
CHECK_LINE = r"check: (\d+) checks, (\d+) mismatches"
ACCEPT_TOL = 0.02  # mean accept length, absolute (an H200 run: 3.01 in every arm)


@dataclass(frozen=True)
class Case:
    algo: str
    slot: str
    config: str

    @property
    def graph_spec(self) -> str:
        return f"default,{self.slot}"

    @property
    def reuse_var(self) -> str:
        return f"HOSTSYNC_{self.algo.upper()}_GRAPH_E2E_DIR"

    @property
    def run_name(self) -> str:
        return f"test_gpu_{self.slot}"


CASES = (Case("dflash", dflash_step_graph.NAME, "dflash-p16"), Case("dspark", dspark_step_graph.NAME, "dspark-p16"))


def _arm(spec):
    return f"slots:{spec}"


@pytest.fixture(scope="module", params=CASES, ids=[c.algo for c in CASES])
def case(request) -> Case:
    return request.param


@pytest.fixture(scope="module")
def e2e(case, tmp_path_factory):
    from helpers import e2e_with_slot

    return e2e_with_slot(tmp_path_factory.mktemp(f"{case.algo}_graph_dist"), case.reuse_var, case.run_name, None, None,
                         ["--configs", case.config, "--checkpoint-shape", SHAPE, "--arms", "stock", "--slots", BASE_SPEC,
                          "--slots", case.graph_spec, "--concurrency", "1", "4", "--rounds", "2", "--traffic", "off",
                          "--top-logprobs", "0", "--plugin-env", f"{es.ENV_CHECK}={CHECK_EVERY}",
                          "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "420",
                          "--time-budget", "480"], timeout=560)


def slot_log(case, e2e) -> list[str]:
    """The slot's lines in its server's log (the e2e keeps the log beside e2e.json)."""
    out = os.environ.get(case.reuse_var) or os.path.join(os.environ.get("OUT", "/tmp"), case.run_name)
    name = e2e["servers"].get(f"{case.config}/{_arm(case.graph_spec)}", {}).get("log")
    if not name or not os.path.exists(os.path.join(out, name)):
        return [f"(no server log {name!r} in {out})"]
    with open(os.path.join(out, name), errors="replace") as f:
        return [line.strip() for line in f if f"hostsync: {case.slot}: " in line]


def why_eager(case, e2e) -> str:
    """The slot's reasons for SGLang's step: "stayed eager" counts, "no step graph", failed captures."""
    keys = ("stayed eager", "no step graph", "failed", "eager step from now on", "dropping")
    lines = [x for x in slot_log(case, e2e) if any(k in x for k in keys)]
    return "why the steps stayed eager (server log):\n" + "\n".join(lines[-40:] or ["(no such line)"])


def cells(case, e2e) -> dict:
    return {(c["arm"], c["concurrency"]): c for c in e2e["cells"] if c["config"] == case.config}


def test_the_servers_started_and_the_slot_applied_and_replayed(case, e2e):
    from helpers import assert_started_and_applied

    try:
        assert_started_and_applied(e2e, f"{case.config}/{_arm(case.graph_spec)}", case.slot)
    except (AssertionError, KeyError, StopIteration) as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}\n{why_eager(case, e2e)}") from exc
    replayed = [int(m.group(1)) for m in map(re.compile(rf"hostsync: {case.slot}: (\d+) steps replayed").search,
                                                slot_log(case, e2e)) if m]
    print(why_eager(case, e2e))
    assert replayed and max(replayed) > 0, why_eager(case, e2e)


def test_greedy_outputs_are_identical_to_stock(case, e2e):
    for spec in (BASE_SPEC, case.graph_spec):
        verdict = e2e["identity"][f"{case.config}/{_arm(spec)}"]
        assert verdict["identical"] and verdict["prompts"] > 0, (spec, verdict)
        distinct = e2e["servers"][f"{case.config}/{_arm(spec)}"].get("distinct_tokens")
        print(f"{spec}: greedy ids identical to stock over {verdict['prompts']} prompts ({distinct} distinct tokens)")


def test_the_accept_length_at_c1_is_defaults_and_stocks(case, e2e):
    """Greedy ids come from the target alone; a draft-side fault lowers the acceptance only."""
    by_arm = cells(case, e2e)
    arms = ("stock", _arm(BASE_SPEC), _arm(case.graph_spec))
    got = {arm: (by_arm.get((arm, 1)) or {}).get("accept_length") for arm in arms}
    print(f"{case.algo} c1 accept length: {got}")
    assert None not in got.values(), (got, sorted(by_arm))
    # At an accept length near 1 a draft-side fault could not lower it: the comparison would show nothing.
    assert got["stock"] > 1.2, f"stock's draft accepts too little to compare: {got}"
    mine = got[_arm(case.graph_spec)]
    for arm in ("stock", _arm(BASE_SPEC)):
        assert abs(mine - got[arm]) <= ACCEPT_TOL, (got, why_eager(case, e2e))


def test_the_self_check_found_no_mismatch(case, e2e):
    lines = e2e["servers"][f"{case.config}/{_arm(case.graph_spec)}"].get("slot_checks") or []
    mine = [x for x in lines if x.startswith(case.slot)]
    assert len(mine) == 1, (lines, why_eager(case, e2e))
    (line,) = mine
    m = re.search(CHECK_LINE, line)
    assert m, line
    checks, mismatches = map(int, m.groups())
    print(line)
    assert checks > 0, (line, why_eager(case, e2e))
    assert mismatches == 0, line


def test_host_work_per_step_is_lower_than_defaults(case, e2e):
    by_arm = cells(case, e2e)
    for conc in (1, 4):
        base, mine = by_arm.get((_arm(BASE_SPEC), conc)), by_arm.get((_arm(case.graph_spec), conc))
        assert base and mine and base["audit"] and mine["audit"], sorted(by_arm)
        b, g = base["audit"], mine["audit"]
        print(f"{case.algo} c{conc}: host work {b['host_work_us_per_step']:.0f} -> {g['host_work_us_per_step']:.0f} "
              f"us/step ({g['host_work_us_per_step'] / b['host_work_us_per_step']:.2f}x default's), syncs/step "
              f"{b['syncs_per_step']:.3f} -> {g['syncs_per_step']:.3f}, run-ahead {b['run_ahead_fraction']} -> "
              f"{g['run_ahead_fraction']}, accept length {base['accept_length']} -> {mine['accept_length']}, "
              f"tok/s/user {base['tok_s_user_median']:.1f} -> {mine['tok_s_user_median']:.1f}")
        assert b["steps"] > 50 and g["steps"] > 50
        assert g["host_work_us_per_step"] < b["host_work_us_per_step"], (b["attribution"], g["attribution"])
