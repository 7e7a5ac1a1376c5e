"""chain_tree_full_mask on the CPU (its kernel under ``TRITON_INTERPRET``): the topk 1 verify tree
with the full mask, bit-identical to SGLang's ``build_tree_kernel_efficient`` running SGLang's own
Triton tree kernel (the path it takes on XPU; on the CPU box the CUDA kernel is not there) on
random batches: mask buffer (uint8, bool) with and without the fill, a mask SGLang allocates,
int32 and int64 lengths and tokens, one draft step to seven, stale buffer cells. What it leaves to
SGLang (topk > 1, other mask modes, shapes off the chain, an empty batch), pins, inert rules and,
through SGLang's HookRegistry in a fresh interpreter, the verify-input builder's call reaching it.
Against SGLang's CUDA kernel: test_gpu_chain_tree_full_mask.py."""

import json
import random

import pytest
import torch

from hostsync_drivers.chain_tree import cases, make_case, run_both, same
from sglang_hostsync_plugin.checks import check_slot
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import chain_tree_full_mask as ct


@pytest.fixture
def triton_tree(monkeypatch):
    from sglang.kernels.ops.speculative import spec_tree
    from sglang.srt.speculative import eagle_utils

    monkeypatch.setattr(eagle_utils, "build_tree_kernel_efficient_func", spec_tree.sgl_build_tree_kernel_triton)


def test_bit_identical_to_sglangs_tree_on_random_chains(triton_tree):
    for i, (rng, kw) in enumerate(cases(7, 40, max_bs=9)):
        inputs = make_case(rng, **kw)
        stock, plugin = run_both(inputs)
        assert same(stock, plugin, inputs), (i, kw)


def test_writes_the_callers_buffer_in_place(triton_tree):
    inputs = make_case(random.Random(2), 3, 3)
    buf = inputs["tree_mask_buf"]
    out = ct.build_tree_hook(None, **inputs)
    assert out[0] is buf
    # The three retrieve lists are views of one (3, bs, width) buffer, as SGLang's.
    assert len({t.untyped_storage().data_ptr() for t in out[2:5]}) == 1 and out[2].shape == (3, 4)


@pytest.mark.parametrize("change", ["topk", "mode", "width", "shape", "empty", "int32_lengths"])
def test_what_it_leaves_to_sglang(change):
    inputs = make_case(random.Random(3), 2, 3)
    if change == "topk":
        inputs["topk"] = 4
    elif change == "mode":
        from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

        inputs["tree_mask_mode"] = TreeMaskMode.QLEN_ONLY
    elif change == "width":
        inputs["num_verify_tokens"] = 6
    elif change == "shape":
        inputs["draft_tokens"] = inputs["draft_tokens"][:, :2]
    elif change == "int32_lengths":  # SGLang's CUDA tree kernel raises on them (the H200 run of 2026-12-05)
        inputs["seq_lens"] = inputs["seq_lens"].to(torch.int32)
    else:
        inputs = make_case(random.Random(3), 0, 3)
    calls = []
    assert ct.build_tree_hook(lambda *a: calls.append(a) or "stock", **inputs) == "stock" and len(calls) == 1


def test_target_pins_and_preset(monkeypatch):
    assert check_slot(ct.SLOT) is None
    (target,) = ct.SLOT.targets
    assert target.path == ct.TARGET and target.hook is ct.build_tree_hook
    # Opt-in; in eagle_host since its GPU test and a real-server A/B ran (2026-12-05-h200-c).
    assert not ct.SLOT.default and ct.SLOT.presets == ("eagle_host",)
    monkeypatch.setattr(ct, "PINS", (("sglang.kernels.ops.speculative.eagle", "build_chain_tree", "0" * 16),))
    assert "upstream shape changed" in check_slot(ct.SLOT)


def test_inert_rules():
    for algo in ("EAGLE", "EAGLE3", "STANDALONE"):
        assert ct.SLOT.inert(ServingFacts(algo, topk=1)) is None
        assert "not 1" in ct.SLOT.inert(ServingFacts(algo, topk=4))
    assert "NGRAM" in ct.SLOT.inert(ServingFacts("NGRAM"))
    assert "DFLASH" in ct.SLOT.inert(ServingFacts("DFLASH"))
    assert "unset" in ct.SLOT.inert(ServingFacts())


def test_installed_where_the_verify_input_builder_looks_it_up():
    """Through the real HookRegistry (with the preset and the audit): the name
    ``eagle_worker_common`` bound at import reaches the slot, results SGLang's."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, random
from sglang.kernels.ops.speculative import spec_tree
from sglang.srt.speculative import eagle_utils, eagle_worker_common
from hostsync_drivers.chain_tree import make_case, clone, same
from sglang_hostsync_plugin.slots import chain_tree_full_mask as ct
calls = []
real = ct.chain_tree
ct.chain_tree = lambda *a: calls.append(1) or real(*a)
eagle_utils.build_tree_kernel_efficient_func = spec_tree.sgl_build_tree_kernel_triton
inputs = make_case(random.Random(5), 3, 3)
got = eagle_worker_common.build_tree_kernel_efficient(**clone(inputs))
want = eagle_worker_common.build_tree_kernel_efficient.__wrapped__(**clone(inputs))
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["chain_tree_full_mask"].status.value,
      "calls": len(calls), "same": same(want, got, inputs)}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine",
        TRITON_INTERPRET="1")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and res["status"] == "applied", res
    assert res["calls"] == 1 and res["same"], res
