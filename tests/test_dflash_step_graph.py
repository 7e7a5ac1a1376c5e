"""dflash_step_graph on the CPU: which steps stay eager and why, the inputs it
stages and the tensors it ignores, the result it hands out, the capture/replay flow around fakes
(``capture()`` itself over fakes of torch's CUDA graph and stream calls, with a worker whose buffers
grow by SGLang's own ``_ensure_*`` methods, fused KV helper or not): warm-ups, pre-sizing on a key's
first step (before its warm-ups, never under capture; the workspace to a prefill's size), the
capture, the ``record_stream`` and per-step input copy, the clones, ``on_publish`` after the launch,
a failed capture putting the batch and the worker back, a worker flag SGLang turns off during a
capture (and a source scan for new fallbacks), buffers that grow after a capture (every stale graph
dropped at once), each graph's own accept buffers (slot 0 alone); the check (draft KV rows
included); the rules (per step, capture off first, the scheduler's with the decode graph backend and
the memory saver, startup) against SGLang 0.5.23's code, the pinned sources, the plan beside
``eagle_step_graph`` and the default slots (its registration: test_dspark_step_graph.py); the GPU e2e's
run helper past its timeout. The joined graph runs in the real-server e2e,
tests/test_gpu_block_step_graph.py."""

import collections
import inspect
import re
from types import SimpleNamespace as NS

import pytest
import torch
from sglang.kernels.ops.speculative.fused_kv_materialize import FusedKVMaterializeHelper
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from sglang_hostsync_plugin.slot import ServingFacts, Status
from sglang_hostsync_plugin.slots import dflash_step_graph as dsg
from sglang_hostsync_plugin.slots import eagle_step_graph as es
from test_eagle_step_graph import FakeDriver, Mode, TorchGraph, fake_gpu

BLOCK = 4  # the draft block (SGLang's verify width for DFlash)


def backend(name, **attrs):
    return type(name, (), attrs)()


def host(t: torch.Tensor) -> torch.Tensor:
    """A tensor that stands for a host one (the ``cpu_tensors`` fixture counts the others as device)."""
    t.host = True
    return t


def batch(bs=2, **over):
    b = NS(forward_mode=Mode(), is_extend_in_batch=False, return_logprob=False, return_hidden_states=False,
           has_grammar=False, hisparse_coordinator=None, mamba_track_indices=None, seq_lens_cpu=None,
           multimodal_inputs=[None] * bs, seq_lens=torch.arange(bs) + 10, req_pool_indices=torch.arange(bs),
           orig_seq_lens=torch.arange(bs, dtype=torch.int32) + 3,
           # A prefill's leftovers, rebound by the branch before anything reads them (ignored):
           input_ids=torch.arange(37), out_cache_loc=torch.arange(37),
           spec_info=NS(bonus_tokens=torch.arange(bs) + 100, future_indices=torch.arange(bs),
                        new_seq_lens=torch.arange(bs) + 9, topk_p=torch.ones(bs, 0), topk_index=torch.zeros(bs, 0),
                        hidden_states=torch.zeros(bs, 0),
                        nxt_kv_lens_cpu=host(torch.full((bs,), 64, dtype=torch.int32)),
                        nxt_kv_lens_sum=64 * bs, _prepare_cur_kv_lens_gpu_buf=torch.zeros(32, dtype=torch.int32),
                        _prepare_nxt_kv_lens_gpu_buf=torch.zeros(32, dtype=torch.int32),
                        _prepare_nxt_kv_lens_cpu_buf=host(torch.zeros(32, dtype=torch.int32))),
           sampling_info=NS(is_all_greedy=True, has_custom_logit_processor=False, acc_additive_penalties=None,
                            acc_scaling_penalties=None, logit_bias=None, has_watermark_candidates=False,
                            sampling_mask_batch_indices=None, grammar_mask=None, temperatures=torch.ones(bs, 1),
                            penalizer_orchestrator=NS(is_required=False)))
    for key, value in over.items():
        owner, _, name = key.rpartition("__")
        setattr({"": b, "spec": b.spec_info, "sampling": b.sampling_info}[owner], name, value)
    return b


# --- a worker whose buffers grow by SGLang's own code ---


class Helper:
    """FusedKVMaterializeHelper's workspace state, grown by its own ``_ensure_workspace``."""

    _ensure_workspace = FusedKVMaterializeHelper._ensure_workspace

    def __init__(self):
        self.n_layers, self.layer_out_dim, self.num_kv_heads, self.head_dim, self.device = 1, 4, 1, 2, "cpu"
        self._workspace_capacity, self._workspace_dtype = 0, None
        self._proj_workspace = self._k_workspace = self._v_workspace = None
        self.flat_kv_weight_t = torch.zeros(3, 4, dtype=torch.bfloat16)
        self._mm_out_supported = True


class Pool:
    """The draft KV pool: one layer's K and V."""

    def __init__(self, size=256):
        self.k, self.v = torch.zeros(size, 1, 2), torch.zeros(size, 1, 2)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


class Worker:
    _ensure_draft_block_buffers = DFlashWorkerV2._ensure_draft_block_buffers
    _ensure_accept_bonus_buffers = DFlashWorkerV2._ensure_accept_bonus_buffers
    _next_accept_bonus_buffers = DFlashWorkerV2._next_accept_bonus_buffers

    def __init__(self, max_bs=4, fused=True):
        self.block_size, self.device = BLOCK, "cpu"
        triton = backend("TritonAttnBackend")
        self.model_runner = NS(decode_cuda_graph_runner=NS(max_bs=max_bs), attn_backend=triton,
                               kv_index_translator=NS(is_translating=False))
        self.draft_model_runner = NS(attn_backend=triton, kv_index_translator=NS(is_translating=False),
                                     token_to_kv_pool=Pool())
        self.draft_model = NS(layers=[NS(self_attn=NS(attn=NS(layer_id=0)))])
        self._draft_block_ids_buf = self._draft_block_positions_buf = self._draft_block_tokens_buf = None
        self._draft_verify_out_cache_loc_buf = self._draft_block_end_buf = self._draft_seq_lens_cpu_buf = None
        self._accept_bonus_buffer_cap, self._accept_bonus_buffer_slot, self._accept_len_buf = 0, 0, None
        self._commit_lens_bufs, self._bonus_id_bufs, self._out_tokens_bufs, self._new_seq_lens_bufs = [], [], [], []
        self._use_triton_prepare_block = self._use_triton_accept_bonus = self._use_triton_compact_rebuild = True
        self._use_fused_kv_materialize = fused
        self._fused_kv_helper = Helper() if fused else None
        self._need_mamba_verify_commit, self.selector, self.lilicorr, self._is_domino = False, None, None, False
        self._draft_sampler, self.use_compact_draft_cache = object(), False


@pytest.fixture
def cpu_tensors(monkeypatch):
    """CPU tensors stand for the device's, but those ``host()`` marked."""
    monkeypatch.setattr(dsg, "on_device", lambda v: torch.is_tensor(v) and not getattr(v, "host", False))


PREFILL_TOKENS = dsg.prefill_tokens  # SGLang's setting, read under a runtime context (its own test)


@pytest.fixture(autouse=True)
def stream_and_schedule(monkeypatch):
    """What the module reads from CUDA and the scheduler's settings: ``record_stream`` records the
    tensors it was given (``.recorded``); a prefill is at most ``.prefill`` tokens (0: none past a
    decode step's)."""
    fakes = NS(recorded=[], prefill=0)
    monkeypatch.setattr(dsg, "record_stream", fakes.recorded.append)
    monkeypatch.setattr(dsg, "prefill_tokens", lambda: fakes.prefill)
    return fakes


# --- per-step rules ---


@pytest.mark.parametrize("over, reason", [
    ({"forward_mode": Mode("extend")}, "not a decode step"),
    ({"forward_mode": Mode("idle")}, "not a decode step"),
    ({"is_extend_in_batch": True}, "not a decode step"),
    ({"spec_info": None}, "no draft input"),
    ({"sampling_info": None}, "sampling info"),
    ({"return_logprob": True}, "logprobs"),
    ({"return_hidden_states": True}, "hidden states"),
    ({"has_grammar": True}, "a grammar"),
    ({"sampling__is_all_greedy": False}, "non-greedy"),
    ({"sampling__has_custom_logit_processor": True}, "custom logit processor"),
    ({"sampling__acc_additive_penalties": torch.ones(2)}, "penalties"),
    ({"sampling__acc_scaling_penalties": torch.ones(2)}, "penalties"),
    ({"sampling__acc_linear_penalties": torch.ones(2)}, "penalties"),
    # A required penalizer (frequency, presence, min-new-tokens...): dflash_utils' no-op test reads it.
    ({"sampling__penalizer_orchestrator": NS(is_required=True)}, "penalties"),
    ({"sampling__logit_bias": torch.ones(2)}, "logit bias"),
    ({"sampling__has_watermark_candidates": True}, "watermark"),
    ({"sampling__sampling_mask_batch_indices": torch.arange(2)}, "sampling masks"),
    ({"sampling__grammar_mask": object()}, "sampling masks"),
    ({"hisparse_coordinator": object()}, "hisparse"),
    ({"mamba_track_indices": torch.ones(2)}, "mamba"),
    # A host mirror of the lengths: the branch derives its host bounds from it (W:2625, W:2841).
    ({"seq_lens_cpu": torch.tensor([10, 11])}, "host sequence lengths"),
    # Neither host source: the branch loops over batch.reqs (W:2634).
    ({"spec__nxt_kv_lens_cpu": None}, "no host KV bound"),
    ({"multimodal_inputs": [None, object()]}, "multimodal inputs"),
])
def test_steps_the_graph_cannot_hold_stay_eager(over, reason):
    assert dsg.ineligible(None, batch(), None) is None
    assert reason in dsg.ineligible(None, batch(**over), None)


def test_a_penalizer_that_is_not_required_keeps_the_step():
    assert dsg.ineligible(None, batch(sampling__penalizer_orchestrator=None), None) is None


def test_a_pp_step_stays_eager():
    assert "PP" in dsg.ineligible(None, batch(), object())


def test_the_fields_the_rules_read_are_sglangs():
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    assert {"seq_lens_cpu", "multimodal_inputs", "hisparse_coordinator", "mamba_track_indices", "return_logprob",
            "return_hidden_states", "is_extend_in_batch", "forward_mode"} <= set(ScheduleBatch.__dataclass_fields__)
    assert {"is_all_greedy", "has_custom_logit_processor", "acc_additive_penalties", "acc_scaling_penalties",
            "logit_bias", "has_watermark_candidates", "sampling_mask_batch_indices",
            "grammar_mask", "penalizer_orchestrator"} <= set(SamplingBatchInfo.__dataclass_fields__)
    assert "nxt_kv_lens_cpu" in DFlashDraftInputV2.__dataclass_fields__


def decode_branch() -> str:
    """The decode branch past its idle case (idle steps stay eager)."""
    src = inspect.getsource(DFlashWorkerV2.forward_batch_generation)
    src = src[src.index("# Decode / target-verify stage."):]
    return src[src.index("bs = len(batch.seq_lens)"):]


def test_sglang_decides_its_host_bounds_on_the_fields_the_rules_read():
    """The host-length rules stand on these branches of SGLang's decode step (0.5.23)."""
    src = decode_branch()
    assert src.count("if batch.seq_lens_cpu is not None:") == 1
    assert src.count("if seq_lens_cpu_backup is not None:") == 1
    assert src.count("elif draft_input.nxt_kv_lens_cpu is not None:") == 2
    assert "for i, req in enumerate(batch.reqs):" in src  # the fallback the nxt_kv_lens_cpu rule avoids


# --- inputs and the ignore list ---


def test_inputs_are_gathered_in_name_order_and_the_ignored_tensors_are_not(cpu_tensors):
    b = batch()
    layout, tensors = dsg.gather(dsg.owners(b))
    assert [id(t) for t in tensors] == [id(b.req_pool_indices), id(b.seq_lens), id(b.orig_seq_lens),
                                        id(b.spec_info.bonus_tokens), id(b.spec_info.future_indices),
                                        id(b.sampling_info.temperatures)]
    assert len(layout) == sum(map(len, dsg.INPUTS)) and layout.count(None) == len(layout) - 6
    assert dsg.stray_input(dsg.owners(b)) is None  # the prefill's input_ids / out_cache_loc, the draft's leftovers
    # A prefill's leftovers of another length do not change the key either.
    assert dsg.gather(dsg.owners(batch(input_ids=torch.arange(5), out_cache_loc=None)))[0] == layout


@pytest.mark.parametrize("name, where", [
    ("engram_history", ""), ("draft_probs", "spec"), ("vocab_mask", "sampling"),
    ("seq_lens_cpu", ""),  # a device tensor there (the rule reads host ones)
    ("custom_mask", "spec"),
])
def test_a_stray_device_tensor_is_named(cpu_tensors, name, where):
    key = f"{where}__{name}" if where else name
    assert dsg.stray_input(dsg.owners(batch(**{key: torch.ones(2)}))) == f"SimpleNamespace.{name}"


def test_the_ignore_list_is_not_a_blanket_host_rule(cpu_tensors):
    """An ignored name is ignored on its own object only: the batch's input_ids on the draft input is stray."""
    assert dsg.stray_input(dsg.owners(batch(spec__input_ids=torch.ones(2)))) == "SimpleNamespace.input_ids"
    assert dsg.stray_input(dsg.owners(batch(new_seq_lens=torch.ones(2)))) == "SimpleNamespace.new_seq_lens"


def test_every_input_and_ignored_name_is_a_field_sglang_has():
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    for cls, names, ignored in zip((ScheduleBatch, DFlashDraftInputV2, SamplingBatchInfo), dsg.INPUTS, dsg.IGNORED):
        fields = set(cls.__dataclass_fields__)
        assert set(names) | set(ignored) <= fields, (cls.__name__, (set(names) | set(ignored)) - fields)


def test_every_device_field_of_the_draft_input_is_an_input_or_ignored():
    """A device tensor SGLang adds to DFlashDraftInputV2 would keep every step eager (or be read stale):
    this fails until it is sorted into the inputs or the ignore list."""
    import dataclasses

    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    tensors = {f.name for f in dataclasses.fields(DFlashDraftInputV2) if "Tensor" in str(f.type)}
    device = {n for n in tensors if "_cpu" not in n}
    sorted_ = set(dsg.DRAFT_INPUTS) | set(dsg.DRAFT_IGNORED)
    assert device == sorted_, device ^ sorted_


def test_the_ignored_tensors_are_rebound_or_unread_by_the_decode_branch():
    """Why the ignore list is safe, from SGLang's source: the batch's out_cache_loc is set before its
    first read and its input_ids only in prepare_for_verify (set before init_new reads it); the
    draft input's ignored fields are never read by the branch."""
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    src = decode_branch()
    uses = [m.start() for m in re.finditer(r"batch\.out_cache_loc\b", src)]
    assert uses and src[uses[0]:].startswith("batch.out_cache_loc = verify_out_cache_loc")
    assert uses[0] < src.index("verify_input.prepare_for_verify(") and "batch.input_ids" not in src
    verify = inspect.getsource(DFlashVerifyInput.prepare_for_verify)
    assert verify.index("batch.input_ids = self.draft_token") < verify.index("ForwardBatch.init_new(")
    for name in dsg.DRAFT_IGNORED:
        assert f"draft_input.{name}" not in src, name


def test_install_puts_the_graph_tensors_in_place():
    b = batch()
    _, tensors = dsg.gather(dsg.owners(b))
    slots = [t.clone() for t in tensors]
    dsg.install(dsg.owners(b), slots)
    assert [id(t) for t in dsg.gather(dsg.owners(b))[1]] == [id(t) for t in slots]


def test_the_capture_log_names_the_inputs_present():
    assert dsg.present(dsg.owners(batch())) == ["req_pool_indices[2]", "seq_lens[2]", "orig_seq_lens[2]",
                                                "bonus_tokens[2]", "future_indices[2]", "temperatures[2, 1]"]


# --- the handed-out result ---


def result(bs=3):
    return NS(next_token_ids=torch.arange(bs * BLOCK), accept_lens=torch.ones(bs, dtype=torch.int32),
              new_seq_lens=torch.arange(bs) + 5, logits_output=NS(), can_run_cuda_graph=True,
              next_draft_input=NS(bonus_tokens=torch.arange(bs), new_seq_lens=torch.arange(bs) + 5),
              extra_keep_alive_refs=None)


def test_the_handed_out_result_clones_what_the_host_reads():
    step = dsg.StepGraph(3, [], result(), [], 0, 0)
    out = step.output()
    for name in dsg.CLONED:
        got, kept = getattr(out, name), getattr(step.result, name)
        assert got is not kept and got.data_ptr() != kept.data_ptr() and torch.equal(got, kept)
    assert out.next_draft_input is not step.result.next_draft_input  # the scheduler sets fields on it
    assert out.next_draft_input.bonus_tokens is step.result.next_draft_input.bonus_tokens  # relayed in stream order
    out.extra_keep_alive_refs.append(1)
    assert step.result.extra_keep_alive_refs is None


def host_read_fields():
    from sglang.srt.managers.utils import GenerationBatchResult as Result

    src = inspect.getsource(Result.copy_to_cpu) + inspect.getsource(Result.copy_auxiliary_output_to_cpu)
    fields = set(Result.__dataclass_fields__)
    read = ({m for m in re.findall(r"self\.(\w+)", src) if m in fields} | {"new_seq_lens"}) - {"copy_done"}
    assert {"next_token_ids", "accept_lens", "logits_output"} <= read
    return read - {"logits_output"}


def test_every_output_the_scheduler_reads_is_handed_out_fresh_or_keeps_sglangs_step():
    for name in sorted(host_read_fields()):
        captured = result()
        if getattr(captured, name, None) is None:
            setattr(captured, name, torch.arange(3) + 7)
        if dsg.side_output(captured) == name:
            continue
        assert dsg.side_output(captured) is None, name
        got, kept = getattr(dsg.StepGraph(3, [], captured, [], 0, 0).output(), name), getattr(captured, name)
        assert torch.is_tensor(got) and got is not kept and got.data_ptr() != kept.data_ptr(), name


def test_fingerprint_compares_float_bits_and_the_committed_draft_kv_rows():
    worker = Worker()
    dsg.presize(worker, 3)
    worker._draft_verify_out_cache_loc_buf[:3] = torch.arange(12).view(3, BLOCK)
    r = result()
    r.accept_lens = torch.tensor([1, 2, 4], dtype=torch.int32)
    a = dsg.fingerprint(r, worker)
    assert all(not t.is_floating_point() for t in a) and len(a) == len(dsg.CLONED) + 1 + 2  # + K and V of 1 layer
    pool = worker.draft_model_runner.token_to_kv_pool
    pool.k[1] = 7.0  # slot 1: request 0's second block slot, past its 1 committed token
    assert all(torch.equal(x, y) for x, y in zip(a, dsg.fingerprint(r, worker)))
    pool.v[5] = float("nan")  # request 1's second slot: committed
    b, c = dsg.fingerprint(r, worker), dsg.fingerprint(r, worker)
    assert not torch.equal(a[-1], b[-1]) and torch.equal(b[-1], c[-1])  # NaN == NaN by bits


# --- the step hook around a fake capture ---


@pytest.fixture
def flow(monkeypatch, cpu_tensors):
    r = dsg.Route(driver=FakeDriver())
    monkeypatch.setattr(dsg, "_route", r)
    monkeypatch.setattr(dsg, "stream_handle", lambda: 0)
    captured = []
    worker = Worker()
    dsg.presize(worker, 4)
    worker._draft_verify_out_cache_loc_buf.copy_(torch.arange(4 * BLOCK).view(4, BLOCK))

    def fake_capture(original, w, b, tensors, key):
        step = dsg.StepGraph(len(b.seq_lens), [t.clone() for t in tensors], result(len(b.seq_lens)), [], 1,
                             len(captured) + 100, state=dsg.worker_state(w))
        captured.append(step)
        return step

    monkeypatch.setattr(dsg, "capture", fake_capture)
    return r, captured, worker


def eager_step(out=result):
    calls = []

    def original(worker, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        calls.append(on_publish)
        return out(len(b.seq_lens))

    return original, calls


def test_two_eager_steps_then_a_capture_then_replays(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    published = []
    for _ in range(6):
        dsg.step_hook(original, worker, batch(), on_publish=published.append)
    assert len(calls) == es.WARMUPS and len(captured) == 1 and r.replays == 6 - es.WARMUPS
    assert r.driver.launched == [100] * (6 - es.WARMUPS) and all(calls)  # eager steps got on_publish themselves
    assert len(published) == 6 - es.WARMUPS
    b = batch()
    b.seq_lens.fill_(77)
    b.spec_info.bonus_tokens.fill_(5)
    dsg.step_hook(original, worker, b)
    assert torch.equal(captured[0].slots[1], b.seq_lens) and torch.equal(captured[0].slots[3], b.spec_info.bonus_tokens)
    dsg.step_hook(original, worker, batch(orig_seq_lens=None))  # another layout: its own warm-up
    assert len(calls) == es.WARMUPS + 1 and len(r.warm) == 2


def test_on_publish_gets_the_cloned_lengths_after_the_launch(flow):
    r, captured, worker = flow
    order = []
    r.driver.launch = lambda exe, stream: order.append("launch")
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(original, worker, batch(), on_publish=lambda lens: order.append(lens))
    kept = captured[0].result.new_seq_lens
    assert [x if isinstance(x, str) else "publish" for x in order] == ["launch", "publish"] * 2
    assert all(x is not kept and torch.equal(x, kept) for x in order if not isinstance(x, str))


def test_a_stray_device_tensor_keeps_that_step_eager_after_the_capture(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(original, worker, batch())
    dsg.step_hook(original, worker, batch(spec__extra_mask=torch.ones(2)))
    assert r.replays == 1 and len(calls) == es.WARMUPS + 1
    assert r.eager == {"the step reads SimpleNamespace.extra_mask": 1}
    dsg.step_hook(original, worker, batch())
    assert r.replays == 2


def test_disabled_skipped_and_ineligible_steps_run_sglangs_branch(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    dsg.step_hook(original, worker, batch(seq_lens_cpu=host(torch.tensor([10, 11]))))
    r.skip.add(2)
    for _ in range(4):
        dsg.step_hook(original, worker, batch(2))
    r.disabled = "capture failed"
    for _ in range(4):
        dsg.step_hook(original, worker, batch(3))
    assert len(calls) == 9 and not captured and r.replays == 0
    assert set(r.eager) == {"host sequence lengths (seq_lens_cpu)", "bs 2 has no step graph", "capture off"}


def test_the_number_of_graphs_is_bounded(flow):
    r, captured, worker = flow
    r.max_graphs = 2
    original, calls = eager_step()
    for bs in (1, 2, 3) * 3 + (3, 3):
        dsg.step_hook(original, worker, batch(bs))
    assert len(captured) == 2 and r.eager == {f"2 step graphs held already ({es.ENV_MAX})": 3}


def test_a_nested_call_inside_a_capture_is_sglangs(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    r.capture = object()
    dsg.step_hook(original, worker, batch())
    assert len(calls) == 1 and not r.eager


@pytest.mark.parametrize("change", ["block buffers", "workspace", "flag", "helper flag"])
def test_a_graph_whose_worker_buffers_or_flags_changed_is_dropped_and_captured_again(flow, change):
    """An eager step past the pre-sized batch size grows the draft block buffers (SGLang frees the old
    ones the graph points at); a prefill past the workspace grows the fused KV helper's; a swallowed
    error turns a path off. The graph goes at its next step, which warms up again."""
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(original, worker, batch(2))
    assert r.replays == 2 and len(r.graphs) == 1
    helper = worker._fused_kv_helper
    if change == "block buffers":
        worker._ensure_draft_block_buffers(9)
    elif change == "workspace":
        helper._ensure_workspace(1000, helper.flat_kv_weight_t.dtype)
    elif change == "flag":
        worker._use_triton_accept_bonus = False
    else:
        helper._mm_out_supported = False
    dsg.step_hook(original, worker, batch(2))
    assert r.driver.destroyed == [100] and not r.graphs and r.replays == 2 and len(calls) == es.WARMUPS + 1
    for _ in range(es.WARMUPS):
        dsg.step_hook(original, worker, batch(2))
    assert len(captured) == 2 and r.driver.launched[-1] == 101


def test_an_unchanged_worker_keeps_its_graph(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(original, worker, batch(2))
    worker._ensure_draft_block_buffers(4)  # (no growth: within the pre-sized capacity)
    worker._fused_kv_helper._ensure_workspace(4 * BLOCK, worker._fused_kv_helper.flat_kv_weight_t.dtype)
    for _ in range(3):
        dsg.step_hook(original, worker, batch(2))
    assert r.replays == 4 and not r.driver.destroyed


def test_the_check_runs_sglangs_step_after_the_replay_and_serves_its_result(flow):
    r, captured, worker = flow
    r.check = 2
    eager, calls = eager_step()
    returned = []

    def original(*args):
        returned.append(eager(*args))
        return returned[-1]

    published = []
    outs = [dsg.step_hook(original, worker, batch(), on_publish=published.append) for _ in range(es.WARMUPS + 4)]
    assert r.checks == 2 and len(calls) == es.WARMUPS + 2 and calls[-1] is None
    assert len(published) == 4 and r.replays == 4
    assert outs[es.WARMUPS + 1] is returned[-2] and published[1] is returned[-2].new_seq_lens
    r.tally.settle(r.checks)
    assert r.tally.mismatches == 0


@pytest.mark.parametrize("write_at, mismatches", [(0, 3), (BLOCK - 1, 0)])
def test_the_check_counts_draft_kv_rows_that_differ_from_sglangs(flow, write_at, mismatches):
    """SGLang's step writes a draft KV row the replay did not: a mismatch where the row is committed
    (accept length 1: slot 0 of each request), none past it."""
    r, captured, worker = flow
    r.check = 1
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dsg.step_hook(original, worker, batch())
    worker._draft_verify_out_cache_loc_buf[:2] = torch.arange(2 * BLOCK).view(2, BLOCK)
    pool = worker.draft_model_runner.token_to_kv_pool

    def other(w, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        pool.k[write_at] += 1.0  # request 0's block slot ``write_at``
        return result(len(b.seq_lens))

    for _ in range(3):
        dsg.step_hook(other, worker, batch())
    r.tally.settle(r.checks)
    assert r.checks == 3 and r.tally.mismatches == mismatches


def test_the_check_counts_a_replay_whose_outputs_differ(flow):
    r, captured, worker = flow
    r.check = 1
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dsg.step_hook(original, worker, batch())

    def other(w, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        out = result(len(b.seq_lens))
        out.next_draft_input.bonus_tokens = out.next_draft_input.bonus_tokens + 1
        return out

    for _ in range(3):
        dsg.step_hook(other, worker, batch())
    r.tally.settle(r.checks)
    assert r.checks == 3 and r.tally.mismatches == 3


def test_replay_hook_cuts_only_inside_this_slots_capture(monkeypatch):
    cuts = []
    cap = NS(cut=lambda backend, key: cuts.append(key))
    runner = NS(_outputs={4: "static out"})
    original = lambda self, key, fb, **kw: ("replayed", key)  # noqa: E731
    monkeypatch.setattr(es, "_route", es.Route(capture=cap))  # eagle_step_graph's capture: not this slot's
    assert dsg.replay_hook(original, runner, 4, None) == ("replayed", 4) and not cuts
    monkeypatch.setattr(dsg, "_route", dsg.Route(capture=cap))
    assert dsg.replay_hook(original, runner, 4, None) == "static out" and cuts == [4]


def test_a_runner_capture_after_startup_drops_this_slots_graphs_and_keeps_the_runner_graph(flow, monkeypatch):
    r, captured, worker = flow
    monkeypatch.setattr(es, "_route", es.Route())
    original, calls = eager_step()
    for bs in (1, 2) * (es.WARMUPS + 2):
        dsg.step_hook(original, worker, batch(bs))
    assert len(r.graphs) == 2
    module = __import__(es.BACKEND_MODULE, fromlist=["x"])
    real, seen = module.torch, {}

    class Graph:
        def __init__(self, keep_graph=False):
            self.keep_graph, self.instantiated = keep_graph, False

        def instantiate(self):
            self.instantiated = True

    def capture_one(self, key, fn, ci=None, ph=None):
        seen["keywords"] = module.torch.cuda.CUDAGraph.keywords
        self._graphs[key] = Graph(**module.torch.cuda.CUDAGraph.keywords)

    runner = NS(_graphs={})
    dsg.keep_hook(capture_one, runner, 1, None)
    assert r.graphs == {} and sorted(r.driver.destroyed) == [100, 101] and r.warm == {} and r.pool is None
    assert seen["keywords"] == {"keep_graph": True} and runner._graphs[1].instantiated and module.torch is real


# --- the real capture() over fakes of torch's CUDA calls ---


@pytest.fixture
def gpu(monkeypatch, cpu_tensors):
    return fake_gpu(monkeypatch, dsg)


RUNNERS = [NS(_graphs=collections.defaultdict(lambda: TorchGraph(None)),
              _outputs=collections.defaultdict(lambda: "static out")) for _ in range(dsg.CHILDREN)]


def sglang_step(fail_at=None, flip=None, runners=RUNNERS, out=None):
    """A step shaped like DFlash v2's decode branch: the draft block's buffers, the two runner replays,
    the accept buffers (SGLang's own ping-pong), the draft KV append (through the fused helper's
    workspace where the worker has one), fields of the batch rebound. ``fail_at``: a batch size whose
    step raises under capture after the first runner. ``flip``: (owner, flag, value) SGLang's except
    path sets under capture, then carries on (its fallback). ``step.ptrs``: the growing buffers'
    addresses each call ran on."""
    calls, seen, ptrs = [], [], []

    def step(worker, b, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        capturing = dsg._route.capture is not None
        calls.append(capturing)
        seen.append((b.seq_lens, b.spec_info, b.out_cache_loc))
        bs = len(b.seq_lens)
        worker._ensure_draft_block_buffers(bs)
        helper = worker._fused_kv_helper if worker._use_fused_kv_materialize else None
        if helper is not None:  # (FusedKVMaterializeHelper.materialize, by the step's token count)
            helper._ensure_workspace(bs * BLOCK, helper.flat_kv_weight_t.dtype)
        ptrs.append(dsg.buffer_pointers(worker))
        locs = worker._draft_verify_out_cache_loc_buf[:bs]
        locs.copy_(b.req_pool_indices[:, None] * BLOCK + torch.arange(BLOCK))
        for runner in runners:
            dsg.replay_hook(lambda self, key, fb, **kw: "replayed", runner, bs, None)
            if capturing and bs == fail_at:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        if capturing and flip is not None:
            owner, name, value = flip
            setattr(owner(worker), name, value)
        _, commit, bonus, tokens, new_lens = worker._next_accept_bonus_buffers(bs)
        commit.copy_(b.seq_lens % 3 + 1)
        bonus.copy_(b.spec_info.bonus_tokens + 1)
        tokens.copy_(torch.arange(bs * BLOCK).view(bs, BLOCK))
        new_lens.copy_(b.seq_lens + commit)
        if on_publish is not None:
            on_publish(new_lens)
        worker.draft_model_runner.token_to_kv_pool.k[locs.reshape(-1)] = 1.0
        b.out_cache_loc, b.input_ids, b.spec_info = locs.reshape(-1), tokens.reshape(-1), "verify input"
        if out is not None:
            return out()
        return NS(next_token_ids=tokens.reshape(-1), accept_lens=commit, new_seq_lens=new_lens, logits_output=NS(),
                  next_draft_input=NS(bonus_tokens=bonus, new_seq_lens=new_lens), extra_keep_alive_refs=None,
                  can_run_cuda_graph=True)

    step.seen, step.ptrs = seen, ptrs
    return step, calls


def accept_state(worker):
    return {n: getattr(worker, n) for n in dsg.ACCEPT_STATE}


def test_buffers_are_presized_to_the_largest_decode_graph_before_the_first_capture(gpu):
    worker = Worker(max_bs=4)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(step, worker, batch(1))
    assert calls == [False] * es.WARMUPS + [True]
    assert worker._draft_block_ids_buf.shape[0] == 4 and worker._fused_kv_helper._workspace_capacity >= 4 * BLOCK
    (graph,) = dsg._route.graphs.values()
    ptr = worker._draft_block_ids_buf.data_ptr()
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(step, worker, batch(4))  # bs 4's warm-up and capture: no growth, the bs 1 graph stays
    assert worker._draft_block_ids_buf.data_ptr() == ptr and graph.current(worker)


def test_a_capture_restores_the_batch_and_gives_the_graph_accept_buffers_of_its_own(gpu):
    """The capture freezes one accept slot; the graph's is its own, so an eager step (slot flipping
    as SGLang's does) never writes what the copy stream may still read of a replay, and back."""
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step()
    for _ in range(es.WARMUPS):
        dsg.step_hook(step, worker, batch())
    own, slot = accept_state(worker), worker._accept_bonus_buffer_slot
    b = batch()
    before = dict(vars(b)), dict(vars(b.spec_info)), dict(vars(b.sampling_info))
    out = dsg.step_hook(step, worker, b)  # the capture, then its first launch
    assert calls[-1] is True and r.replays == 1
    for old, new in zip(before, (vars(b), vars(b.spec_info), vars(b.sampling_info))):
        assert new.keys() == old.keys() and all(new[k] is old[k] for k in old)
    assert all(accept_state(worker)[k] is v for k, v in own.items())
    assert worker._accept_bonus_buffer_slot == slot
    (graph,) = r.graphs.values()
    worker_ptrs = {t.data_ptr() for name in dsg.ACCEPT_PAIRS for t in getattr(worker, name)}
    graph_ptrs = {graph.result.accept_lens.data_ptr(), graph.result.new_seq_lens.data_ptr(),
                  graph.result.next_token_ids.data_ptr(), graph.result.next_draft_input.bonus_tokens.data_ptr()}
    assert graph_ptrs.isdisjoint(worker_ptrs) and graph.accept is not None
    # Kept alive by the graph: slot 0 of each pair, the one its capture wrote, and no slot 1.
    kept = {name: [t.data_ptr() for t in graph.accept[name]] for name in dsg.ACCEPT_PAIRS}
    assert all(len(v) == 1 for v in kept.values()), kept
    assert graph_ptrs == {kept[name][0] for name in dsg.ACCEPT_PAIRS}
    assert set(graph.accept) == {dsg.ACCEPT_BUFFER, *dsg.ACCEPT_PAIRS}
    assert out.accept_lens is not graph.result.accept_lens and torch.equal(out.accept_lens, graph.result.accept_lens)


def test_a_failed_capture_puts_the_batch_the_worker_and_its_flags_back(gpu, caplog):
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step(fail_at=2)
    for _ in range(es.WARMUPS):
        dsg.step_hook(step, worker, batch(2))
    own, flags = accept_state(worker), [v for _, _, v in dsg.worker_flags(worker)]
    slot = own.pop("_accept_bonus_buffer_slot")
    b = batch(2)
    mine = b.seq_lens, b.spec_info, b.out_cache_loc
    dsg.step_hook(step, worker, b)  # the capture fails; SGLang's step runs on the scheduler's own fields
    assert step.seen[-2][0] is not mine[0] and step.seen[-1] == mine
    assert side.log == ["enter", "begin", "end", "begin", "end", "exit"] and not side.capturing and side.routed == 0
    assert all(accept_state(worker)[k] is v for k, v in own.items())
    assert worker._accept_bonus_buffer_slot == (slot + 1) % 2  # flipped once: by SGLang's step, not the capture
    assert [v for _, _, v in dsg.worker_flags(worker)] == flags
    key = (2, dsg.gather(dsg.owners(batch(2)))[0])
    assert r.failures == {key: 1} and r.failed == 1 and not r.disabled and r.pool is None and r.replays == 0
    assert "capturing the bs 2 step failed (1 of 2" in caplog.text


@pytest.mark.parametrize("flip", [
    (lambda w: w, "_use_triton_accept_bonus", False),  # W:2250
    (lambda w: w, "_use_triton_prepare_block", False),  # W:2529
    (lambda w: w, "_fused_kv_helper", None),  # W:1962/2000 (with _use_fused_kv_materialize)
    (lambda w: w._fused_kv_helper, "_mm_out_supported", False),  # FK:431-436
])
def test_a_flag_sglang_turns_off_during_a_capture_fails_it_and_is_put_back(gpu, caplog, flip):
    """SGLang's except path swallows an error under capture (an invalidated capture, say), turns its
    fast path off for good and carries on with the fallback: the capture must not stand, and the
    flag must come back, or every later eager step would run the slow path."""
    r, side = gpu
    worker = Worker()
    owner = flip[0](worker)
    step, calls = sglang_step(flip=flip)
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(step, worker, batch(2))
    assert calls == [False] * es.WARMUPS + [True, False]  # the capture, then SGLang's step
    assert getattr(owner, flip[1]) is not flip[2] and r.failed == 1 and not r.graphs and r.replays == 0
    assert f"SGLang turned {flip[1]} off" in caplog.text


def test_a_step_with_fewer_runner_graphs_leaves_its_batch_size_to_sglang(gpu):
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step(runners=RUNNERS[:1])  # the draft ran eagerly (no graph for this size)
    for _ in range(es.WARMUPS + 3):
        dsg.step_hook(step, worker, batch(3))
    assert r.skip == {3} and not r.graphs and r.eager == {"bs 3: 1 of the 2 runner graphs replayed": 1,
                                                          "bs 3 has no step graph": 2}


def test_a_step_returning_routed_experts_stays_sglangs(gpu):
    r, side = gpu
    worker = Worker()

    def with_experts():
        out = result(2)
        out.routed_experts_output = NS(topk_ids=torch.zeros(2, 8))
        return out

    step, calls = sglang_step(out=with_experts)
    for _ in range(es.WARMUPS + 3):
        dsg.step_hook(step, worker, batch())
    assert r.replays == 0 and not r.graphs and "routed_experts_output" in r.disabled


def test_captures_and_replays_then_a_grown_buffer_recaptures(gpu, caplog):
    r, side = gpu
    caplog.set_level("INFO", logger="sglang.srt.plugins.hostsync")
    worker = Worker(max_bs=2)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(step, worker, batch(2))
    assert r.replays == 2
    assert "dflash_step_graph: bs 2 step captured: 3 segments around the 2 runner graphs" in caplog.text
    step(worker, batch(8))  # an eager bs-8 step (past the decode graphs) grows the block buffers
    for _ in range(es.WARMUPS + 2):  # the stale graph goes; two eager warm-ups, a capture, a replay
        dsg.step_hook(step, worker, batch(2))
    assert r.driver.destroyed == [201] and r.replays == 4 and len(r.graphs) == 1
    # The stale graph was the only one: the recapture goes into a fresh pool (torch refuses the old one).
    assert len(set(side.pools)) == 2 and r.pool == side.pools[-1]
    assert next(iter(r.graphs.values())).current(worker)


def test_the_buffers_are_presized_on_a_keys_first_step_so_its_warm_ups_run_on_the_captured_ones(gpu):
    """Pre-sizing runs before the key's first warm-up, never inside a capture: the warm-ups and the
    capture run on the same block buffers and workspace (the ones the graph then records)."""
    r, side = gpu
    worker = Worker(max_bs=4)
    helper, allocs = worker._fused_kv_helper, []

    def recording(owner, name, buffer):
        real = getattr(owner, name)

        def ensure(*args):
            before = getattr(owner, buffer)
            real(*args)
            if getattr(owner, buffer) is not before:
                allocs.append((name, args[0], dsg._route.capture is not None, side.capturing))

        setattr(owner, name, ensure)

    recording(worker, "_ensure_draft_block_buffers", "_draft_block_ids_buf")
    recording(helper, "_ensure_workspace", "_proj_workspace")
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(step, worker, batch(1))
    assert calls == [False] * es.WARMUPS + [True] and r.replays == 2
    assert allocs == [("_ensure_draft_block_buffers", 4, False, False), ("_ensure_workspace", 4 * BLOCK, False, False)]
    assert len(set(step.ptrs)) == 1 and step.ptrs[0] == dsg.buffer_pointers(worker)
    (graph,) = r.graphs.values()
    assert graph.current(worker)


def test_the_workspace_is_presized_to_a_prefill_so_a_prefill_keeps_the_graphs(gpu, stream_and_schedule):
    """The fused KV workspace is the prefill's too: sized to a prefill batch (the chunk size), a
    prefill of that many tokens after the capture grows nothing and drops no graph."""
    r, side = gpu
    stream_and_schedule.prefill = 64  # > max_bs x block (16)
    worker = Worker(max_bs=4)
    helper = worker._fused_kv_helper
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(step, worker, batch(2))
    assert helper._workspace_capacity >= 64 and r.replays == 2
    helper._ensure_workspace(64, helper.flat_kv_weight_t.dtype)  # a full chunk's prefill (draft KV append)
    dsg.step_hook(step, worker, batch(2))
    assert r.replays == 3 and not r.driver.destroyed and len(calls) == es.WARMUPS + 1


def test_prefill_tokens_is_sglangs_chunk_size_or_else_its_prefill_cap():
    from sglang.srt.runtime_context import get_context

    for args, want in (({"chunked_prefill_size": 4096}, 4096), ({"chunked_prefill_size": -1}, 16384),
                       ({"chunked_prefill_size": None, "max_prefill_tokens": 1000}, 1000),
                       ({"chunked_prefill_size": 0, "max_prefill_tokens": 3000}, 3000)):
        with get_context().override_server_args(**args):
            assert PREFILL_TOKENS() == want, args
    src = inspect.getsource(FusedKVMaterializeHelper.materialize)
    assert "self._ensure_workspace(total_ctx, ctx_hidden.dtype)" in src  # sized by the token count


def test_a_worker_without_the_fused_helper_captures_replays_and_recaptures(gpu):
    """SGLang's non-fused KV append (no helper: not CUDA, or its init failed): no workspace in the
    pointers, no helper flags, the same flow; a grown block buffer still drops the graph."""
    r, side = gpu
    worker = Worker(fused=False)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dsg.step_hook(step, worker, batch(2))
    assert r.replays == 2 and calls == [False] * es.WARMUPS + [True]
    assert dsg.fused_helper(worker) is None and len(dsg.buffer_pointers(worker)) == len(dsg.BLOCK_BUFFERS)
    assert [name for _, name, _ in dsg.worker_flags(worker)] == list(dsg.FLAGS)
    (graph,) = r.graphs.values()
    assert graph.current(worker)
    worker._ensure_draft_block_buffers(9)
    dsg.step_hook(step, worker, batch(2))
    assert r.driver.destroyed and not r.graphs and r.replays == 2


def test_a_replay_records_the_lengths_on_the_current_stream_before_copying_them(flow, monkeypatch,
                                                                               stream_and_schedule):
    """Stock calls ``batch.seq_lens.record_stream`` (W:2481): the overlap scheduler allocates it on
    another stream. A replay's copy reads it too, on the current stream, after the record."""
    r, captured, worker = flow
    order = []
    monkeypatch.setattr(dsg, "record_stream", lambda t: order.append(("record", t)))
    real_copy = torch._foreach_copy_

    def copy_(dst, src):
        order.append(("copy", src))
        return real_copy(dst, src)

    monkeypatch.setattr(torch, "_foreach_copy_", copy_)
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dsg.step_hook(original, worker, batch())
    assert not order  # the eager steps record it themselves
    r.check = 2
    batches = [batch(), batch()]  # the capture and its replay; then a checked replay
    for b in batches:
        dsg.step_hook(original, worker, b)
    assert r.replays == 2 and r.checks == 1
    assert [what for what, _ in order] == ["record", "copy"] * 2
    for b, (rec, cp) in zip(batches, zip(order[::2], order[1::2])):
        assert rec[1] is b.seq_lens and any(t is b.seq_lens for t in cp[1])


def test_a_changed_worker_drops_every_graph_captured_before_the_change(flow):
    """``worker_state`` is the whole worker's: a grown buffer makes every graph stale, so the first
    step that finds one drops them all (not only its own key's)."""
    r, captured, worker = flow
    original, calls = eager_step()
    for bs in (1, 2, 3) * (es.WARMUPS + 1):
        dsg.step_hook(original, worker, batch(bs))
    assert len(r.graphs) == 3 and r.replays == 3
    worker._fused_kv_helper._ensure_workspace(1000, worker._fused_kv_helper.flat_kv_weight_t.dtype)
    dsg.step_hook(original, worker, batch(2))
    assert sorted(r.driver.destroyed) == [100, 101, 102] and not r.graphs
    assert all(v == (1 if k[0] == 2 else 0) for k, v in r.warm.items())  # bs 2 warms up from this step
    for bs in (1, 2, 3) * es.WARMUPS + (1, 3):  # (bs 2 had its first warm-up above)
        dsg.step_hook(original, worker, batch(bs))
    assert len(r.graphs) == 3 and all(g.current(worker) for g in r.graphs.values())


def test_stale_graphs_at_the_limit_make_room_for_a_new_key(flow):
    """A grown buffer makes every held graph stale; a new key at the graph limit drops them instead of
    staying eager behind graphs that can never replay."""
    r, captured, worker = flow
    r.max_graphs = 2
    original, calls = eager_step()
    for bs in (1, 2) * (es.WARMUPS + 1):
        dsg.step_hook(original, worker, batch(bs))
    assert len(r.graphs) == 2
    worker._fused_kv_helper._ensure_workspace(1000, worker._fused_kv_helper.flat_kv_weight_t.dtype)
    for _ in range(es.WARMUPS + 1):
        dsg.step_hook(original, worker, batch(3))
    assert sorted(r.driver.destroyed) == [100, 101] and [k[0] for k in r.graphs] == [3], r.eager
    assert not any("step graphs held already" in k for k in r.eager), r.eager


def test_with_capture_off_a_step_reads_no_rule(flow, monkeypatch):
    """Capture off for good: SGLang's step at once, the per-step rules and the stray scan unread."""
    r, captured, worker = flow
    r.disabled = "8 captures failed"

    def unread(*args):
        raise AssertionError("read with capture off")

    monkeypatch.setattr(dsg, "ineligible", unread)
    monkeypatch.setattr(dsg, "stray_input", unread)
    monkeypatch.setattr(dsg, "gather", unread)
    original, calls = eager_step()
    for _ in range(3):
        dsg.step_hook(original, worker, batch())
    assert len(calls) == 3 and r.eager == {"capture off": 3}


# --- server-wide and startup rules ---


def good_worker(**over):
    w = Worker()
    for k, v in over.items():
        setattr(w, k, v)
    return w


def fa3(**attrs):
    return backend("FlashAttentionBackend", **{"fa_impl_ver": 3, "_kv_shard_pool": None, **attrs})


def runner_with(attn, translating=False):
    return NS(attn_backend=attn, kv_index_translator=NS(is_translating=translating), decode_cuda_graph_runner=None)


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"_need_mamba_verify_commit": True}, "mamba"),
    ({"selector": object()}, "selector"),
    ({"lilicorr": object()}, "LiLiCorr"),
    ({"_is_domino": True}, "Domino"),
    ({"_draft_sampler": None}, "outside the draft graph"),
    ({"use_compact_draft_cache": True}, None),
    ({"use_compact_draft_cache": True, "_use_triton_compact_rebuild": False}, "compact draft cache"),
    ({"model_runner": runner_with(backend("TritonAttnBackend"), translating=True)}, "target's translated KV pool"),
    ({"draft_model_runner": runner_with(backend("TritonAttnBackend"), translating=True)}, "draft's translated KV"),
    ({"model_runner": runner_with(backend("FlashInferAttnBackend"))}, "FlashInferAttnBackend"),
    ({"model_runner": runner_with(fa3()), "draft_model_runner": runner_with(fa3())}, None),
    ({"model_runner": runner_with(fa3())}, "fa3, triton"),  # target and draft alike
    ({"model_runner": runner_with(fa3(_kv_shard_pool=object())), "draft_model_runner": runner_with(fa3())},
     "KV shard pool"),
    ({"model_runner": runner_with(backend("FlashAttentionBackend", fa_impl_ver=4, _kv_shard_pool=None))}, "fa4"),
    ({"model_runner": runner_with(backend("HybridAttnBackend", prefill_backend=fa3(),
                                          decode_backend=backend("TritonAttnBackend")))}, "fa3, triton"),
    ({"model_runner": runner_with(backend("HybridAttnBackend", prefill_backend=backend("TritonAttnBackend"),
                                          decode_backend=backend("TritonAttnBackend")))}, None),
])
def test_worker_rules(over, reason):
    got = dsg.worker_unsupported(good_worker(**over))
    assert (got is None) if reason is None else (reason in got), got


def test_the_worker_fields_the_rules_read_are_set_by_sglang():
    src = inspect.getsource(DFlashWorkerV2.__init__)
    for name in ("_need_mamba_verify_commit", "selector", "lilicorr", "_is_domino", "_draft_sampler",
                 "use_compact_draft_cache", "_use_triton_compact_rebuild", *dsg.FLAGS,
                 "_accept_bonus_buffer_cap", "_accept_bonus_buffer_slot", *dsg.BLOCK_BUFFERS):
        assert f"self.{name}" in inspect.getsource(DFlashWorkerV2), name
    assert "self.model_runner = target_worker.model_runner" in src


def test_every_flag_the_guard_snapshots_is_one_sglang_turns_off_or_sets_once():
    worker_src = inspect.getsource(DFlashWorkerV2)
    for name in dsg.FLAGS:
        assert f"self.{name} = False" in worker_src or f"self.{name} = None" in worker_src or \
            f"self.{name} = supports_gpu_triton" in worker_src, name
    for name in ("_use_triton_accept_bonus", "_use_triton_prepare_block", "_use_fused_kv_materialize"):
        assert f"self.{name} = False" in worker_src, name  # in an except path
    assert "self._mm_out_supported = False" in inspect.getsource(FusedKVMaterializeHelper.materialize)
    for name in dsg.WORKSPACES:
        assert f"self.{name} = torch.empty" in inspect.getsource(FusedKVMaterializeHelper._ensure_workspace), name


def except_path_assignments(cls) -> set[str]:
    """Every ``self.<name> = False`` / ``= None`` inside an ``except`` block of ``cls``'s methods: the
    fallbacks that turn a path off for good."""
    import ast
    import textwrap

    found = set()
    for handler in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
        if not isinstance(handler, ast.ExceptHandler):
            continue
        for node in ast.walk(handler):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            pairs = []
            for t in targets:
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += zip(t.elts, node.value.elts)
                else:
                    pairs.append((t, node.value))
            for target, value in pairs:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self" and isinstance(value, ast.Constant)
                        and value.value in (False, None)):
                    found.add(target.attr)
    return found


def test_every_flag_an_sglang_fallback_turns_off_is_snapshotted():
    """A new ``try/except`` fallback in the DFlash worker (any method: the decode branch's and those
    it calls, and init's, which set the same flags) or the fused KV helper that turns a flag off
    must be in ``FLAGS`` / ``HELPER_FLAGS``, or a capture would stand on the path it abandoned."""
    worker, helper = except_path_assignments(DFlashWorkerV2), except_path_assignments(FusedKVMaterializeHelper)
    assert worker == {"_use_triton_prepare_block", "_use_triton_accept_bonus", "_use_fused_kv_materialize",
                      "_fused_kv_helper"}  # (0.5.23; the scan finds them)
    assert worker <= set(dsg.FLAGS), worker - set(dsg.FLAGS)
    assert helper == {"_mm_out_supported"} and helper <= set(dsg.HELPER_FLAGS), helper


def test_the_accept_state_names_are_sglangs_buffer_pairs():
    """``ACCEPT_PAIRS`` are SGLang's ping-pong lists (two slots), ``ACCEPT_BUFFER`` its one buffer."""
    w = Worker()
    w._ensure_accept_bonus_buffers(3)
    assert torch.is_tensor(getattr(w, dsg.ACCEPT_BUFFER))
    assert all(isinstance(getattr(w, n), list) and len(getattr(w, n)) == 2 for n in dsg.ACCEPT_PAIRS)
    assert getattr(w, dsg.ACCEPT_CAP) == 3 and dsg.ACCEPT_STATE == (dsg.ACCEPT_BUFFER, *dsg.ACCEPT_PAIRS,
                                                                     dsg.ACCEPT_CAP, dsg.ACCEPT_SLOT)
    own = dsg.own_accept_buffers(w, 2)
    assert all(len(own[n]) == 1 and own[n][0] is getattr(w, n)[0] for n in dsg.ACCEPT_PAIRS)
    assert getattr(w, dsg.ACCEPT_SLOT) == 0
    *_, new_lens = w._next_accept_bonus_buffers(2)  # the capture's one call takes slot 0
    assert new_lens.data_ptr() == own["_new_seq_lens_bufs"][0].data_ptr()
    with pytest.raises(IndexError):  # a second call in one captured step fails the capture, never shares
        w._next_accept_bonus_buffers(2)


@pytest.mark.parametrize("args, reason", [
    ({}, None),
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"speculative_adaptive": True}, "--speculative-adaptive"),
    ({"enable_return_routed_experts": True}, "--enable-return-routed-experts"),
    ({"enable_return_indexer_topk": True}, "--enable-return-indexer-topk"),
    ({"expert_distribution_recorder_mode": "stat"}, "expert distribution"),
    ({"enable_two_batch_overlap": True}, "two-batch overlap"),
    ({"tp_size": 2}, "tensor parallelism"),
    ({"enable_unified_memory": True}, "--enable-unified-memory"),
])
def test_server_settings_that_keep_sglangs_step(args, reason):
    from sglang.srt.runtime_context import get_context

    try:
        ctx = get_context().override_server_args(**args)
        ctx.__enter__()
    except Exception as exc:  # an argument combination SGLang itself refuses on one CPU
        pytest.skip(f"SGLang refuses {args}: {exc}")
    try:
        got = dsg.unsupported(Worker())
    finally:
        ctx.__exit__(None, None, None)
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("decode, saver, env, reason", [
    (None, False, None, None),  # no --cuda-graph-config: SGLang's default decode backend, full
    ({"backend": "full"}, False, None, None),
    ({"backend": "breakable"}, False, None, "'breakable', not 'full'"),
    ({"backend": "disabled"}, False, None, "'disabled', not 'full'"),
    (None, True, None, None),  # the saver pauses the KV cache and weights in place: graphs unchanged
    (None, False, "1", None),
    (None, True, "1", "SGLANG_MEMORY_SAVER_CUDA_GRAPH"),  # runner graphs captured into pausable memory
])
def test_the_decode_graph_backend_must_be_full_and_its_graphs_not_the_savers(monkeypatch, decode, saver, env,
                                                                                reason):
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
        got = dsg.unsupported(Worker())
    assert (got is None) if reason is None else (reason in got), got


def test_sglang_picks_the_decode_backend_and_the_savers_capture_as_the_rule_reads():
    from sglang.srt.model_executor.runner_backend import utils
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    src = inspect.getsource(utils.resolve_decode_backend)
    assert "backend_name = cfg.decode.backend if cfg is not None else Backend.FULL" in src
    assert "if backend_name == Backend.BREAKABLE:" in src and "return BreakableCudaGraphBackend(" in src
    init, capture_one = inspect.getsource(FullCudaGraphBackend.__init__), inspect.getsource(
        FullCudaGraphBackend.capture_one)
    assert 'and get_bool_env_var("SGLANG_MEMORY_SAVER_CUDA_GRAPH")' in init
    assert "self._memory_saver_adapter.cuda_graph," in capture_one


def test_the_scheduler_rules_include_the_worker_rules():
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args():
        assert "mamba" in dsg.unsupported(good_worker(_need_mamba_verify_commit=True))


def facts(**over):
    base = dict(speculative_algorithm="DFLASH", topk=1, page_size=16, attention_backends=("triton", "triton"),
                draft_attention_backend=None)
    return ServingFacts(**{**base, **over})


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"attention_backends": ("fa3", "fa3")}, None),
    ({"attention_backends": (None, None)}, None),  # not resolved yet: the scheduler checks the live backends
    ({"speculative_algorithm": "DSPARK"}, "inert because --speculative-algorithm is DSPARK"),
    ({"speculative_algorithm": "EAGLE3"}, "inert because --speculative-algorithm is EAGLE3"),
    ({"speculative_algorithm": None}, "inert because --speculative-algorithm is unset"),
    ({"disable_cuda_graph": True}, "--disable-cuda-graph"),
    ({"tp_size": 2}, "tensor parallelism"),
    ({"dp_attention": True}, "attention DP"),
    ({"two_batch_overlap": True}, "two-batch overlap"),
    ({"enable_pdmux": True}, "pdmux"),
    ({"enable_lora": True}, "LoRA"),
    ({"moe_counts": True}, "MoE"),
    ({"attention_backends": ("flashinfer", "flashinfer")}, "flashinfer"),
    ({"attention_backends": ("fa3", "triton")}, "fa3, triton"),
    ({"draft_attention_backend": "fa3"}, "fa3, triton"),
    ({"attention_backends": ("torch_native", "torch_native")}, "flashinfer"),  # the draft's CUDA fallback
    ({"disable_overlap_schedule": True}, "--disable-overlap-schedule"),
    ({"speculative_adaptive": True}, "--speculative-adaptive"),
    ({"returns_capture_outputs": True}, "--enable-return-routed-experts"),
    ({"expert_distribution": True}, "expert distribution recording"),
    ({"env": {"SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1"}}, "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER"),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3"}}, None),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "2.5"}}, "draws a new length"),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_METHOD": "multinomial"}}, "draws a new length"),
])
def test_inert_rules(over, reason):
    got = dsg.inert(facts(**over))
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("argv, reason", [
    ((), None),
    (("--attention-backend", "fa3"), None),
    (("--attention-backend", "flashinfer"), "flashinfer"),
    (("--disable-overlap-schedule",), "--disable-overlap-schedule"),
    (("--enable-return-routed-experts",), "--enable-return-routed-experts"),
    (("--expert-distribution-recorder-mode", "stat"), "expert distribution recording"),
])
def test_the_startup_rules_read_sglangs_argument_preparation(argv, reason):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy", "--speculative-algorithm", "DFLASH",
                                "--speculative-draft-model-path", "dummy", "--attention-backend", "triton", *argv])
    got = dsg.inert(ServingFacts.from_server_args(args, {}))
    assert (got is None) if reason is None else (reason in got), got


def test_the_dflash_simulated_draw_is_sglangs_sampler():
    """DFlash's simulated acceptance draws with the function eagle_step_graph's rule was written for."""
    from sglang.srt.speculative import dflash_utils

    src = inspect.getsource(dflash_utils.apply_dflash_simulated_acceptance)
    assert "sample_simulated_acc_len(" in src


def test_settings_are_eagle_step_graphs(monkeypatch):
    r = dsg.Route()
    monkeypatch.setattr(dsg, "_route", r)
    monkeypatch.setenv(es.ENV_MAX, "6")
    monkeypatch.setenv(es.ENV_CHECK, "3")
    assert dsg.prepare(None) == "at most 6 step graphs; eager check every 3 replayed steps"
    assert (r.max_graphs, r.check) == (6, 3)
    monkeypatch.setenv(es.ENV_CHECK, "-1")
    assert "bad configuration" in dsg.SLOT.precheck.config()


# --- targets, pins, the catalogue and the plan ---


def test_targets_are_sglangs_as_pinned():
    from sglang_hostsync_plugin.checks import check_target

    for target in dsg.SLOT.targets:
        assert check_target(target) is None, target.path
    # The design study's table (docs/dflash-step-graph.md section 3); the backend's are eagle_step_graph's.
    assert [t.source_sha for t in dsg.SLOT.targets] == ["f42a3bb18adba2a5", "b11da397ea881b30", "cf7508aca9e2b4ae"]
    assert [t.path for t in dsg.SLOT.targets[1:]] == [t.path for t in es.SLOT.targets[1:]]
    assert [t.source_sha for t in dsg.SLOT.targets[1:]] == [t.source_sha for t in es.SLOT.targets[1:]]


def test_the_pinned_sources_are_sglangs(monkeypatch):
    from sglang_hostsync_plugin.checks import pinned_sources

    assert dsg.upstream_pins() is None and dsg.SLOT.precheck() is None
    # Imported and hashed as checks.source_sha does, the same figures (FA3's module imports only beside
    # sgl_kernel: read from its file above).
    assert pinned_sources([tuple(p.rsplit(".", 1)) + (sha,) for p, sha in dsg.PINS
                           if "flashattention_backend" not in p], "test") is None
    monkeypatch.setattr(dsg, "PINS", ((dsg.PINS[0][0], "0" * 16),))
    assert "upstream shape changed" in dsg.upstream_pins()


def test_unsafe_pairs_name_catalogue_slots():
    from sglang_hostsync_plugin.registry import catalogue

    assert {other for other, _ in dsg.SLOT.unsafe_with} <= set(catalogue())


@pytest.fixture
def with_slot():
    """The catalogue, which holds the slot."""
    from sglang_hostsync_plugin import registry

    return registry.catalogue()


def plan_for(algorithm, spec="default,audit,audit_block,eagle_step_graph,dflash_step_graph", **over):
    from sglang_hostsync_plugin import plan as plans

    f = None if algorithm is None else facts(speculative_algorithm=algorithm, **over)
    return plans.resolve({"SGLANG_HOSTSYNC_SLOTS": spec}, facts=f)


def test_beside_eagle_step_graph_in_a_dflash_server_only_this_slot_applies(with_slot):
    """The two slots hook the same backend functions; the plan refuses two selected slots on one
    function only among those not inert, so in a DFlash server eagle_step_graph is skipped and this
    one applies (and the reverse in an EAGLE server), with one hook per function beside the default
    slots and the audit's observers on the same step function."""
    from sglang_hostsync_plugin import installer

    plan = plan_for("DFLASH")
    assert plan.verdict(dsg.NAME).status is Status.WOULD_APPLY, plan.verdict(dsg.NAME)
    assert plan.verdict("eagle_step_graph").status is Status.SKIPPED
    assert not [v for v in plan.verdicts if v.status is Status.FAILED]
    order = []
    installer.install(installer.InstallState(), plan, with_slot, lambda path, hook, kind: order.append(path))
    assert len(order) == len(set(order)) and {t.path for t in dsg.SLOT.targets} <= set(order)
    eagle = plan_for("EAGLE3")
    assert eagle.verdict("eagle_step_graph").status is Status.WOULD_APPLY
    assert eagle.verdict(dsg.NAME).status is Status.SKIPPED


def test_without_server_facts_both_step_graphs_are_refused(with_slot):
    """Where the plan is made before the server args are known (the env switch's in-process path),
    neither slot is inert yet, so both claim the backend functions and both are refused; the facts
    later skip slots but never clear a refusal (plan.Plan.with_facts). Select one of the two."""
    plan = plan_for(None)
    for name in (dsg.NAME, "eagle_step_graph"):
        v = plan.verdict(name)
        assert v.status is Status.FAILED and "both hook" in v.reason and "FullCudaGraphBackend" in v.reason, v
    one = plan_for(None, spec="default,dflash_step_graph")
    assert one.verdict(dsg.NAME).status is Status.WOULD_APPLY


# --- the GPU e2e's run (helpers.e2e_with_slot) past its timeout ---


class E2EProcess:
    """Stands in for ``subprocess.Popen`` of the e2e: it runs past any timeout; ``write`` says when it
    writes its e2e.json ("run": before the timeout, "term": on SIGTERM, as the e2e reports a cut run,
    None: never); ``hang``: SIGTERM does not stop it either."""

    write, hang, runs = None, False, []

    def __init__(self, argv, env=None, **kw):
        self.argv, self.signals, self.out = list(argv), [], argv[argv.index("--out") + 1]
        self.returncode, self.env = None, env
        E2EProcess.runs.append(self)

    def _report(self):
        import json
        import os

        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "e2e.json"), "w") as f:
            json.dump({"meta": {"stopped": "interrupted (signal 15)"}, "servers": {}}, f)

    def wait(self, timeout=None):
        import subprocess

        if self.returncode is not None:
            return self.returncode
        if self.write == "run":
            self._report()
        if "term" in self.signals and not self.hang:
            self.returncode = 130
            return 130
        if "kill" in self.signals:
            self.returncode = -9
            return -9
        raise subprocess.TimeoutExpired(self.argv, timeout)

    def communicate(self, input=None, timeout=None):  # (subprocess.run's call)
        self.wait(timeout)
        return None, None

    def poll(self):
        return self.returncode

    def terminate(self):
        self.signals.append("term")
        if self.write == "term":
            self._report()

    def kill(self):
        self.signals.append("kill")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.wait()


@pytest.fixture
def slow_e2e(monkeypatch, tmp_path):
    import subprocess

    import helpers

    monkeypatch.setattr(E2EProcess, "runs", [])
    monkeypatch.setattr(subprocess, "Popen", E2EProcess)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.delenv("HOSTSYNC_TEST_E2E_DIR", raising=False)

    def run(write, hang=False):
        monkeypatch.setattr(E2EProcess, "write", write)
        monkeypatch.setattr(E2EProcess, "hang", hang)
        return helpers.e2e_with_slot(tmp_path / "dist", "HOSTSYNC_TEST_E2E_DIR", "slow", None, None,  # a catalogue slot
                                     ["--configs", "dflash-p16"], timeout=0.01)

    return run, tmp_path / "out" / "slow"


def test_an_e2e_past_its_timeout_is_stopped_and_its_report_read(slow_e2e):
    run, out = slow_e2e
    got = run("term")  # the e2e reports the rounds that finished on SIGTERM
    (proc,) = E2EProcess.runs
    assert got["meta"]["stopped"] == "interrupted (signal 15)" and proc.signals == ["term"]
    assert proc.argv[-2:] == ["--out", str(out)]
    dist = out.parent.parent / "dist"  # a catalogue slot: no entry-point package written or put on the path
    assert not dist.exists() and str(dist) not in proc.env.get("PYTHONPATH", "")


def test_an_e2e_that_ignores_sigterm_is_killed_and_its_last_report_read(slow_e2e):
    run, out = slow_e2e
    assert run("run", hang=True)["servers"] == {}  # the rounds it saved before the timeout
    assert E2EProcess.runs[0].signals == ["term", "kill"]


@pytest.mark.parametrize("stale", [False, True])
def test_an_e2e_past_its_timeout_without_a_report_of_its_own_names_the_timeout(slow_e2e, stale):
    import os

    run, out = slow_e2e
    if stale:  # an earlier run's report in the same place is not this run's
        os.makedirs(out)
        (out / "e2e.json").write_text("{}")
        os.utime(out / "e2e.json", (1, 1))
    with pytest.raises(AssertionError, match=r"passed its 0.01 s timeout \(subprocess.TimeoutExpired\)"):
        run(None)
