"""eagle_step_graph on the CPU: which steps stay eager and why, the inputs it stages, the result it
hands out, the capture/replay flow around fakes (``capture()`` itself over fakes of torch's CUDA graph
and stream calls, in their order: a failed capture, the batch restored), the startup hook that keeps
the runners' graphs and drops the step graphs when a runner captures again, and its rules (inert,
server settings, unsafe pairs, settings) against SGLang 0.5.23's code. The joined graph itself runs
in tests/test_gpu_eagle_step_graph.py (CUDA) and in the real-server e2e."""

import collections
import contextlib
import inspect
import re
from types import SimpleNamespace as NS

import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import eagle_step_graph as sg


class Mode:
    def __init__(self, kind="decode"):
        self.kind = kind

    def is_extend(self):
        return self.kind == "extend"

    def is_idle(self):
        return self.kind == "idle"

    def is_decode(self):
        return self.kind == "decode"


def batch(bs=2, **over):
    b = NS(forward_mode=Mode(), is_extend_in_batch=False, return_logprob=False, return_hidden_states=False,
           has_grammar=False, hisparse_coordinator=None, mamba_track_indices=None, input_ids=None,
           seq_lens_cpu=None, multimodal_inputs=[None] * bs, seq_lens=torch.arange(bs) + 10, req_pool_indices=torch.arange(bs), orig_seq_lens=None,
           out_cache_loc=torch.arange(bs * 4).view(bs, 4),
           spec_info=NS(hidden_states=torch.zeros(bs, 8), topk_p=torch.ones(bs, 1),
                        topk_index=torch.zeros(bs, 1, dtype=torch.int64), is_verify_input=lambda: False),
           sampling_info=NS(is_all_greedy=True, acc_additive_penalties=None, acc_scaling_penalties=None,
                            logit_bias=None, has_watermark_candidates=False, temperatures=torch.ones(bs, 1)))
    for key, value in over.items():
        owner, _, name = key.rpartition("__")
        setattr({"": b, "spec": b.spec_info, "sampling": b.sampling_info}[owner], name, value)
    return b


WORKER = NS(topk=1, speculative_num_steps=3, activate_step_by_batch=lambda bs: None,
            draft_worker=NS(seed_dsa_topk_from_draft_extend=False))


@pytest.fixture
def cpu_tensors(monkeypatch):
    """CPU tensors stand for the device's."""
    monkeypatch.setattr(sg, "on_device", torch.is_tensor)


@pytest.mark.parametrize("over, reason", [
    ({"forward_mode": Mode("extend")}, "not a decode step"),
    ({"forward_mode": Mode("idle")}, "not a decode step"),
    ({"is_extend_in_batch": True}, "not a decode step"),
    ({"spec__is_verify_input": lambda: True}, "no draft input"),
    ({"spec_info": None}, "no draft input"),
    ({"return_logprob": True}, "logprobs"),
    ({"return_hidden_states": True}, "hidden states"),
    ({"has_grammar": True}, "a grammar"),
    ({"sampling__is_all_greedy": False}, "non-greedy"),
    ({"sampling__acc_additive_penalties": torch.ones(2)}, "penalties"),
    ({"sampling__acc_scaling_penalties": torch.ones(2)}, "penalties"),
    ({"sampling__logit_bias": torch.ones(2)}, "logit bias"),
    ({"sampling__has_watermark_candidates": True}, "watermark"),
    ({"hisparse_coordinator": object()}, "hisparse"),
    ({"mamba_track_indices": torch.ones(2)}, "mamba"),
    # --disable-overlap-schedule keeps the host lengths; the draft extend would stage the capture step's.
    ({"seq_lens_cpu": torch.tensor([10, 11])}, "host sequence lengths"),
    # An mrope model takes per-request position deltas where any request has multimodal inputs.
    ({"multimodal_inputs": [None, object()]}, "multimodal inputs"),
])
def test_steps_the_graph_cannot_hold_stay_eager(over, reason):
    assert sg.ineligible(WORKER, batch(), None) is None
    assert reason in sg.ineligible(WORKER, batch(**over), None)


def test_worker_and_call_conditions():
    assert "topk" in sg.ineligible(NS(topk=4, speculative_num_steps=3), batch(), None)
    assert "drafting" in sg.ineligible(NS(topk=1, speculative_num_steps=0), batch(), None)
    assert "PP" in sg.ineligible(WORKER, batch(), object())


def test_inputs_are_gathered_in_name_order_and_a_stray_device_tensor_is_named(cpu_tensors):
    b = batch()
    layout, tensors = sg.gather(sg.owners(b))
    assert [id(t) for t in tensors] == [id(b.req_pool_indices), id(b.seq_lens), id(b.out_cache_loc),
                                        id(b.spec_info.topk_p), id(b.spec_info.topk_index),
                                        id(b.spec_info.hidden_states), id(b.sampling_info.temperatures)]
    assert len(layout) == sum(map(len, sg.INPUTS)) and layout.count(None) == len(layout) - 7
    assert layout[1] == (torch.Size([2]), torch.int64)
    assert sg.stray_input(sg.owners(b)) is None
    assert sg.stray_input(sg.owners(batch(spec__draft_probs=torch.ones(2, 4)))) == "SimpleNamespace.draft_probs"
    assert sg.stray_input(sg.owners(batch(engram_history=torch.ones(2)))) == "SimpleNamespace.engram_history"
    assert sg.stray_input(sg.owners(batch(sampling__vocab_mask=torch.ones(2)))) == "SimpleNamespace.vocab_mask"
    assert sg.stray_input(sg.owners(batch(seq_lens_cpu=torch.ones(2)))) == "SimpleNamespace.seq_lens_cpu"


def test_a_layout_tells_presence_shape_and_dtype_apart():
    key = sg.gather(sg.owners(batch()))[0]
    assert sg.gather(sg.owners(batch()))[0] == key  # new tensors, same layout
    for other in (batch(bs=3), batch(orig_seq_lens=torch.ones(2)), batch(out_cache_loc=None),
                  batch(seq_lens=torch.arange(2.0))):
        assert sg.gather(sg.owners(other))[0] != key


def test_install_puts_the_graph_tensors_in_place():
    b = batch()
    _, tensors = sg.gather(sg.owners(b))
    slots = [t.clone() for t in tensors]
    sg.install(sg.owners(b), slots)
    assert [id(t) for t in sg.gather(sg.owners(b))[1]] == [id(t) for t in slots]
    assert b.input_ids is None and b.orig_seq_lens is None


def test_every_named_input_is_a_field_sglang_has():
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    for cls, names in zip((ScheduleBatch, EagleDraftInput, SamplingBatchInfo), sg.INPUTS):
        fields = set(cls.__dataclass_fields__)
        assert set(names) <= fields, (cls.__name__, set(names) - fields)


def result():
    return NS(next_token_ids=torch.arange(3), accept_lens=torch.ones(3, dtype=torch.int32),
              new_seq_lens=torch.arange(3) + 5, logits_output=object(),
              next_draft_input=NS(topk_index=torch.zeros(3, 1), topk_p=torch.ones(3, 1), hidden_states=torch.ones(3, 2),
                                  bonus_tokens=torch.arange(3)),
              extra_keep_alive_refs=[object()])


def test_the_handed_out_result_clones_what_the_host_reads():
    step = sg.StepGraph(3, [], result(), [], 0, 0)
    out = step.output()
    for name in sg.CLONED:
        got, kept = getattr(out, name), getattr(step.result, name)
        assert got is not kept and got.data_ptr() != kept.data_ptr() and torch.equal(got, kept)
    assert out.next_draft_input is not step.result.next_draft_input  # the scheduler sets fields on it
    assert out.next_draft_input.hidden_states is step.result.next_draft_input.hidden_states  # relayed in stream order
    assert out.logits_output is step.result.logits_output
    out.extra_keep_alive_refs.append(1)
    assert len(step.result.extra_keep_alive_refs) == 1


def test_fingerprint_compares_float_bits():
    r = result()
    r.next_draft_input.topk_p = torch.tensor([[float("nan")], [1.0], [2.0]])
    a, b = sg.fingerprint(r), sg.fingerprint(r)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # NaN == NaN by bits
    assert all(not t.is_floating_point() for t in a)


class FakeDriver:
    def __init__(self):
        self.launched, self.destroyed, self.chained, self.ended = [], [], [], []

    def nodes(self, graph):
        return 1

    def chain(self, graphs):
        self.chained.append(graphs)
        return 1, 200 + len(self.chained)

    def end_capture(self, stream):
        self.ended.append(stream)

    def launch(self, exe, stream):
        self.launched.append(exe)

    def destroy(self, parent, exe):
        self.destroyed.append(exe)


@pytest.fixture
def flow(monkeypatch, cpu_tensors):
    r = sg.Route(driver=FakeDriver())
    monkeypatch.setattr(sg, "_route", r)
    monkeypatch.setattr(sg, "stream_handle", lambda: 0)
    captured = []

    def fake_capture(original, worker, b, tensors, key):
        step = sg.StepGraph(len(b.seq_lens), [t.clone() for t in tensors], result(), [], 1, len(captured) + 100)
        captured.append(step)
        return step

    monkeypatch.setattr(sg, "capture", fake_capture)
    return r, captured


def eager_step():
    calls = []

    def original(worker, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        calls.append(on_publish)
        return result()

    return original, calls


def test_the_audit_times_a_replays_launch_as_its_own_phase(flow, monkeypatch):
    """What is left of a replayed step's host time beside the launch (the audit's phase tables)."""
    import threading

    from sglang_hostsync_plugin.slots import audit_phases as ph

    r, captured = flow
    clock = ph.PhaseClock(thread_id=threading.get_ident())
    monkeypatch.setattr(ph, "_clock", clock)
    original, _ = eager_step()
    for _ in range(sg.WARMUPS + 2):
        sg.step_hook(original, WORKER, batch())
    assert [p for p, _, _ in clock.segments] == [ph.STEP_GRAPH_LAUNCH] * 2 and r.driver.launched == [100, 100]


def test_two_eager_steps_then_a_capture_then_replays(flow):
    r, captured = flow
    original, calls = eager_step()
    published = []
    for _ in range(6):
        sg.step_hook(original, WORKER, batch(), on_publish=published.append)
    assert len(calls) == sg.WARMUPS and len(captured) == 1 and r.replays == 6 - sg.WARMUPS
    assert r.driver.launched == [100] * (6 - sg.WARMUPS)
    assert len(published) == 6 - sg.WARMUPS and all(calls)  # eager steps got on_publish themselves
    b = batch()
    b.seq_lens.fill_(77)
    sg.step_hook(original, WORKER, b)
    assert torch.equal(captured[0].slots[1], b.seq_lens)  # this step's lengths copied in
    sg.step_hook(original, WORKER, batch(orig_seq_lens=torch.ones(2)))  # another layout: its own warm-up
    assert len(calls) == sg.WARMUPS + 1 and len(r.warm) == 2


def test_the_number_of_graphs_is_bounded(flow):
    r, captured = flow
    r.max_graphs = 2
    original, calls = eager_step()
    for bs in (1, 2, 3) * 3 + (3, 3):
        sg.step_hook(original, WORKER, batch(bs))
    assert len(captured) == 2 and r.eager == {f"2 step graphs held already ({sg.ENV_MAX})": 3}  # bs 3 past warm-up


def test_each_batch_size_gets_its_own_graph_and_a_stale_one_is_dropped(flow, monkeypatch):
    r, captured = flow
    original, calls = eager_step()
    for bs in (1, 2, 1, 2, 1, 2):
        sg.step_hook(original, WORKER, batch(bs))
    assert sorted(bs for bs, _ in r.graphs) == [1, 2] and len(captured) == 2
    monkeypatch.setattr(sg.StepGraph, "current", lambda self: self.bs != 1)
    sg.step_hook(original, WORKER, batch(1))
    key = (1, sg.gather(sg.owners(batch(1)))[0])
    assert r.driver.destroyed == [100] and key not in r.graphs and r.warm[key] == 1


def test_disabled_skipped_and_ineligible_steps_run_sglangs_branch(flow):
    r, captured = flow
    original, calls = eager_step()
    sg.step_hook(original, WORKER, batch(return_logprob=True))
    r.skip.add(2)
    for _ in range(4):
        sg.step_hook(original, WORKER, batch(2))
    r.disabled = "capture failed"
    for _ in range(4):
        sg.step_hook(original, WORKER, batch(3))
    assert len(calls) == 9 and not captured and r.replays == 0
    assert set(r.eager) == {"logprobs or hidden states requested", "bs 2 has no step graph",
                            "capture off"}


def test_a_nested_call_inside_a_capture_is_sglangs(flow):
    r, captured = flow
    original, calls = eager_step()
    r.capture = object()
    sg.step_hook(original, WORKER, batch())
    assert len(calls) == 1 and not r.eager


def test_the_check_runs_sglangs_step_after_the_replay_and_serves_its_result(flow):
    r, captured = flow
    r.check = 2
    eager, calls = eager_step()
    returned = []

    def original(*args):
        returned.append(eager(*args))
        return returned[-1]

    published = []
    outs = [sg.step_hook(original, WORKER, batch(), on_publish=published.append) for _ in range(sg.WARMUPS + 4)]
    assert r.checks == 2 and len(calls) == sg.WARMUPS + 2 and calls[-1] is None  # published once, by the hook
    assert len(published) == 4 and r.replays == 4  # a checked step is replayed too
    assert outs[sg.WARMUPS + 1] is returned[-2] and outs[sg.WARMUPS + 3] is returned[-1]  # SGLang's result
    assert published[1] is returned[-2].new_seq_lens
    r.tally.settle(r.checks)
    assert r.tally.mismatches == 0  # result() is deterministic


def test_the_check_counts_a_replay_that_differs_from_sglangs_step(flow):
    r, captured = flow
    r.check = 1
    original, calls = eager_step()
    for _ in range(sg.WARMUPS):
        sg.step_hook(original, WORKER, batch())

    def other(worker, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        out = result()
        out.accept_lens = out.accept_lens + 1  # SGLang's step accepts one more token
        return out

    for _ in range(3):
        sg.step_hook(other, WORKER, batch())
    r.tally.settle(r.checks)
    assert r.checks == 3 and r.tally.mismatches == 3


def test_a_step_whose_capture_is_refused_retries_only_after_more_eager_steps(flow, monkeypatch):
    r, captured = flow
    tries = []
    monkeypatch.setattr(sg, "capture", lambda original, worker, b, tensors, key: tries.append(1))  # returns None
    original, calls = eager_step()
    for _ in range(3 * (sg.WARMUPS + 1)):
        sg.step_hook(original, WORKER, batch())
    assert len(tries) == 3 and len(calls) == 3 * (sg.WARMUPS + 1)


def test_replay_hook_cuts_only_inside_a_capture():
    class Cap:
        cuts = []

        def cut(self, backend, key):
            self.cuts.append(key)

    backend = NS(_outputs={4: "static out"})
    original = lambda self, key, fb, **kw: ("replayed", key)  # noqa: E731
    assert sg.replay_hook(original, backend, 4, None) == ("replayed", 4)
    r = sg.Route(capture=Cap())
    old, sg._route = sg._route, r
    try:
        assert sg.replay_hook(original, backend, 4, None) == "static out" and Cap.cuts == [4]
    finally:
        sg._route = old


def test_keep_hook_makes_the_runner_keep_its_graph_for_that_call_only():
    import sys

    module = sys.modules.get(sg.BACKEND_MODULE) or __import__(sg.BACKEND_MODULE, fromlist=["x"])
    real = module.torch
    seen = {}

    class Graph:
        def __init__(self, keep_graph=False):
            self.keep_graph, self.instantiated = keep_graph, False

        def instantiate(self):
            self.instantiated = True

    def capture_one(self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
        seen["partial"] = module.torch.cuda.CUDAGraph
        seen["other"] = module.torch.is_tensor is torch.is_tensor and module.torch.cuda.Stream is torch.cuda.Stream
        self._graphs[shape_key] = Graph(**module.torch.cuda.CUDAGraph.keywords)
        return "captured"

    backend = NS(_graphs={})
    assert sg.keep_hook(capture_one, backend, 8, None) == "captured"
    assert seen["partial"].keywords == {"keep_graph": True} and seen["other"]
    assert backend._graphs[8].keep_graph and backend._graphs[8].instantiated
    assert module.torch is real

    def failing(*a, **k):
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError):
        sg.keep_hook(failing, backend, 8, None)
    assert module.torch is real


def test_the_backend_makes_its_graph_through_its_module_torch():
    """keep_hook relies on capture_one calling ``torch.cuda.CUDAGraph()`` by its module's ``torch``."""
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    src = inspect.getsource(FullCudaGraphBackend.capture_one)
    assert src.count("torch.cuda.CUDAGraph()") == 1 and "self._graphs[shape_key] = graph" in src
    assert "self._graphs[shape_key].replay()" in inspect.getsource(FullCudaGraphBackend.replay)


def facts(**over):
    base = dict(speculative_algorithm="STANDALONE", topk=1, page_size=16, attention_backends=("triton", "triton"),
                draft_attention_backend=None)
    return ServingFacts(**{**base, **over})


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"speculative_algorithm": "EAGLE3"}, None),
    ({"topk": None}, None),  # not resolved yet: never inert
    ({"topk": 4}, "topk is 4"),
    ({"speculative_algorithm": "NGRAM", "topk": 1}, "inert because --speculative-algorithm is NGRAM"),
    ({"speculative_algorithm": None}, "inert because --speculative-algorithm is unset"),
    ({"tp_size": 2}, "tensor parallelism"),
    ({"dp_attention": True}, "attention DP"),
    ({"disable_cuda_graph": True}, "--disable-cuda-graph"),
    ({"two_batch_overlap": True}, "two-batch overlap"),
    ({"attention_backends": ("fa3", "fa3"), "draft_attention_backend": "fa3"}, "not triton"),
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"speculative_adaptive": True}, "--speculative-adaptive"),
    ({"returns_capture_outputs": True}, "--enable-return-routed-experts"),
    ({"expert_distribution": True}, "expert distribution recording"),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3"}}, None),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "2.5"}}, "draws a new length"),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_METHOD": "multinomial"}}, "draws a new length"),
])
def test_inert_rules(over, reason):
    got = sg.inert(facts(**over))
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("argv, reason", [
    ((), None),
    (("--disable-overlap-schedule",), "--disable-overlap-schedule"),
    (("--speculative-adaptive",), "--speculative-adaptive"),
    (("--enable-return-routed-experts",), "--enable-return-routed-experts"),
    (("--expert-distribution-recorder-mode", "stat"), "expert distribution recording"),
])
def test_the_server_settings_that_keep_sglangs_step_are_inert_at_startup(argv, reason):
    """Read from SGLang's own argument preparation, so the status block and the doctor say it (the
    scheduler's check stays for what SGLang resolves later)."""
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy", "--speculative-algorithm", "STANDALONE",
                                "--speculative-draft-model-path", "dummy", "--speculative-eagle-topk", "1",
                                "--attention-backend", "triton", *argv])
    got = sg.inert(ServingFacts.from_server_args(args, {}))
    assert (got is None) if reason is None else (reason in got), got


def test_a_constant_simulated_draw_is_what_sglang_draws():
    """An integral length under match-expected: SGLang's own sampler returns it every time."""
    from sglang.srt.speculative.spec_utils import sample_simulated_acc_len

    assert {sample_simulated_acc_len(3.0, "match-expected", 4) for _ in range(200)} == {3}
    assert {sample_simulated_acc_len(4.0, "match-expected", 4) for _ in range(50)} == {4}
    assert len({sample_simulated_acc_len(2.5, "match-expected", 4) for _ in range(200)}) == 2


def test_unsafe_pairs_name_catalogue_slots():
    from sglang_hostsync_plugin.registry import catalogue

    names = set(catalogue())
    assert {other for other, _ in sg.SLOT.unsafe_with} <= names


def test_check_setting():
    assert sg.check_every({}) == 0 and sg.check_every({sg.ENV_CHECK: "5"}) == 5
    with pytest.raises(ValueError):
        sg.check_every({sg.ENV_CHECK: "-1"})


def test_targets_are_sglangs_as_pinned():
    from sglang_hostsync_plugin.checks import check_target

    for target in sg.SLOT.targets:
        assert check_target(target) is None, target.path


def test_the_capture_log_names_the_inputs_present():
    assert sg.present(sg.owners(batch())) == ["req_pool_indices[2]", "seq_lens[2]", "out_cache_loc[2, 4]",
                                              "topk_p[2, 1]", "topk_index[2, 1]", "hidden_states[2, 8]",
                                              "temperatures[2, 1]"]


def test_no_driver_leaves_sglangs_step_for_good(monkeypatch, cpu_tensors, caplog):
    r = sg.Route()
    monkeypatch.setattr(sg, "_route", r)
    monkeypatch.setattr(sg, "unsupported", lambda worker: None)

    def no_driver():
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(sg, "Driver", no_driver)
    original, calls = eager_step()
    for _ in range(sg.WARMUPS + 3):
        sg.step_hook(original, WORKER, batch())
    assert len(calls) == sg.WARMUPS + 3 and r.replays == 0 and "graph API" in r.disabled
    assert r.eager == {"capture off": 2} and "libcuda" in caplog.text


class FakeGraph:
    log = []

    def __init__(self, kept=True, fail_end=False):
        self.kept, self.fail_end = kept, fail_end

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.log.append(("begin", id(self), pool, capture_error_mode))

    def capture_end(self):
        self.log.append(("end", id(self)))
        if self.fail_end:
            raise RuntimeError("capture invalidated")

    def raw_cuda_graph(self):
        if not self.kept:
            raise RuntimeError("keep_graph=False")
        return id(self)


def test_capture_segments_alternate_with_the_runner_graphs():
    FakeGraph.log = []
    runners = [NS(_graphs={4: FakeGraph()}), NS(_graphs={4: FakeGraph()}), NS(_graphs={4: FakeGraph()})]
    cap = sg.Capture("pool", new_graph=FakeGraph)
    cap.open()
    for runner in runners:
        cap.cut(runner, 4)
    cap.close()
    kinds = [p[0] for p in cap.parts]
    assert kinds == ["segment", "child", "segment", "child", "segment", "child", "segment"]
    assert [p[3] for p in cap.parts if p[0] == "child"] == [r._graphs[4] for r in runners]
    begins = [e for e in FakeGraph.log if e[0] == "begin"]
    assert len(begins) == 4 and all(e[2:] == ("pool", "thread_local") for e in begins)
    assert len([e for e in FakeGraph.log if e[0] == "end"]) == 4 and cap.current is None


def test_a_runner_graph_not_kept_fails_the_capture_before_the_segment_ends(monkeypatch):
    released = []
    monkeypatch.setattr(sg, "capturing", lambda: False)
    monkeypatch.setattr(sg, "release_pool", released.append)
    cap = sg.Capture("pool", new_graph=lambda: FakeGraph(fail_end=True))
    cap.open()
    with pytest.raises(RuntimeError, match="keep_graph"):
        cap.cut(NS(_graphs={1: FakeGraph(kept=False)}), 1)
    assert cap.current is not None and cap.parts == []
    cap.abort(None)  # ends the open segment; its error is the capture's, already reported
    assert cap.current is None and released == ["pool"]  # its capture_end raised: torch's pool routing undone


def test_the_grammar_barrier_sglang_passes_every_step_does_not_keep_it_eager(flow):
    """The scheduler hands every EAGLE step a grammar barrier (call 1 of 2026-12-06: no step was captured
    while the slot read it as a grammar); only ``batch.has_grammar`` counts."""
    r, captured = flow
    original, calls = eager_step()
    for _ in range(sg.WARMUPS + 3):
        sg.step_hook(original, WORKER, batch(), grammar_barrier=lambda: None)
    assert len(captured) == 1 and r.replays == 3 and not r.eager
    sg.step_hook(original, WORKER, batch(has_grammar=True), grammar_barrier=lambda: None)
    assert r.eager == {"a grammar": 1}


# --- SGLang settings the branch reads per step or returns per step (review of 2026-12-06) ---


def test_the_fields_the_rules_read_are_sglangs():
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    assert {"seq_lens_cpu", "multimodal_inputs", "hisparse_coordinator", "mamba_track_indices",
            "return_logprob", "return_hidden_states"} <= set(ScheduleBatch.__dataclass_fields__)


def test_sglang_stages_host_lengths_and_mrope_deltas_on_those_fields():
    """The two per-step rules stand on these branches of SGLang's step (0.5.23)."""
    from sglang.srt.speculative import eagle_worker_common as common

    src = inspect.getsource(common)
    assert "gpu_only = batch.seq_lens_cpu is None" in src
    assert src.count("all(x is None for x in batch.multimodal_inputs)") == 2


@pytest.mark.parametrize("args, reason", [
    ({}, None),
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"speculative_adaptive": True}, "--speculative-adaptive"),
    ({"enable_return_routed_experts": True}, "--enable-return-routed-experts"),
    ({"enable_return_indexer_topk": True}, "--enable-return-indexer-topk"),
    ({"expert_distribution_recorder_mode": "stat"}, "expert distribution"),  # (EPLB's resolution sets it too)
    ({"enable_unified_memory": True}, "--enable-unified-memory"),
])
def test_server_settings_that_keep_sglangs_step(args, reason):
    """Checked in the scheduler against SGLang's published config (the startup facts ``inert`` sees
    do not hold them)."""
    from sglang.srt.runtime_context import get_context

    try:
        ctx = get_context().override_server_args(**args)
        ctx.__enter__()
    except Exception as exc:  # an argument combination SGLang itself refuses on one GPU
        pytest.skip(f"SGLang refuses {args}: {exc}")
    try:
        got = sg.unsupported(WORKER)
    finally:
        ctx.__exit__(None, None, None)
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("decode, saver, env, reason", [
    (None, False, None, None),  # no --cuda-graph-config: SGLang's default decode backend, full
    ({"backend": "full"}, False, None, None),
    ({"backend": "breakable"}, False, None, "'breakable', not 'full'"),
    (None, True, None, None),  # the saver pauses the KV cache and weights in place: graphs unchanged
    (None, True, "1", "SGLANG_MEMORY_SAVER_CUDA_GRAPH"),  # runner graphs captured into pausable memory
])
def test_the_runner_graphs_must_be_full_backend_graphs_outside_the_memory_saver(monkeypatch, decode, saver, env,
                                                                                  reason):
    """A breakable decode backend's replays are not FullCudaGraphBackend.replay: no capture could cut at
    them (every capture would fail until capturing turns off)."""
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.runtime_context import get_context

    if env is None:
        monkeypatch.delenv("SGLANG_MEMORY_SAVER_CUDA_GRAPH", raising=False)
    else:
        monkeypatch.setenv("SGLANG_MEMORY_SAVER_CUDA_GRAPH", env)
    args = {"enable_memory_saver": saver}
    if decode is not None:
        args["cuda_graph_config"] = CudaGraphConfig.from_dict({"decode": decode})
    with get_context().override_server_args(**args):
        got = sg.unsupported(WORKER)
    assert (got is None) if reason is None else (reason in got), got


def test_a_runner_capture_after_startup_drops_every_step_graph(flow):
    """A weight update with recapture_cuda_graph builds a new runner (its constructor re-allocates the
    attention backend's graph buffers) whose graphs are captured through capture_one: the step graphs
    joined from the old runner must go, with the runners they hold, and be captured again."""
    r, captured = flow
    original, calls = eager_step()
    for bs in (1, 2) * (sg.WARMUPS + 2):
        sg.step_hook(original, WORKER, batch(bs))
    assert len(r.graphs) == 2 and r.driver.launched == [100, 101] * 2
    r.pool, r.pool_bytes = "pool", 1 << 20
    __import__(sg.BACKEND_MODULE, fromlist=["x"])  # (keep_hook swaps its module's torch)
    new_runner = NS(_graphs={})
    sg.keep_hook(lambda self, key, fn, ci=None, ph=None: self._graphs.setdefault(key, None), new_runner, 1, None)
    assert r.graphs == {} and sorted(r.driver.destroyed) == [100, 101] and r.warm == {}
    assert r.pool is None and r.pool_bytes == 0  # a fresh pool; the old one goes with its graphs
    launched = len(r.driver.launched)
    sg.step_hook(original, WORKER, batch(1))
    assert len(r.driver.launched) == launched and len(calls) == 2 * sg.WARMUPS + 1  # eager: warm-up again
    for _ in range(sg.WARMUPS):
        sg.step_hook(original, WORKER, batch(1))
    assert len(captured) == 3 and r.driver.launched[-1] == 102


@pytest.mark.parametrize("owner", ["", "spec", "sampling"])
def test_a_stray_device_tensor_keeps_that_step_eager_after_the_capture(flow, owner):
    """The promise holds per step, not only at the capture: the graph copies only the named inputs."""
    r, captured = flow
    original, calls = eager_step()
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(original, WORKER, batch())
    assert r.replays == 1
    name = f"{owner}__extra_mask" if owner else "extra_mask"
    sg.step_hook(original, WORKER, batch(**{name: torch.ones(2)}))
    assert r.replays == 1 and len(calls) == sg.WARMUPS + 1
    assert r.eager == {"the step reads SimpleNamespace.extra_mask": 1}
    sg.step_hook(original, WORKER, batch())
    assert r.replays == 2


def test_settings():
    assert sg.max_graphs({}) == sg.MAX_GRAPHS == 16 and sg.max_graphs({sg.ENV_MAX: "4"}) == 4
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError):
            sg.max_graphs({sg.ENV_MAX: bad})
    assert sg.settings({sg.ENV_CHECK: "3", sg.ENV_MAX: "5"}) == (3, 5)


def test_prepare_sets_the_graph_limit(monkeypatch):
    r = sg.Route()
    monkeypatch.setattr(sg, "_route", r)
    monkeypatch.setenv(sg.ENV_MAX, "6")
    monkeypatch.delenv(sg.ENV_CHECK, raising=False)
    assert "at most 6 step graphs" in sg.prepare(None) and r.max_graphs == 6 and r.check == 0


# --- the real capture() over fakes of torch's CUDA calls ---


class SideStream:
    """Stands for the capture stream and the allocator routing: what torch's CUDAGraph checks."""

    def __init__(self, log):
        self.log, self.current, self.capturing, self.routed = log, False, False, 0
        self.pools = []  # the pool each capture_begin was given

    @contextlib.contextmanager
    def enter(self, stream):
        self.log.append("enter")
        self.current = True
        try:
            yield
        finally:
            self.current = False
            self.log.append("exit")


class TorchGraph:
    """torch.cuda.CUDAGraph's order: capture_end raises before ending the stream's capture when called
    on another stream; ``invalid`` raises from the end itself (the stream leaves capture, the allocator
    routing stays)."""

    def __init__(self, side, invalid=False):
        self.side, self.invalid = side, invalid

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.side.log.append("begin")
        self.side.pools.append(pool)
        self.side.capturing, self.side.routed = True, self.side.routed + 1

    def capture_end(self):
        if not self.side.current:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self.side.capturing = False
        if self.invalid:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.side.routed -= 1
        self.side.log.append("end")

    def raw_cuda_graph(self):
        return id(self)


def fake_gpu(monkeypatch, slot):
    """``slot`` (eagle_step_graph or a module on its machinery) capturing over fakes of torch's and the
    driver's CUDA calls: its route, side stream, graphs and pool; the capture's own calls are
    eagle_step_graph's (``Capture`` lives there). Returns the route and the side stream."""
    log = []
    side = SideStream(log)
    driver = FakeDriver()
    r = slot.Route(driver=driver, stream="side stream")
    grown = iter(range(0, 1 << 40, 1 << 20))  # 1 MiB more reserved at each reading
    monkeypatch.setattr(slot, "_route", r)
    monkeypatch.setattr(slot, "unsupported", lambda worker: None)
    monkeypatch.setattr(slot, "side_stream", side.enter)
    monkeypatch.setattr(slot, "new_graph", lambda: TorchGraph(side))
    monkeypatch.setattr(slot, "reserved", lambda: next(grown))
    monkeypatch.setattr(slot.torch.cuda, "graph_pool_handle", lambda: f"pool {len(log)}")
    for module in {slot, sg}:
        monkeypatch.setattr(module, "stream_handle", lambda: 7)
    monkeypatch.setattr(sg, "capturing", lambda: side.capturing)

    def release_pool(pool):
        log.append(("release", pool))
        side.routed = 0

    def end_capture(stream):
        driver.ended.append(stream)
        side.capturing = False

    monkeypatch.setattr(sg, "release_pool", release_pool)
    driver.end_capture = end_capture
    return r, side


@pytest.fixture
def gpu(monkeypatch, cpu_tensors):
    return fake_gpu(monkeypatch, sg)


RUNNERS = [NS(_graphs=collections.defaultdict(lambda: TorchGraph(None)),
              _outputs=collections.defaultdict(lambda: "static out")) for _ in range(3)]


def sglang_step(fail_at=None, out=result):
    """A step shaped like EAGLE v2's branch: the three runner replays, fields of the batch rebound
    (the scheduler's isolation restores them), a result. ``fail_at``: a batch size whose step raises
    under capture (a host sync, say) but runs eagerly. ``step.seen``: the (lengths, draft input) each
    call found on the batch."""
    calls, seen = [], []

    def step(worker, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        calls.append(sg._route.capture is not None)
        seen.append((b.seq_lens, b.spec_info))
        bs = len(b.seq_lens)
        for runner in RUNNERS:
            sg.replay_hook(lambda self, key, fb, **kw: "replayed", runner, bs, None)
            if sg._route.capture is not None and bs == fail_at:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        b.spec_info, b.seq_lens, b.input_ids = "verify input", b.seq_lens + 1, torch.zeros(bs)
        return out()

    step.seen = seen
    return step, calls


def test_a_capture_restores_every_field_the_branch_rebinds(gpu):
    r, side = gpu
    step, calls = sglang_step()
    b = batch()
    before = dict(vars(b)), dict(vars(b.spec_info)), dict(vars(b.sampling_info))
    for _ in range(sg.WARMUPS):
        sg.step_hook(step, WORKER, batch())
    sg.step_hook(step, WORKER, b)  # the capture, then its first launch
    assert calls == [False] * sg.WARMUPS + [True] and r.replays == 1
    after = dict(vars(b)), dict(vars(b.spec_info)), dict(vars(b.sampling_info))
    for old, new in zip(before, after):
        assert new.keys() == old.keys() and all(new[k] is old[k] for k in old)  # the scheduler's own tensors


def test_a_failed_capture_is_ended_on_its_stream_and_only_that_key_stays_eager(gpu, caplog):
    r, side = gpu
    step, calls = sglang_step(fail_at=2)
    b = batch(2)
    own = b.seq_lens, b.spec_info
    for _ in range(sg.WARMUPS):
        sg.step_hook(step, WORKER, batch(2))
    sg.step_hook(step, WORKER, b)  # the capture fails; SGLang's step runs on the scheduler's own fields
    assert step.seen[-2][0] is not own[0] and step.seen[-1][0] is own[0] and step.seen[-1][1] is own[1]
    sg.step_hook(step, WORKER, batch(2))  # (warm-up restarted: eager)
    # Ended inside the stream block, so torch's same-stream check passes and the stream leaves capture.
    assert side.log == ["enter", "begin", "end", "begin", "end", "exit"]  # raised after the first runner
    assert not side.capturing and side.routed == 0 and r.driver.ended == []
    key = (2, sg.gather(sg.owners(batch(2)))[0])
    assert r.failures == {key: 1} and r.failed == 1 and not r.disabled and r.pool is None
    assert calls == [False] * sg.WARMUPS + [True, False, False] and r.replays == 0  # the failed step ran eagerly
    # Another batch size is captured and replayed; the failed one retries once more, then stays SGLang's.
    for _ in range(sg.WARMUPS + 2):
        sg.step_hook(step, WORKER, batch(3))
    assert r.replays == 2 and list(r.graphs) == [(3, sg.gather(sg.owners(batch(3)))[0])]
    for _ in range(sg.WARMUPS + 3):
        sg.step_hook(step, WORKER, batch(2))
    assert r.failures == {key: sg.MAX_FAILURES} and r.eager == {f"bs 2: its capture failed {sg.MAX_FAILURES} times": 3}
    assert "capturing the bs 2 step failed (1 of 2" in caplog.text


def test_a_capture_whose_end_raises_leaves_the_stream_and_the_pool_routing_clean(gpu, monkeypatch):
    """torch raised from the end itself (an invalidated capture): the stream is checked and ended
    through the driver if still capturing, and torch's routing of allocations to the pool undone."""
    r, side = gpu
    monkeypatch.setattr(sg, "new_graph", lambda: TorchGraph(side, invalid=True))
    step, calls = sglang_step(fail_at=2)
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(step, WORKER, batch(2))
    assert not side.capturing and side.routed == 0 and ("release", "pool 0") in side.log
    assert r.failed == 1 and r.graphs == {}


def test_the_stream_is_ended_by_the_driver_when_torch_could_not(gpu, monkeypatch):
    r, side = gpu

    class Stuck(TorchGraph):
        def capture_end(self):
            raise RuntimeError("an error before cudaStreamEndCapture")

    monkeypatch.setattr(sg, "new_graph", lambda: Stuck(side))
    step, calls = sglang_step(fail_at=2)
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(step, WORKER, batch(2))
    assert r.driver.ended == [7] and not side.capturing and side.routed == 0


def test_failed_captures_in_all_are_bounded(gpu):
    r, side = gpu
    step, calls = sglang_step(fail_at=None)
    failing = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("capture failed"))  # noqa: E731
    original = lambda worker, b, *a: (failing() if sg._route.capture is not None else step(worker, b))  # noqa: E731
    for bs in range(1, sg.MAX_FAILED + 2):
        for _ in range(sg.WARMUPS + 1):
            sg.step_hook(original, WORKER, batch(bs))
    assert r.failed == sg.MAX_FAILED and "captures failed" in r.disabled
    assert r.eager.get("capture off") == sg.WARMUPS + 1


def pool_capture(step, side, bs):
    """Warm-ups then a capture of ``bs``; the pool its segments went into."""
    start = len(side.pools)
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(step, WORKER, batch(bs))
    assert len(side.pools) > start and len(set(side.pools[start:])) == 1  # one pool for a step's segments
    return side.pools[-1]


def test_a_capture_goes_into_a_pool_only_while_a_held_graph_was_captured_into_it(gpu, monkeypatch):
    """A pool lives while a graph captured into it does: torch refuses a capture into one whose graphs
    are all gone (DFlash on an H100, 2026-12-07). A held graph captured into the pool keeps it usable."""
    r, side = gpu
    step, calls = sglang_step()
    first = pool_capture(step, side, 1)
    assert pool_capture(step, side, 2) == first
    monkeypatch.setattr(sg.StepGraph, "current", lambda self: self.bs != 1)
    assert pool_capture(step, side, 1) == first and len(r.graphs) == 2  # the bs-2 graph holds the pool
    r.graphs.pop(next(k for k in r.graphs if k[0] == 2))  # (one graph left, as if bs 2 had never run)
    monkeypatch.setattr(sg.StepGraph, "current", lambda self: False)
    fresh = pool_capture(step, side, 1)  # its stale graph was the last one held
    assert fresh != first and r.pool == fresh and len(r.graphs) == 1


def test_after_a_failed_capture_a_graph_in_another_pool_does_not_keep_the_new_one(gpu, monkeypatch):
    """A failed capture leaves its pool; the next goes into a fresh one while the first pool's graph is
    still held. Once the second pool's only graph goes stale, a capture takes a third pool, and the
    held graphs' memory stays counted."""
    r, side = gpu
    step, calls = sglang_step(fail_at=2)
    a = pool_capture(step, side, 1)
    held = r.pool_bytes
    assert held > 0
    pool_capture(step, side, 2)  # fails: its pool is left
    assert r.failed == 1 and r.pool is None and len(r.graphs) == 1
    b = pool_capture(step, side, 3)
    assert b != a and len(r.graphs) == 2 and r.pool_bytes > held
    monkeypatch.setattr(sg.StepGraph, "current", lambda self: self.bs != 3)
    again = pool_capture(step, side, 3)
    assert again not in (a, b) and [g.pool for g in r.graphs.values()] == [a, again]


def test_captures_count_graphs_and_pool_growth_in_the_log(gpu, caplog):
    r, side = gpu
    step, calls = sglang_step()
    caplog.set_level("INFO", logger="sglang.srt.plugins.hostsync")
    for bs in (1, 2):
        for _ in range(sg.WARMUPS + 1):
            sg.step_hook(step, WORKER, batch(bs))
    assert len(r.graphs) == 2 and r.pool_bytes == 2 << 20
    assert "1 graphs, pool 1.0 MiB" in caplog.text and "2 graphs, pool 2.0 MiB" in caplog.text
    assert "1 steps replayed (1 graphs, pool 1.0 MiB)" in caplog.text


def host_read_fields():
    """What the scheduler reads of a step's result, from SGLang's own code: the fields
    ``GenerationBatchResult.copy_to_cpu`` reads (after the next step was launched, on the copy
    stream), and ``new_seq_lens`` (published, the next step's lengths); and the logits output's."""
    from sglang.srt.managers.utils import GenerationBatchResult as Result

    src = inspect.getsource(Result.copy_to_cpu) + inspect.getsource(Result.copy_auxiliary_output_to_cpu)
    fields = set(Result.__dataclass_fields__)
    read = ({m for m in re.findall(r"self\.(\w+)", src) if m in fields} | {"new_seq_lens"}) - {"copy_done"}
    logits = set(re.findall(r"self\.logits_output\.(\w+)", src))
    assert {"next_token_ids", "accept_lens", "routed_experts_output", "logits_output"} <= read
    return read - {"logits_output"}, logits


def test_every_output_the_scheduler_reads_is_handed_out_fresh_or_keeps_sglangs_step():
    """Independent of the slot's own lists: each field SGLang's result processing reads, set on the
    captured result, is either a new tensor per replay (equal, not the captured one, which the next
    replay overwrites) or turns the step graph down."""
    read, logits = host_read_fields()
    for name in sorted(read):
        captured = result()
        if getattr(captured, name, None) is None:
            setattr(captured, name, torch.arange(3) + 7)
        if sg.side_output(captured) == name:
            continue
        assert sg.side_output(captured) is None, name
        got, kept = getattr(sg.StepGraph(3, [], captured, [], 0, 0).output(), name), getattr(captured, name)
        assert torch.is_tensor(got) and got is not kept and got.data_ptr() != kept.data_ptr(), name
        assert torch.equal(got, kept), name
    # Logprobs and hidden states are read only where the batch asks for them: those steps stay eager.
    on_request = {n for n in logits if "logprob" in n or n == "hidden_states"}
    assert on_request and sg.ineligible(WORKER, batch(return_logprob=True), None)
    assert sg.ineligible(WORKER, batch(return_hidden_states=True), None)
    for name in sorted(logits - on_request):
        captured = result()
        captured.logits_output = NS(**{name: object()})
        assert sg.side_output(captured) == f"logits_output.{name}"


def test_a_step_returning_routed_experts_stays_sglangs(gpu):
    r, side = gpu

    def with_experts():
        out = result()
        out.routed_experts_output = NS(topk_ids=torch.zeros(3, 8))
        return out

    step, calls = sglang_step(out=with_experts)
    for _ in range(sg.WARMUPS + 3):
        sg.step_hook(step, WORKER, batch())
    assert r.replays == 0 and r.graphs == {} and "routed_experts_output" in r.disabled
    assert r.eager == {"capture off": 2} and len(calls) == sg.WARMUPS + 1 + 1 + 2


def test_the_doctor_reads_the_settings_that_make_the_step_graph_inert():
    from sglang_hostsync_plugin import doctor

    base = ["doctor", "--speculative-algorithm", "STANDALONE", "--speculative-eagle-topk", "1", "--attention-backend",
            "triton"]
    for flag in (["--disable-overlap-schedule"], ["--speculative-adaptive"], ["--enable-return-routed-experts"],
                 ["--enable-return-indexer-topk"], ["--expert-distribution-recorder-mode", "stat"], ["--enable-eplb"]):
        facts = doctor.facts_of(doctor._parser().parse_args([*base, *flag]))
        assert sg.inert(facts) is not None, flag
    assert sg.inert(doctor.facts_of(doctor._parser().parse_args(base))) is None
