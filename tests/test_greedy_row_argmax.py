"""greedy_row_argmax: the kernel is torch.argmax exactly (ties, NaN, signed zeros, block
edges, dtypes), what it does not take goes to torch, and the two recompiled SGLang
functions call it where SGLang called torch.argmax (eagle_sample runs for real up to its
verify kernel)."""

import random
import types

import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra

B = gra.BLOCK


def _same(x, keepdim=False):
    got = gra.row_argmax(x, keepdim=keepdim)
    want = torch.argmax(x, dim=-1, keepdim=keepdim)
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want), (got, want)
    return got


def test_fits_on_the_interpreter():
    assert gra._INTERPRET and gra.fits(torch.zeros(2, 10))  # so the tests below run the kernel


@pytest.mark.parametrize("width", [1, 7, B - 1, B, B + 1, 3 * B + 5, 128256])
def test_random_rows_every_width(width):
    g = torch.Generator().manual_seed(width)
    _same(torch.randn(5, width, generator=g))


def test_ties_within_and_across_blocks_take_the_first():
    x = torch.zeros(4, 3 * B)
    x[0, [5, 9]] = 2.0  # within one block
    x[1, [B + 3, 2 * B + 1]] = 2.0  # across blocks: the earlier block
    x[2, [2 * B + 7, B + 8]] = 2.0
    x[3] = 1.0  # a whole row of ties
    got = _same(x)
    assert got.tolist() == [5, B + 3, B + 8, 0]  # a last-of-ties kernel would differ in every row


def test_nan_inf_and_signed_zeros():
    x = torch.full((7, 2 * B + 3), -float("inf"))
    x[1, [3, B + 4]] = float("nan")  # the first NaN wins
    x[1, 0] = float("inf")
    x[2, B + 9] = float("inf")
    x[3, :] = 0.0
    x[3, 0] = -0.0  # -0.0 == 0.0: index 0
    x[4, 2 * B + 2] = float("nan")  # a NaN in the last, partial block
    x[5, 2 * B + 2] = -1.0
    x[6, [B + 5, 5, 2 * B + 1]] = float("nan")  # two in one lane (5, B + 5): its first
    assert _same(x).tolist() == [0, 3, B + 9, 0, 2 * B + 2, 2 * B + 2, 5]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_with_many_ties(dtype):
    rng = random.Random(3)
    x = torch.tensor([[rng.randrange(-4, 5) for _ in range(B + 100)] for _ in range(3)], dtype=dtype)
    _same(x)
    _same(x, keepdim=True)


def test_a_row_view_with_a_padded_stride():
    x = torch.randn(3, 2 * B + 64)[:, : 2 * B]  # rows strided, columns contiguous
    assert gra.fits(x)
    _same(x)


@pytest.mark.parametrize("case", ["empty", "1d", "strided_cols", "int", "float64"])
def test_what_the_kernel_does_not_take_goes_to_torch(case, monkeypatch):
    x = {"empty": torch.zeros(0, 10), "1d": torch.randn(10), "strided_cols": torch.randn(10, 4).t(),
         "int": torch.randint(0, 9, (3, 10)), "float64": torch.randn(3, 10, dtype=torch.float64)}[case]
    assert not gra.fits(x)
    monkeypatch.setattr(gra, "_row_argmax_kernel", None)  # would raise if reached
    _same(x)


def _fake_sample_inputs(bs, n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs * n, vocab, generator=g)
    logits[0, [11, 40]] = 9.0  # a tie on the first row
    sampling_info = types.SimpleNamespace(acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
                                          is_all_greedy=True, has_watermark_candidates=False)
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False), seq_lens=torch.ones(bs),
                                  device="cpu", sampling_info=sampling_info, return_logprob=False)
    verify_input = types.SimpleNamespace(draft_token=torch.zeros(bs * n, dtype=torch.int64), draft_token_num=n,
                                         max_tree_depth=n, retrieve_index=None, retrieve_next_token=None,
                                         retrieve_next_sibling=None, tree_topk=1)
    return verify_input, batch, types.SimpleNamespace(next_token_logits=logits), logits


class _Stop(Exception):
    pass


def test_recompiled_eagle_sample_calls_the_kernel_with_stock_values(monkeypatch):
    """SGLang's real eagle_sample, stock and recompiled, up to verify_tree_greedy_func (stubbed
    to capture target_predict and stop): the same target_predict, and the kernel ran."""
    from sglang.srt.speculative import eagle_utils as eu

    monkeypatch.setattr(eu, "get_spec", lambda: types.SimpleNamespace(speculative_use_rejection_sampling=False))
    seen = []

    def capture(**kw):
        seen.append(kw["target_predict"].clone())
        raise _Stop

    monkeypatch.setattr(eu, "verify_tree_greedy_func", capture)
    calls = []
    kernel = gra._row_argmax_kernel

    class Counting:  # the kernel, counting its launches
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(gra, "_row_argmax_kernel", Counting())
    monkeypatch.setattr(gra.SAMPLE_ONCE, "_edited", None)
    original = getattr(eu.eagle_sample, "__wrapped__", eu.eagle_sample)
    for bs, n in ((1, 4), (3, 8)):
        args = _fake_sample_inputs(bs, n, B + 77, bs)
        for fn in (lambda *a: original(*a), lambda *a: gra.SAMPLE_ONCE.hook(original, *a)):
            with pytest.raises(_Stop):
                fn(*args[:3])
        stock, plugin = seen[-2:]
        assert plugin.shape == (bs, n) and torch.equal(stock, plugin)
        assert plugin[0, 0] == 11
    assert len(calls) == 2 and gra.SAMPLE_ONCE._edited not in (None, original)


def test_the_draft_extend_edit_replaces_only_the_topk1_argmax(monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2 as w

    monkeypatch.setattr(gra.DRAFT_EXTEND_ONCE, "_edited", None)
    original = w.EagleDraftWorker._draft_extend_for_decode
    original = getattr(original, "__wrapped__", original)
    edited = gra.DRAFT_EXTEND_ONCE(original)
    assert "_hostsync_row_argmax" in edited.__code__.co_freevars
    assert edited.__closure__[edited.__code__.co_freevars.index("_hostsync_row_argmax")].cell_contents is gra.row_argmax
    import inspect

    src = inspect.getsource(original)
    assert src.count("torch.argmax(") == 1 and gra.DRAFT_EXTEND_EDIT[0] in src  # the one call, in the topk-1 branch
    branch = src.split(gra.DRAFT_EXTEND_EDIT[0])[0].rsplit("elif ", 1)[1]
    assert branch.startswith("self.topk == 1 and not _is_hip:") and branch.count("\n") == 3  # + two comment lines


def test_pins_match_the_installed_sglang():
    from sglang_hostsync_plugin.checks import source_sha
    from sglang.srt.speculative import eagle_utils as eu
    from sglang.srt.speculative import eagle_worker_v2 as w

    unwrap = lambda f: getattr(f, "__wrapped__", f)  # noqa: E731
    assert source_sha(unwrap(eu.eagle_sample)) == gra.SAMPLE_SHA
    assert source_sha(unwrap(w.EagleDraftWorker._draft_extend_for_decode)) == gra.DRAFT_EXTEND_SHA


def test_inert_rule_and_preset():
    from sglang_hostsync_plugin.slots.upstream_switches import HOST_PRESET

    assert gra.inert(ServingFacts(speculative_algorithm="STANDALONE", topk=1)) is None
    assert gra.inert(ServingFacts(speculative_algorithm="NGRAM")) is None
    assert "DFLASH" in gra.inert(ServingFacts(speculative_algorithm="DFLASH"))
    assert gra.inert(ServingFacts(speculative_algorithm=None)) is not None
    assert HOST_PRESET in gra.SLOT.presets and not gra.SLOT.default


def test_an_edit_that_does_not_apply_refuses_the_slot_before_anything_is_hooked(monkeypatch):
    """The precheck makes both edits: one that no longer applies (an upstream change the pin
    missed) refuses the whole slot at startup; the other slots of the preset still apply."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    assert gra.SAMPLE_ONCE.check() is None and gra.DRAFT_EXTEND_ONCE.check() is None
    monkeypatch.setattr(gra.DRAFT_EXTEND_ONCE, "edits", (("a line SGLang no longer has\n", "x"),))
    reason = gra.SLOT.precheck()
    assert reason.startswith(f"source edit of {gra.DRAFT_EXTEND} does not apply: SourceEditError"), reason
    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=1, page_size=16, attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host"}, facts=facts)
    assert plan.verdict(gra.NAME).status is Status.FAILED and "does not apply" in plan.verdict(gra.NAME).reason
    assert plan.verdict("draft_extend_glue_graph").status is Status.WOULD_APPLY


def test_applies_beside_the_audit_and_eagle_host():
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=1, page_size=16, attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host,audit"}, facts=facts)
    for name in (gra.NAME, "audit"):
        assert plan.verdict(name).status is Status.WOULD_APPLY, plan.verdict(name)


def test_installed_in_real_sglang_with_the_audit_and_eagle_host():
    """In a fresh interpreter with SGLang's HookRegistry (default,eagle_host,audit): the slot and
    the audit's observers on both functions verify as applied, the live eagle_sample chain runs
    the recompiled copy with stock's values, and SGLang logs no stacked hooks."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json, sys, types
import torch
sys.path.insert(0, "tests")
from sglang.srt.speculative import eagle_utils as eu
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra
from test_greedy_row_argmax import _fake_sample_inputs, _Stop
eu.get_spec = lambda: types.SimpleNamespace(speculative_use_rejection_sampling=False)
seen = []
def capture(**kw):
    seen.append(kw["target_predict"].clone())
    raise _Stop
eu.verify_tree_greedy_func = capture
args = _fake_sample_inputs(2, 4, 5000, 0)
for fn in (eu.eagle_sample, eu.eagle_sample.__wrapped__):  # the hooked chain, then SGLang's own
    try:
        fn(*args[:3])
    except _Stop:
        pass
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["greedy_row_argmax"].status.value,
      "audit": rt.state.statuses["audit"].status.value, "n": len(seen),
      "same": len(seen) == 2 and bool(torch.equal(seen[0], seen[1])), "edited": gra.SAMPLE_ONCE._edited is not None}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"err": None, "status": "applied", "audit": "applied", "n": 2, "same": True, "edited": True}, res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout


def test_sglang_row_argmax_is_not_torch_on_nan_rows():
    # Why the slot keeps its own kernel: SGLang 0.5.23 ships ``row_argmax`` (spec_utils, DSpark), but
    # its path for up to 64 rows drops NaN (torch's argmax picks the first NaN), and NaN logits reach
    # the verify argmax unless SGLANG_SANITIZE_NAN_LOGITS is set. Fails once a pinned SGLang fixes it.
    from sglang.kernels.ops.speculative.row_argmax import row_argmax as sglang_row_argmax

    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    x[:, ::7] = float("nan")
    want = torch.argmax(x, dim=-1)
    assert torch.equal(_same(x), want)
    assert not torch.equal(sglang_row_argmax(x), want)
