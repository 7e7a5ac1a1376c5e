"""draft_extend_topk_graph on the CPU: the edit replaces exactly the topk > 1 branch's two calls,
composes with greedy_row_argmax's edit of the same function (an edit site), SGLang's function runs
end to end with it, and the graph cache keys, replays, clones and falls back as documented. The
CUDA capture itself is tested on the GPU (tests/test_gpu_draft_extend_topk_graph.py); here a
stand-in graph recomputes SGLang's two calls into the captured outputs."""

import contextlib
import inspect
import logging
import types

import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import draft_extend_topk_graph as tg
from sglang_hostsync_plugin.slots import edit_sites
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra

VOCAB = 1000


def _original():
    from sglang.srt.speculative import eagle_worker_v2 as w

    fn = w.EagleDraftWorker._draft_extend_for_decode
    return inspect.unwrap(fn)


class FakeGraph:
    """What a CUDA graph of ``stock_topk`` does on replay: recompute it from the captured input
    into the captured outputs."""

    def __init__(self, logits, topk, outs):
        self.logits, self.topk, self.outs, self.replays = logits, topk, outs, 0

    def replay(self):
        self.replays += 1
        for dst, src in zip(self.outs, tg.stock_topk(self.logits, None, False, self.topk)):
            dst.copy_(src)


@pytest.fixture
def cpu_graphs(monkeypatch):
    """A fresh TopkGraphs that takes CPU tensors and captures with FakeGraph."""
    graphs = tg.TopkGraphs(limit=3)
    captured = []

    def capture(logits, topk):
        outs = tuple(t.clone() for t in tg.stock_topk(logits, None, False, topk))
        captured.append(FakeGraph(logits, topk, outs))
        return (captured[-1], *outs)

    monkeypatch.setattr(tg, "_fits", lambda x: x.dim() == 2 and x.shape[0] > 0)
    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(tg, "GRAPHS", graphs)
    return graphs, captured


def _same(a, b):
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def test_the_edit_replaces_exactly_the_two_calls_of_the_topk_branch():
    src = inspect.getsource(_original())
    old, new = tg.EDIT
    assert src.count(old) == 1 and src.count("fast_topk(") == 1 and src.count("renorm_draft_probs(") == 1
    branch = src.split(old)[0].rsplit("\n        ", 1)[1]
    assert branch == "else:\n"  # the last branch: topk > 1 without rejection sampling
    # What the edit passes is what the two lines used, plus the graph flag of the same function.
    assert "draft_logits_output.next_token_logits" in new and "can_run_decode_cuda_graph" in new
    assert "can_run_decode_cuda_graph = (" in src.split(old)[0]
    stock_src = inspect.getsource(tg.stock_topk)
    assert "worker.renorm_draft_probs(logits, sampling_info, use_rejection_sampling)" in stock_src
    assert "worker.fast_topk(probs, topk, dim=-1)" in stock_src


def test_both_parts_of_the_site_apply_together_and_alone():
    site = edit_sites.DRAFT_EXTEND_SITE
    assert set(site.parts) == {gra.NAME, tg.NAME}
    assert site.check() is None and tg.DRAFT_EXTEND_ONCE.check() is None and gra.DRAFT_EXTEND_ONCE.check() is None
    original = _original()
    for slots, names in (((gra.NAME, tg.NAME), {"_hostsync_row_argmax", "_hostsync_draft_topk"}),
                         ((tg.NAME,), {"_hostsync_draft_topk"}), ((gra.NAME,), {"_hostsync_row_argmax"})):
        fn = edit_sites.EditSite(site.path, site.sha)
        fn.parts = dict(site.parts)
        variant = fn.variant(original, slots)
        assert variant is not original and set(variant.__code__.co_freevars) == names, slots


def test_overlapping_parts_refuse_the_slots_at_their_precheck(monkeypatch):
    site = edit_sites.DRAFT_EXTEND_SITE
    clash = site.parts[tg.NAME]
    # Each part alone applies; together the second replacement of the same lines finds none.
    monkeypatch.setattr(clash, "edits", (tg.EDIT, gra.DRAFT_EXTEND_EDIT))
    assert clash._check(clash.edits, clash.bind()) is None
    assert "expected one" in tg.SLOT.precheck() and "expected one" in gra.SLOT.precheck()
    monkeypatch.setattr(clash, "edits", (tg.EDIT,))
    monkeypatch.setattr(clash, "bind", lambda: {"_hostsync_row_argmax": None})
    assert "bind the same name twice" in site.check()


def test_a_part_that_no_longer_applies_refuses_only_its_own_slot(monkeypatch):
    """An upstream change under greedy_row_argmax's lines refuses that slot at startup; this slot's
    part still applies (checked alone and with every part that applies) and is planned."""
    from sglang_hostsync_plugin import plan as plans
    from sglang_hostsync_plugin.slot import Status

    monkeypatch.setattr(gra.DRAFT_EXTEND_ONCE, "edits", (("a line SGLang no longer has\n", "x"),))
    assert "does not apply" in gra.SLOT.precheck() and tg.SLOT.precheck() is None
    facts = ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16, attention_backends=("triton", "triton"))
    plan = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,eagle_host"}, facts=facts)
    assert plan.verdict(gra.NAME).status is Status.FAILED
    assert plan.verdict(tg.NAME).status is Status.WOULD_APPLY


def test_site_parts_do_not_conflict_but_another_claimant_does():
    from sglang_hostsync_plugin.checks import claim_conflicts
    from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

    other = Slot(name="other", kind=SlotKind.OWNED, origin="t", summary="t", default=False,
                 targets=(HookTarget(edit_sites.DRAFT_EXTEND, TargetKind.FUNCTION, hook=lambda o, *a, **k: o(*a, **k)),))
    assert claim_conflicts([gra.SLOT, tg.SLOT]) == {}
    refused = claim_conflicts([gra.SLOT, tg.SLOT, other])
    assert set(refused) == {gra.NAME, tg.NAME, "other"}
    with pytest.raises(ValueError, match="site target"):
        HookTarget(edit_sites.DRAFT_EXTEND, TargetKind.FUNCTION, hook=lambda o: o, site=edit_sites.DRAFT_EXTEND_SITE)


def test_the_composed_hook_follows_each_slots_state(monkeypatch):
    """One hook for the site: each part's snippets only while its slot is active; a refused slot's
    part drops out and the other stays; with neither, SGLang's function; observers still wrap it."""
    from sglang_hostsync_plugin import installer

    site = edit_sites.DRAFT_EXTEND_SITE
    monkeypatch.setattr(site, "_variants", {})
    ran = []

    def original(*args):
        ran.append(("stock", args))

    def fake_variant(orig, slots):
        return lambda *args: ran.append((slots, args))

    monkeypatch.setattr(site, "variant", fake_variant)
    seen = []

    def observe(orig, *args):
        seen.append("observed")
        return orig(*args)

    state = installer.InstallState(active={gra.NAME, tg.NAME, "audit"})
    parts = [("audit", observe, True, None), *((s.name, t.hook, t.observer, t.site)
                                               for s in (gra.SLOT, tg.SLOT) for t in s.targets if t.site)]
    hook = installer.compose_function(state, parts)
    hook(original, 1)
    state.active.discard(gra.NAME)
    hook(original, 2)
    state.active.discard(tg.NAME)
    hook(original, 3)
    assert ran == [((tg.NAME, gra.NAME), (1,)), ((tg.NAME,), (2,)), ("stock", (3,))]
    assert seen == ["observed"] * 3


class _Runner:
    """The draft-extend graph runner as ``_draft_extend_for_decode`` uses it: a static output
    buffer per batch size, refilled on each replay."""

    def __init__(self, gen):
        self.gen, self.out = gen, {}

    def can_run_graph(self, forward_batch):
        return True

    def execute(self, forward_batch, select_index):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        bs = select_index.shape[0]
        buf = self.out.setdefault(bs, torch.empty(bs, VOCAB))
        buf.copy_(torch.randn(bs, VOCAB, generator=self.gen))
        return LogitsProcessorOutput(next_token_logits=buf[:bs], hidden_states=torch.zeros(bs, 8))


def _run_draft_extend(fn, monkeypatch, bs, gen, runner):
    from sglang.srt.speculative import eagle_worker_v2 as w

    monkeypatch.setattr(w, "prepare_for_draft_extend",
                        lambda *a, **k: types.SimpleNamespace(spec_info=types.SimpleNamespace(), input_ids=None))
    monkeypatch.setattr(w, "get_spec", lambda: types.SimpleNamespace(speculative_use_rejection_sampling=False))
    worker = types.SimpleNamespace(
        speculative_num_draft_tokens=4, plan_stream=None, plan_stream_ctx=contextlib.nullcontext(),
        draft_runner=types.SimpleNamespace(canary_manager=None), cuda_graph_runner_for_draft_extend=runner,
        seed_dsa_topk_from_draft_extend=False, topk=4, device="cpu")
    accept = torch.randint(1, 5, (bs,), generator=gen, dtype=torch.int32)
    result = types.SimpleNamespace(
        prepared_draft_extend_inputs=(accept - 1, torch.arange(bs) * 4 + accept - 1, torch.zeros(bs, dtype=torch.int64)),
        accept_lens=accept, logits_output=types.SimpleNamespace(hidden_states=torch.zeros(bs * 4, 8)),
        next_draft_input=types.SimpleNamespace(), new_seq_lens=None)
    batch = types.SimpleNamespace(sampling_info=types.SimpleNamespace(), seq_lens=torch.zeros(bs))
    fn(worker, batch, result)
    return result.next_draft_input.topk_p, result.next_draft_input.topk_index


def test_sglangs_function_runs_with_the_edit_and_gives_stocks_values(monkeypatch, cpu_graphs):
    """The real _draft_extend_for_decode (both site parts compiled in) against SGLang's own, over
    steps whose batch size changes: the same top-k each step; the first step of a batch size runs
    stock's code and captures, the later ones replay."""
    graphs, captured = cpu_graphs
    original = _original()
    site = edit_sites.DRAFT_EXTEND_SITE
    monkeypatch.setattr(site, "_variants", {})
    edited = site.variant(original, (gra.NAME, tg.NAME))
    assert edited is not original
    runner_a, runner_b = _Runner(None), _Runner(None)  # static buffers persist across steps
    for step, bs in enumerate((1, 1, 3, 1, 3, 3)):
        runner_a.gen, runner_b.gen = torch.Generator().manual_seed(step), torch.Generator().manual_seed(step)
        want = _run_draft_extend(original, monkeypatch, bs, torch.Generator().manual_seed(100 + step), runner_a)
        got = _run_draft_extend(edited, monkeypatch, bs, torch.Generator().manual_seed(100 + step), runner_b)
        assert _same(got, want), step
        assert got[0].data_ptr() not in {g.outs[0].data_ptr() for g in captured}  # a fresh tensor, as stock's
    assert len(captured) == 2 and [g.replays for g in captured] == [2, 2]


def test_replays_clones_and_keys_by_the_view(cpu_graphs):
    graphs, captured = cpu_graphs
    gen = torch.Generator().manual_seed(0)
    buf = torch.empty(4, VOCAB)
    for step in range(4):
        buf.copy_(torch.randn(4, VOCAB, generator=gen))
        buf[1, :] = 0.5  # a row of ties
        for view in (buf[:2], buf[:4]):
            got = tg.draft_topk(view, None, False, 4, True)
            assert _same(got, tg.stock_topk(view, None, False, 4)), step
    assert len(graphs.entries) == 2 and [g.replays for g in captured] == [3, 3] and graphs.replays == 6
    first = tg.draft_topk(buf[:2], None, False, 4, True)
    second = tg.draft_topk(buf[:2], None, False, 4, True)
    assert first[0].data_ptr() != second[0].data_ptr() and _same(first, second)
    tg.draft_topk(buf[:2], None, False, 8, True)  # another topk: its own graph
    assert len(graphs.entries) == 3


def test_stock_code_where_the_graph_does_not_apply(cpu_graphs, monkeypatch):
    graphs, captured = cpu_graphs
    buf = torch.randn(3, VOCAB)
    calls = []
    real = tg.stock_topk
    monkeypatch.setattr(tg, "stock_topk", lambda *a: calls.append(a[2]) or real(*a))
    tg.draft_topk(buf, None, False, 4, False)  # eager draft extend: a fresh gather
    tg.draft_topk(buf, types.SimpleNamespace(temperatures=torch.ones(3, 1)), True, 4, True)  # rejection sampling
    tg.draft_topk(buf[:0], None, False, 4, True)  # empty batch
    assert calls == [False, True, False] and graphs.entries == {} and captured == []
    for n in range(4):  # past the limit (3 views): stock's code, no capture
        tg.draft_topk(torch.randn(n + 1, VOCAB), None, False, 4, True)
    assert len(graphs.entries) == 3 and len(captured) == 3


def test_a_failed_capture_switches_the_graphs_off_and_logs_once(monkeypatch, caplog):
    graphs = tg.TopkGraphs()
    monkeypatch.setattr(tg, "_fits", lambda x: True)
    monkeypatch.setattr(tg, "GRAPHS", graphs)
    calls = []
    real_capture = graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda *a: calls.append(a) or real_capture(*a))
    with caplog.at_level(logging.ERROR, logger="sglang.srt.plugins.hostsync"):
        for bs in (2, 2, 3, 5):  # CUDA graphs are not available on the CPU: the real capture fails
            buf = torch.randn(bs, VOCAB)
            assert _same(tg.draft_topk(buf, None, False, 4, True), tg.stock_topk(buf, None, False, 4))
    assert graphs.disabled and graphs.entries == {} and len(calls) == 1 and graphs.replays == 0
    assert caplog.text.count("failed, stock's top-k runs from now on") == 1


def test_fits_only_cuda_rows_outside_a_capture():
    assert not tg._fits(torch.zeros(2, 5))  # CPU
    assert not tg._fits(torch.zeros(0, 5, device="meta"))


def test_inert_rule_and_preset():
    from sglang_hostsync_plugin.slots.upstream_switches import HOST_PRESET

    f = dict(speculative_algorithm="EAGLE", topk=4, page_size=16)
    assert tg.inert(ServingFacts(**f)) is None
    assert tg.inert(ServingFacts(**{**f, "speculative_algorithm": "STANDALONE"})) is None
    assert "topk is 1" in tg.inert(ServingFacts(**{**f, "topk": 1}))
    assert "--disable-cuda-graph" in tg.inert(ServingFacts(**f, disable_cuda_graph=True))
    for algo in ("NGRAM", "DFLASH", None):
        assert tg.inert(ServingFacts(**{**f, "speculative_algorithm": algo})) is not None
    assert HOST_PRESET in tg.SLOT.presets and not tg.SLOT.default


def test_installed_in_real_sglang_beside_greedy_row_argmax_and_the_audit():
    """A fresh interpreter with SGLang's HookRegistry (default,eagle_host,audit_fine): both parts
    of the site verify as applied, the function carries one hook (the audit's observer around the
    site's), and its live chain runs the variant with both edits."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python(LOAD_AND_STARTUP_CHECK + """
import json
from sglang_hostsync_plugin.slots import edit_sites
st = rt.state.statuses
print("RESULT" + json.dumps({"err": err, "tg": st["draft_extend_topk_graph"].status.value,
      "gra": st["greedy_row_argmax"].status.value, "audit": st["audit_fine"].status.value,
      "owners": list(rt.state.registered[edit_sites.DRAFT_EXTEND][1])}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,eagle_host,audit,audit_fine")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["err"] is None and (res["tg"], res["gra"], res["audit"]) == ("applied",) * 3, res
    assert set(res["owners"]) >= {"greedy_row_argmax", "draft_extend_topk_graph", "audit"}, res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout
