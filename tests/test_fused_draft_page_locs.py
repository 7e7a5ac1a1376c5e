"""fused_draft_page_locs on the CPU: SGLang's real ``prepare_for_draft`` against the slot's
recompiled copy (its Triton kernel under TRITON_INTERPRET): ``out_cache_loc`` (values and
dtype), the draft pool after the prefix-tail move, and everything after the block."""

import random

import pytest
import torch

from hostsync_drivers.draft_page_locs import make_case, run_both, same
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl
from sglang_hostsync_plugin.source_edit import edit_function

EDGES = [
    dict(bs=1, topk=2, page_size=4, num_steps=1),
    dict(bs=1, topk=4, page_size=16, num_steps=3, last_page=0),  # page-aligned prefix: no tail lane
    dict(bs=3, topk=3, page_size=16, num_steps=5, last_page=15),  # the draft spills into a new page
    dict(bs=2, topk=2, page_size=2, num_steps=7, last_page=1),
    dict(bs=32, topk=4, page_size=64, num_steps=3),
    dict(bs=5, topk=8, page_size=8, num_steps=9),
]


@pytest.mark.parametrize("case", EDGES, ids=[str(c) for c in EDGES])
def test_edges_bit_identical_to_stock(case, monkeypatch):
    inputs = make_case(random.Random(str(case)), **case)
    stock, plugin = run_both(inputs, monkeypatch)
    assert plugin[0]["fused_calls"] == 1  # the fused branch ran (the comparison is not vacuous)
    assert same(stock, plugin)
    assert stock[0]["out_cache_loc"].dtype == torch.int32  # stock's gather keeps req_to_token's dtype


def test_random_batches_bit_identical_to_stock(monkeypatch):
    rng = random.Random(9)
    for i in range(25):
        case = dict(bs=rng.randint(1, 12), topk=rng.choice([2, 3, 4, 8]), page_size=rng.choice([2, 4, 16, 32, 64]),
                    num_steps=rng.randint(1, 7))
        stock, plugin = run_both(make_case(rng, **case), monkeypatch, seed=i)
        assert plugin[0]["fused_calls"] == 1 and same(stock, plugin), (i, case)


def test_the_comparison_catches_a_wrong_slot(monkeypatch):
    inputs = make_case(random.Random(4), 3, 4, 16, 3, last_page=5)
    stock, plugin = run_both(inputs, monkeypatch)
    assert same(stock, plugin)
    broken = dict(plugin[0], out_cache_loc=plugin[0]["out_cache_loc"].clone())
    broken["out_cache_loc"][2] += 1
    assert not same(stock, (broken, plugin[1]))
    untouched = make_case(random.Random(4), 3, 4, 16, 3, last_page=5)
    from hostsync_drivers import eagle_tail

    fresh = eagle_tail.make_pool(untouched["size"], 16, "cpu", 0)
    assert not eagle_tail.pools_equal(fresh, plugin[1])  # the tail really moved KV


def test_what_the_kernel_does_not_take_runs_sglangs_block(monkeypatch):
    inputs = make_case(random.Random(6), 2, 4, 16, 3)
    monkeypatch.setattr(fdl, "_INTERPRET", False)  # CPU tensors outside the interpreter: SGLang's CPU path
    stock, plugin = run_both(inputs, monkeypatch)
    assert plugin[0]["fused_calls"] == 0 and same(stock, plugin)
    inputs = make_case(random.Random(6), 2, 4, 2048, 3)  # a page over MAX_PAGE
    monkeypatch.setattr(fdl, "_INTERPRET", True)
    stock, plugin = run_both(inputs, monkeypatch)
    assert plugin[0]["fused_calls"] == 0 and same(stock, plugin)


def test_the_edit_applies_to_the_pinned_source_only():
    from sglang.srt.speculative import eagle_worker_common as ewc

    edited = edit_function(ewc.prepare_for_draft, (fdl.EDIT,), {"_hostsync_page_locs_fit": fdl.page_locs_fit,
                                                              "_hostsync_page_locs": fdl.page_locs},
                           expected_sha=fdl.PREPARE_SHA)
    # the fused call is in the recompiled code (the closure names), SGLang's block still behind it
    assert {"_hostsync_page_locs_fit", "_hostsync_page_locs"} <= set(edited.__code__.co_freevars)
    assert "duplicate_prefix_tail_to_draft_branches" in edited.__code__.co_names
    assert check_slot(fdl.SLOT) is None and fdl.pinned_sources() is None


def test_in_the_eagle_host_preset_not_default():
    from sglang_hostsync_plugin.slots.upstream_switches import HOST_PRESET

    assert HOST_PRESET in fdl.SLOT.presets and not fdl.SLOT.default


def test_inert_rule():
    eagle = dict(speculative_algorithm="EAGLE")
    assert fdl.inert(ServingFacts(**eagle, topk=4, page_size=16)) is None
    assert "topk is 1" in fdl.inert(ServingFacts(**eagle, topk=1, page_size=16))
    assert "page-size is 1" in fdl.inert(ServingFacts(**eagle, topk=4, page_size=1))
    assert "DSPARK" in fdl.inert(ServingFacts(speculative_algorithm="DSPARK", topk=4, page_size=16))


def test_applies_beside_the_audit_and_the_tail_slot():
    """The audit's draft_prep timer observes the same function (outside the recompiled copy), and
    eagle_fixed_shape_tail's hook (no longer reached on this path) is no claim on it."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16,
                         attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,fused_draft_page_locs,audit"}, facts=facts)
    for name in (fdl.NAME, "audit", "eagle_fixed_shape_tail"):
        assert plan.verdict(name).status is Status.WOULD_APPLY, plan.verdict(name)


def test_installed_in_real_sglang_beside_the_audit_and_eagle_host():
    """In a fresh interpreter with SGLang's HookRegistry: the source-edit slot, the audit's observer
    on the same function and fused_tree_compact all verify as applied, the live prepare_for_draft
    runs the recompiled copy (bit-identical to SGLang's own), and SGLang logs no stacked hooks."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, random, sys
import torch
sys.path.insert(0, "tests")
from sglang.srt.speculative import eagle_worker_common as ewc
from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl
from hostsync_drivers import draft_page_locs as drv
from hostsync_drivers import Patcher
status = {n: rt.state.statuses[n].status.value for n in
          ("fused_draft_page_locs", "fused_tree_compact", "audit", "eagle_fixed_shape_tail")}
patcher = Patcher()
case = drv.make_case(random.Random(1), 3, 4, 16, 3)
stock, plugin = drv.run_both(case, patcher, plugin_original=ewc.prepare_for_draft.__wrapped__)
patcher.setattr(ewc, "ForwardBatch", drv.InitNew)
live = drv._run(ewc.prepare_for_draft, case, drv.eagle_tail.make_pool(case["size"], 16, "cpu", 0))  # the hooked chain
print("RESULT" + json.dumps({"err": err, "status": status, "same": drv.same(stock, plugin),
      "edited": fdl.PREPARE._edited is not None and fdl.PREPARE._edited is not ewc.prepare_for_draft.__wrapped__,
      "live_same": bool(torch.equal(live["out_cache_loc"], stock[0]["out_cache_loc"]))}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit")  # the preset brings it
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None, res
    assert res["status"] == dict.fromkeys(("fused_draft_page_locs", "fused_tree_compact", "audit",
                                           "eagle_fixed_shape_tail"), "applied"), res
    assert res["same"] and res["edited"] and res["live_same"], res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout
