"""Slot ``audit_block``: the audit's phases of DFlash and DSpark steps. Its targets against
SGLang 0.5.23's code (they exist, and each is called on its family's decode path), its inert
rule, its composition with the default slots, and its timers through SGLang's HookRegistry."""

import inspect
import json

import pytest

from helpers import LOAD_AND_STARTUP_CHECK, out, run_python
from sglang_hostsync_plugin import installer, plan as plans, registry
from sglang_hostsync_plugin.checks import check_target
from sglang_hostsync_plugin.slot import ServingFacts, Status
from sglang_hostsync_plugin.slots import audit, audit_block, audit_fine, audit_phases as ph


def test_its_targets_exist_and_time_nothing_the_audit_or_audit_fine_times():
    for target in audit_block.SLOT.targets:
        assert check_target(target) is None, target.path
    assert [t.path for t in audit_block.SLOT.targets] == [path for _, path in ph.BLOCK_PHASES]
    paths = [path for _, path in ph.BLOCK_PHASES]
    assert len(paths) == len(set(paths))
    assert not set(paths) & {t.path for t in audit.SLOT.targets + audit_fine.SLOT.targets}
    assert audit_block.SLOT.requires == ("audit",) and not audit_block.SLOT.default
    assert all(t.observer for t in audit_block.SLOT.targets)  # timing only: each composes with a slot's hook


@pytest.mark.parametrize("algorithm,applies", [("DFLASH", True), ("DSPARK", True), ("STANDALONE", False),
                                               ("EAGLE3", False), ("NGRAM", False)])
def test_it_applies_to_the_dflash_family_only(algorithm, applies):
    facts = ServingFacts(speculative_algorithm=algorithm, topk=1, page_size=16, attention_backends=("triton", "triton"))
    verdict = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "audit,audit_block"}, facts=facts).verdict("audit_block")
    if applies:
        assert verdict.status is Status.WOULD_APPLY and verdict.reason == ""
    else:
        assert verdict.status is Status.SKIPPED and "DFlash family" in verdict.reason, verdict


@pytest.mark.parametrize("algorithm", ["DFLASH", "DSPARK"])
def test_beside_the_default_slots_every_target_gets_one_hook_and_nothing_fails(algorithm):
    facts = ServingFacts(speculative_algorithm=algorithm, topk=1, page_size=16, attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,audit,audit_block"}, facts=facts)
    assert not [v for v in plan.verdicts if v.status is Status.FAILED]
    assert plan.verdict("audit_block").status is Status.WOULD_APPLY
    order = []
    installer.install(installer.InstallState(), plan, registry.catalogue(),
                      lambda path, hook, kind: order.append((path, hook.__qualname__)))
    assert len(order) == len({p for p, _ in order})  # one registration per function
    hooked = {p for p, _ in order}
    assert {path for _, path in ph.BLOCK_PHASES} <= hooked


def _source(obj) -> str:
    return inspect.getsource(obj)


def test_every_block_phase_is_called_on_its_familys_decode_step():
    """A timer on a function the step no longer calls would read 0 without failing: each target is
    called from the step function (or, named, from what it calls) in SGLang 0.5.23's source."""
    from sglang.srt.speculative import dflash_worker_v2 as dw
    from sglang.srt.speculative.dspark_components import dspark_draft, dspark_worker_v2 as sw

    step = _source(dw.DFlashWorkerV2.forward_batch_generation)
    for call in ("verify_input.prepare_for_verify(", "self._accept_block(", "self._make_next_draft_input_decode(",
                 "self._append_target_hidden_to_draft_kv_by_loc(", "self.draft_model_runner.forward("):
        assert call in step, call
    assert "verify_input = DFlashVerifyInput(" in step
    assert "apply_dflash_simulated_acceptance(" in _source(dw.DFlashWorkerV2._accept_block)

    assert "self._forward_decode(" in _source(sw.DSparkWorkerV2.forward_batch_generation)
    decode = _source(sw.DSparkWorkerV2._forward_decode)
    for call in ("self._proposer.propose(", "self._stage_target_verify_metadata(", "self._verify_planner.schedule_layout(",
                 "self._verify_executor.run_compact(", "self._verify_executor.run_non_compact(",
                 "self._verify_executor.accept_and_finalize(", "self._verify_executor.commit_hidden(",
                 "make_next_draft_input(", "self._verify_executor.begin_simulated_step()"):
        assert call in decode, call
    init = _source(sw.DSparkWorkerV2.__init__)
    for made in ("self._proposer = DraftBlockProposer(", "self._verify_planner = DSparkVerifyPlanner(",
                 "self._verify_executor = TargetVerifyExecutor("):
        assert made in init, made
    assert sw.make_next_draft_input is dspark_draft.make_next_draft_input  # imported by name: the hook rebinds it
    assert "self.draft_model_runner.forward(" in _source(dspark_draft.DraftBlockProposer)


def test_through_sglangs_hook_registry_the_timers_record_and_return_sglangs_results():
    """A fresh interpreter (load_plugins): DFlash's and DSpark's next-draft-input builders, one a
    method and one a function the DSpark worker imported by name, are timed as ``block_next_input``
    and return what SGLang's own code returns; with the clock off they only pass through."""
    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, torch
from sglang_hostsync_plugin.slots import audit_phases as ph
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2
from sglang.srt.speculative.dspark_components import dspark_worker_v2 as sw
bonus, lens = torch.tensor([5, 7]), torch.tensor([10, 20])
want = make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=lens)
def same(a):
    return bool(torch.equal(a.bonus_tokens, want.bonus_tokens) and torch.equal(a.new_seq_lens, want.new_seq_lens))
ph.arm(thread_id=None)
clock = ph.clock()
got = [DFlashWorkerV2._make_next_draft_input_decode(None, bonus_tokens=bonus, new_seq_lens=lens),
       sw.make_next_draft_input(bonus_tokens=bonus, new_seq_lens=lens)]
segs = clock.take()
ph.time_windows(False)
passing = sw.make_next_draft_input(bonus_tokens=bonus, new_seq_lens=lens)
after = clock.take()
ph.disarm()
print("RESULT" + json.dumps({"err": err, "phases": [p for p, _, _ in segs], "same": [same(g) for g in got + [passing]],
                             "after": len(after), "status": rt.state.statuses["audit_block"].status.value}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="audit,audit_block", TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["phases"] == ["block_next_input", "block_next_input"], res
    assert res["same"] == [True, True, True] and res["after"] == 0, res


def test_it_is_reported_undone_when_the_phase_clock_is_off(monkeypatch):
    import os

    monkeypatch.setenv(ph.ENV_PHASES, "0")  # the slots' prechecks read the process env
    facts = ServingFacts(speculative_algorithm="DFLASH", topk=1, page_size=16, attention_backends=("triton", "triton"))
    verdict = plans.resolve({**os.environ, "SGLANG_HOSTSYNC_SLOTS": "audit,audit_block"}, facts=facts).verdict("audit_block")
    assert verdict.status is Status.WOULD_APPLY and verdict.reason.startswith("undone: ") and ph.ENV_PHASES in verdict.reason
