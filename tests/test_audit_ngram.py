"""Slot ``audit_ngram``: the audit's phases of NGRAM steps. Its targets against SGLang 0.5.23's
code (they exist, and each is called on NGRAM's decode step), its inert rule, its composition
with the default NGRAM slots, and its timers through SGLang's HookRegistry. ``ngram_worker``
imports ``sgl_kernel``, which this CPU venv lacks: its source is read from the file, and the
HookRegistry test imports it beside a stand-in ``sgl_kernel.speculative`` (never called)."""

import json

import pytest

from helpers import LOAD_AND_STARTUP_CHECK, out, run_python
from sglang_hostsync_plugin import installer, plan as plans, registry
from sglang_hostsync_plugin.checks import check_target, read_source
from sglang_hostsync_plugin.slot import ServingFacts, Status
from sglang_hostsync_plugin.slots import audit, audit_block, audit_fine, audit_ngram, audit_phases as ph


def _facts(algorithm):
    return ServingFacts(speculative_algorithm=algorithm, topk=1, page_size=1, attention_backends=("triton", "triton"))


def test_its_targets_exist_and_time_nothing_another_audit_slot_times():
    for target in audit_ngram.SLOT.targets:
        assert check_target(target) is None, target.path
    paths = [t.path for t in audit_ngram.SLOT.targets]
    assert paths == [path for _, path in ph.NGRAM_PHASES] and len(paths) == len(set(paths))
    others = audit.SLOT.targets + audit_fine.SLOT.targets + audit_block.SLOT.targets
    assert not set(paths) & {t.path for t in others}
    assert audit_ngram.SLOT.requires == ("audit",) and not audit_ngram.SLOT.default
    assert all(t.observer for t in audit_ngram.SLOT.targets)


@pytest.mark.parametrize("algorithm,applies", [("NGRAM", True), ("STANDALONE", False), ("EAGLE", False),
                                               ("DFLASH", False), ("DSPARK", False)])
def test_it_applies_to_ngram_only_and_audit_block_to_the_dflash_family_only(algorithm, applies):
    p = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "audit,audit_ngram,audit_block"}, facts=_facts(algorithm))
    verdict = p.verdict("audit_ngram")
    if applies:
        assert verdict.status is Status.WOULD_APPLY and verdict.reason == ""
        assert p.verdict("audit_block").status is Status.SKIPPED
    else:
        assert verdict.status is Status.SKIPPED and "NGRAM" in verdict.reason, verdict


def test_beside_the_default_slots_every_target_gets_one_hook_and_nothing_fails():
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,audit,audit_fine,audit_ngram"}, facts=_facts("NGRAM"))
    assert not [v for v in plan.verdicts if v.status is Status.FAILED]
    assert plan.verdict("ngram_accept_readback").status is Status.WOULD_APPLY
    order = []
    installer.install(installer.InstallState(), plan, registry.catalogue(),
                      lambda path, hook, kind: order.append((path, hook.__qualname__)))
    assert len(order) == len({p for p, _ in order})
    assert {path for _, path in ph.NGRAM_PHASES} <= {p for p, _ in order}
    # The audit's seq_lens_resolve timer around ngram_accept_readback's hook, one registration.
    (resolve,) = [name for path, name in order if path.endswith("FutureMap.resolve_seq_lens_cpu")]
    assert resolve.startswith("hostsync[audit].") and "(hostsync[ngram_accept_readback]." in resolve


def test_every_ngram_phase_is_called_on_the_decode_step():
    """Read from the files: each timed function is called on NGRAM's verify step (a timer on a
    function the step no longer calls would read 0 without failing)."""
    step = read_source(f"{ph.NGRAM}.forward_batch_generation")
    for call in ("self._prepare_for_speculative_decoding(batch)", "move_accept_tokens_to_target_kvcache(",
                 "self._update_ngram_corpus(batch)", "eagle_sample("):
        assert call in step, call
    assert "req_drafts, mask = self._prepare_draft_tokens(batch)" in read_source(
        f"{ph.NGRAM}._prepare_for_speculative_decoding")
    draft = read_source(f"{ph.NGRAM}._prepare_draft_tokens")
    assert "self.ngram_corpus.synchronize()" in draft and "self.ngram_corpus.batch_get(" in draft
    assert "self.ngram_corpus.batch_put(" in read_source(f"{ph.NGRAM}._update_ngram_corpus")
    assert "self.ngram_corpus = NgramCorpus(" in read_source(f"{ph.NGRAM}.__init__")
    imports = open(__import__("importlib").util.find_spec("sglang.srt.speculative.ngram_worker").origin).read()
    assert "from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus" in imports
    assert "    move_accept_tokens_to_target_kvcache,\n" in imports  # by name from spec_utils: the hook rebinds it


STUB_SGL_KERNEL = """
import sys, types
stub = types.ModuleType("sgl_kernel.speculative")
stub.reconstruct_indices_from_tree_mask = None  # never called
pkg = types.ModuleType("sgl_kernel")
pkg.speculative = stub
sys.modules["sgl_kernel"], sys.modules["sgl_kernel.speculative"] = pkg, stub
"""


def test_through_sglangs_hook_registry_the_timers_record_and_pass_sglangs_work_through():
    """A fresh interpreter (load_plugins, ngram_worker importable beside the stand-in): SGLang's
    corpus update on a stand-in worker is timed as ``ngram_corpus_update`` around the corpus's
    ``batch_put`` and hands the corpus what stock's code does; ``move_accept_tokens_to_target_kvcache``
    as ngram_worker binds it is timed too; with the clock off nothing is recorded."""
    proc = run_python(STUB_SGL_KERNEL + LOAD_AND_STARTUP_CHECK + """
import json, types
from sglang_hostsync_plugin.slots import audit_phases as ph
from sglang.srt.speculative import ngram_worker as w
put = []
class Corpus:
    def batch_put(self, tokens):
        put.append(tokens)
class Req:
    def __init__(self, prompt, out):
        self.origin_input_ids_unpadded, self.output_ids = prompt, out
worker = types.SimpleNamespace(draft_token_num=4, enable_overlap=True, max_trie_depth=3, ngram_corpus=Corpus(),
                               prev_token_ids=[7, 8, 0, 0, 9, 0, 0, 0], prev_accept_lens=[2, 1])
worker._efficient_concat_last_n = lambda a, b, n: w.NGRAMWorker._efficient_concat_last_n(worker, a, b, n)
batch = types.SimpleNamespace(reqs=[Req([1, 2, 3, 4], [5]), Req([6], [])], grammar_needs_sync=lambda: False)
ph.arm(thread_id=None)
clock = ph.clock()
w.NGRAMWorker._update_ngram_corpus(worker, batch)
try:  # the name as ngram_worker binds it; stand-in arguments, so SGLang's body raises inside the timer
    w.move_accept_tokens_to_target_kvcache(None, None, None, None)
except Exception:
    pass
segs = clock.take()
ph.time_windows(False)
w.NGRAMWorker._update_ngram_corpus(worker, batch)
after = clock.take()
ph.disarm()
print("RESULT" + json.dumps({"err": err, "phases": [p for p, _, _ in segs], "put": put, "after": len(after),
      "status": rt.state.statuses["audit_ngram"].status.value}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="audit,audit_ngram", TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["phases"] == ["ngram_corpus_update", "ngram_kv_move"] and res["after"] == 0, res
    # Stock's splice: the last 3 of prompt + output + the accepted tokens not yet in output_ids.
    assert res["put"] == [[[4, 5, 7, 8][-3:], [6, 9]]] * 2, res


@pytest.mark.parametrize("algorithm,slot", [("NGRAM", "audit_ngram"), ("DFLASH", "audit_block"),
                                            ("DSPARK", "audit_block"), ("STANDALONE", None)])
def test_the_doctor_names_the_slot_that_times_the_step_the_audit_would_not(algorithm, slot, capsys, monkeypatch):
    import sglang_hostsync_plugin.doctor as doctor

    def hints(spec):
        monkeypatch.setenv("SGLANG_HOSTSYNC_SLOTS", spec)
        assert doctor.main(["doctor", "--json", "--speculative-algorithm", algorithm,
                            "--attention-backend", "triton"]) == 0
        return json.loads(capsys.readouterr().out)["hints"]

    # An NGRAM server also gets the ngram_host preset's hint where its slots are off
    # (tests/test_upstream_slots.py); selected here, only the audit's hint is left.
    base = "default,ngram_host" if algorithm == "NGRAM" else "default"
    got = hints(f"{base},audit")
    if slot is None:
        assert got == []
    else:
        (hint,) = got
        assert hint.startswith(f"{slot} is not selected") and f"SGLANG_HOSTSYNC_SLOTS={base},audit,{slot}" in hint
    assert hints(f"{base},audit,{slot or 'audit_fine'}") == [] and hints(base) == []
