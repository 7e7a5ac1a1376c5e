"""dspark_step_graph on the CPU: which steps stay eager and why, the inputs it
stages and the tensors it ignores (``dflash_step_graph``'s lists, checked against DSpark's own
reads), the result it hands out (``block_accept_lens`` cloned), the capture/replay flow around fakes
(``capture()`` itself over fakes of torch's CUDA graph and stream calls, with a worker whose draft
block ids grow by SGLang's own ``draft_block_ids_view``): warm-ups, pre-sizing on a key's first step,
the capture, the ``record_stream``, simulated draw and per-step input copy in that order, the
clones, ``on_publish`` after the launch with the captured step's keywords, a failed capture putting
the batch and the worker back, an object SGLang builds lazily during a capture (and a source scan
for ``try/except`` fallbacks, of which DSpark's step has none), a grown buffer or rebuilt object
after a capture (every stale graph dropped at once), the proposer's staging memo; the check (draft
KV rows of the verify window included, on the replay's simulated draw); the rules (per step,
capture off first, the scheduler's with the decode graph backend, the memory saver and token-count
staging, the live worker's, startup incl. SGLang's argument preparation) against SGLang 0.5.23's
code, the pinned sources, the unsafe ``dspark_mega`` switches, the plan beside
``eagle_step_graph`` and ``dflash_step_graph``, and that both block step graphs are in the catalogue, opt-in. The
joined graph runs in the real-server e2e, tests/test_gpu_block_step_graph.py."""

import ast
import collections
import inspect
import re
import textwrap
from types import SimpleNamespace as NS

import pytest
import torch
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockProposer
from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyExecutor
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

from sglang_hostsync_plugin.slot import ServingFacts, Status
from sglang_hostsync_plugin.slots import dflash_step_graph as dsg
from sglang_hostsync_plugin.slots import dspark_step_graph as dspk
from sglang_hostsync_plugin.slots import eagle_step_graph as es
from test_eagle_step_graph import FakeDriver, Mode, TorchGraph, fake_gpu

GAMMA = 5  # the draft block; DSpark verifies GAMMA + 1 tokens (the anchor first)
WIDTH = GAMMA + 1
MASK = 99  # the draft's mask token


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
           # A prefill's leftovers, rebound by the step before anything reads them (ignored):
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
                            penalizer_orchestrator=NS(is_required=False), sampling_mask_batch_indices=None,
                            grammar_mask=None, temperatures=torch.ones(bs, 1),
                            top_ks=torch.ones(bs, dtype=torch.int32)))
    for key, value in over.items():
        owner, _, name = key.rpartition("__")
        setattr({"": b, "spec": b.spec_info, "sampling": b.sampling_info}[owner], name, value)
    return b


# --- a worker whose draft block ids grow by SGLang's own code ---


class Proposer:
    """DraftBlockProposer's state; its buffer grows by SGLang's ``draft_block_ids_view``."""

    draft_block_ids_view = DraftBlockProposer.draft_block_ids_view

    def __init__(self):
        self.query_token_num, self._mask_token_id = WIDTH, MASK
        self._draft_block_ids_buf, self._staged_params_key, self.deferred_commit = None, None, None
        self.stages = 0  # sampling params staged (the fake step's memo, as DD:397-423)

    def stage(self, bs, sampling_info):
        key = (bs, sampling_info.temperatures, sampling_info.top_ks)
        staged = self._staged_params_key
        if staged is None or staged[0] != bs or staged[1] is not key[1] or staged[2] is not key[2]:
            self.stages += 1
            self._staged_params_key = key


class Executor:
    """TargetVerifyExecutor's state; ``begin_simulated_step`` fills the persistent buffer with the
    draw count (SGLang's draws a random length)."""

    def __init__(self, simulate=False):
        self._simulated_correct_len = torch.zeros(1, dtype=torch.int64) if simulate else None
        self._verify_backend_self_adds_seq_lens_cache = False
        self._target_is_dsv41 = False
        self.draws = 0

    def begin_simulated_step(self):
        if self._simulated_correct_len is None:
            return
        self.draws += 1
        self._simulated_correct_len.fill_(self.draws)


class Pool:
    """The draft KV pool: one layer's K and V."""

    def __init__(self, size=8 * 64):
        self.k, self.v = torch.zeros(size, 1, 2), torch.zeros(size, 1, 2)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def runner(attn=None, translating=False, **graphs):
    return NS(attn_backend=attn or backend("TritonAttnBackend"), kv_index_translator=NS(is_translating=translating),
              decode_cuda_graph_runner=NS(**{"_metadata_glue": None, **graphs}),
              ngram_embedding_manager=NS(engram_hasher=None))


class Worker:
    def __init__(self, max_bs=4, simulate=False):
        self.verify_num_draft_tokens = WIDTH
        self.model_runner = runner(max_bs=max_bs)
        self.model_runner.req_to_token_pool = NS(req_to_token=torch.arange(8 * 64).view(8, 64))
        self.draft_model_runner = runner()
        self.draft_model_runner.token_to_kv_pool = Pool()
        self.draft_model = NS(layers=[NS(self_attn=NS(attn=NS(layer_id=0)))], _fused_kv_write_cache=(0, "bundle"),
                              _stacked_ctx_kv_cache={"weight": "stacked"})
        self._proposer, self._verify_executor = Proposer(), Executor(simulate)
        self._verify_planner = NS(mode_value="static", schedules_verify_budget=False)
        self._draft_sampler, self._verify_epilogue, self._sampling_accept_graph = object(), None, None
        self._verify_inputs_ready, self._need_mamba_verify_commit, self._target_is_mambaish = None, False, False
        self._observers = NS(_info_dumper=NS(enabled=False), _block_accept_recorder=None, _sts_collect_path="")


@pytest.fixture
def cpu_tensors(monkeypatch):
    """CPU tensors stand for the device's, but those ``host()`` marked (the stray scan is
    dflash_step_graph's)."""
    monkeypatch.setattr(dsg, "on_device", lambda v: torch.is_tensor(v) and not getattr(v, "host", False))


@pytest.fixture(autouse=True)
def streams(monkeypatch):
    """``record_stream`` records the tensors it was given (``.recorded``)."""
    fakes = NS(recorded=[])
    monkeypatch.setattr(dspk, "record_stream", fakes.recorded.append)
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
    # verify_logits_adjustments_are_noop reads it: the verify's dense penalty fallback (U:252-263).
    ({"sampling__penalizer_orchestrator": NS(is_required=True)}, "penalties"),
    ({"sampling__logit_bias": torch.ones(2)}, "logit bias"),
    ({"sampling__has_watermark_candidates": True}, "watermark"),
    ({"sampling__sampling_mask_batch_indices": torch.arange(2)}, "sampling masks"),
    ({"sampling__grammar_mask": object()}, "sampling masks"),
    ({"hisparse_coordinator": object()}, "hisparse"),
    ({"mamba_track_indices": torch.ones(2)}, "mamba"),
    ({"seq_lens_cpu": torch.tensor([10, 11])}, "host sequence lengths"),
    ({"spec__nxt_kv_lens_cpu": None}, "no host KV bound"),
    ({"multimodal_inputs": [None, object()]}, "multimodal inputs"),
])
def test_steps_the_graph_cannot_hold_stay_eager(over, reason):
    assert dspk.ineligible(None, batch(), None) is None
    assert reason in dspk.ineligible(None, batch(**over), None)


def test_a_dp_prefill_coordination_step_stays_eager():
    assert "coordination plan" in dspk.ineligible(None, batch(), object())


def test_a_penalizer_that_is_not_required_keeps_the_step():
    assert dspk.ineligible(None, batch(sampling__penalizer_orchestrator=None), None) is None


def test_the_fields_the_rules_read_are_sglangs():
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    assert {"seq_lens_cpu", "multimodal_inputs", "hisparse_coordinator", "mamba_track_indices", "return_logprob",
            "return_hidden_states", "is_extend_in_batch", "forward_mode"} <= set(ScheduleBatch.__dataclass_fields__)
    assert {"is_all_greedy", "has_custom_logit_processor", "acc_additive_penalties", "acc_scaling_penalties",
            "penalizer_orchestrator", "logit_bias", "has_watermark_candidates", "sampling_mask_batch_indices",
            "grammar_mask"} <= set(SamplingBatchInfo.__dataclass_fields__)
    assert "nxt_kv_lens_cpu" in DFlashDraftInputV2.__dataclass_fields__


def src(obj) -> str:
    return inspect.getsource(obj)


def test_sglang_decides_its_host_bounds_on_the_fields_the_rules_read():
    """The host-length rules stand on these branches of SGLang's DSpark step (0.5.23)."""
    decode, draft = src(DSparkWorkerV2._forward_decode), src(DraftBlockProposer._run_forward)
    assert re.search(r"batch\.seq_lens_cpu\s+if batch\.seq_lens_cpu is not None\s+else draft_input\.nxt_kv_lens_cpu",
                     decode)
    assert "elif draft_input.nxt_kv_lens_cpu is not None:" in draft
    assert 'raise RuntimeError("DSpark decode expected batch.seq_lens_cpu, got None")' in draft
    assert "elif draft_input.nxt_kv_lens_cpu is not None:" in src(TargetVerifyExecutor.run_non_compact)


def test_the_penalty_rule_is_sglangs_noop_test():
    from sglang.srt.speculative.dspark_components import dspark_verify

    body = src(dspark_verify.verify_logits_adjustments_are_noop)
    for name in ("has_custom_logit_processor", "acc_linear_penalties", "penalizer.is_required", "grammar_mask",
                 "logit_bias"):
        assert name in body, name


# --- inputs and the ignore list ---


def test_the_inputs_are_dflash_step_graphs():
    """The gather, install and stray scan are dflash_step_graph's functions, which read its lists: this
    slot's lists must be those very objects."""
    assert dspk.INPUTS is dsg.INPUTS and dspk.IGNORED is dsg.IGNORED
    assert dspk.gather is dsg.gather and dspk.stray_input is dsg.stray_input and dspk.install is dsg.install


def test_inputs_are_gathered_in_name_order_and_the_ignored_tensors_are_not(cpu_tensors):
    b = batch()
    layout, tensors = dspk.gather(dspk.owners(b))
    assert [id(t) for t in tensors] == [id(b.req_pool_indices), id(b.seq_lens), id(b.orig_seq_lens),
                                        id(b.spec_info.bonus_tokens), id(b.spec_info.future_indices),
                                        id(b.sampling_info.temperatures), id(b.sampling_info.top_ks)]
    assert dspk.stray_input(dspk.owners(b)) is None
    assert dspk.present(dspk.owners(b))[-1] == "top_ks[2]"


@pytest.mark.parametrize("name, where", [("engram_history", ""), ("draft_probs", "spec"), ("vocab_mask", "sampling"),
                                         ("verify_lens", "spec")])
def test_a_stray_device_tensor_is_named(cpu_tensors, name, where):
    key = f"{where}__{name}" if where else name
    assert dspk.stray_input(dspk.owners(batch(**{key: torch.ones(2)}))) == f"SimpleNamespace.{name}"


def test_every_device_field_of_the_draft_input_is_an_input_or_ignored():
    """DSpark's step runs on DFlash's draft input class: a device tensor SGLang adds to it would keep
    every step eager (or be read stale) until it is sorted into the inputs or the ignore list."""
    import dataclasses

    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    tensors = {f.name for f in dataclasses.fields(DFlashDraftInputV2) if "Tensor" in str(f.type)}
    device = {n for n in tensors if "_cpu" not in n}
    sorted_ = set(dsg.DRAFT_INPUTS) | set(dsg.DRAFT_IGNORED)
    assert device == sorted_, device ^ sorted_
    assert src(DSparkWorkerV2._forward_decode).count("isinstance(draft_input, DFlashDraftInputV2)") == 1


def decode_sources() -> str:
    """What a static, greedy DSpark decode step runs of SGLang's Python (the step function and the
    components it calls on that path)."""
    from sglang.srt.speculative.dspark_components import dspark_planner

    fns = (DSparkWorkerV2._forward_decode, DraftBlockProposer.propose, DraftBlockProposer._run_forward,
           DraftBlockProposer.draft_block_ids_view, TargetVerifyExecutor.run_non_compact,
           TargetVerifyExecutor._forward_prepared_verify, TargetVerifyExecutor.accept_and_finalize,
           TargetVerifyExecutor.commit_hidden, dspark_planner.alloc_verify_window,
           DSparkWorkerV2._block_accept_lens)
    return "\n".join(src(f) for f in fns)


def test_the_ignored_tensors_are_rebound_or_unread_by_the_dspark_step():
    """Why the ignore list holds for DSpark too, from SGLang's source: the verify sets the batch's
    out_cache_loc before it prepares the verify batch (which sets input_ids before init_new reads
    it), nothing else of the step reads either, and the draft input's ignored fields are never read."""
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    text = decode_sources()
    uses = [m.start() for m in re.finditer(r"batch\.out_cache_loc\b", text)]
    assert len(uses) == 1 and text[uses[0]:].startswith("batch.out_cache_loc = verify_cache_loc")
    verify = src(TargetVerifyExecutor.run_non_compact)
    assert verify.index("batch.out_cache_loc = verify_cache_loc") < verify.index("self._forward_prepared_verify(")
    assert "batch.input_ids" not in text
    prep = src(DFlashVerifyInput.prepare_for_verify)
    assert prep.index("batch.input_ids = self.draft_token") < prep.index("ForwardBatch.init_new(")
    for name in dsg.DRAFT_IGNORED:
        assert f"draft_input.{name}" not in text, name


# Batch fields the DSpark step reads (0.5.23) that are host values, flags or objects, not device tensors.
BATCH_HOST_READS = {"seq_lens_cpu", "seq_lens_sum", "spec_info", "sampling_info", "forward_mode", "has_grammar",
                    "reqs", "return_logprob", "global_num_tokens", "forward_iter", "spec_verify_tier_num_tokens"}


def test_every_batch_field_the_dspark_step_reads_is_an_input_ignored_or_a_host_value():
    """A new read of a batch field by DSpark's own step code fails this until it is sorted (the verify's
    ForwardBatch.init_new is DFlash's too: dflash_step_graph's lists cover it)."""
    read = set(re.findall(r"batch\.(\w+)", decode_sources()))
    assert read - set(dsg.BATCH_INPUTS) - set(dsg.BATCH_IGNORED) == BATCH_HOST_READS
    assert {"seq_lens", "req_pool_indices"} <= read & set(dsg.BATCH_INPUTS)


# --- the handed-out result ---


def result(bs=3):
    return NS(next_token_ids=torch.arange(bs * WIDTH), accept_lens=torch.ones(bs, dtype=torch.int32),
              block_accept_lens=torch.ones(bs, dtype=torch.int32) + 1, new_seq_lens=torch.arange(bs) + 5,
              cap_lens=None, logits_output=NS(), can_run_cuda_graph=True,
              next_draft_input=NS(bonus_tokens=torch.arange(bs), new_seq_lens=torch.arange(bs) + 5),
              extra_keep_alive_refs=None)


def test_the_handed_out_result_clones_what_the_host_reads_block_accept_lens_included():
    step = dspk.StepGraph(3, [], result(), [], 0, 0)
    out = step.output()
    assert "block_accept_lens" in dspk.CLONED
    for name in dspk.CLONED:
        got, kept = getattr(out, name), getattr(step.result, name)
        assert got is not kept and got.data_ptr() != kept.data_ptr() and torch.equal(got, kept), name
    assert out.next_draft_input is not step.result.next_draft_input
    assert out.next_draft_input.bonus_tokens is step.result.next_draft_input.bonus_tokens  # relayed in stream order
    out.extra_keep_alive_refs.append(1)
    assert step.result.extra_keep_alive_refs is None


def host_read_fields():
    from sglang.srt.managers.utils import GenerationBatchResult as Result

    text = src(Result.copy_to_cpu) + src(Result.copy_auxiliary_output_to_cpu)
    fields = set(Result.__dataclass_fields__)
    read = ({m for m in re.findall(r"self\.(\w+)", text) if m in fields} | {"new_seq_lens"}) - {"copy_done"}
    assert {"next_token_ids", "accept_lens", "block_accept_lens", "cap_lens", "logits_output"} <= read
    return read - {"logits_output"}


def test_every_output_the_scheduler_reads_is_handed_out_fresh_or_keeps_sglangs_step():
    for name in sorted(host_read_fields()):
        captured = result()
        if getattr(captured, name, None) is None:
            setattr(captured, name, torch.arange(3) + 7)
        if dspk.side_output(captured) == name:
            continue
        assert dspk.side_output(captured) is None, name
        got, kept = getattr(dspk.StepGraph(3, [], captured, [], 0, 0).output(), name), getattr(captured, name)
        assert torch.is_tensor(got) and got is not kept and got.data_ptr() != kept.data_ptr(), name


def test_dsparks_result_carries_block_accept_lens_and_no_cap_lens_in_static_mode():
    """DW:1334-1339: ``block_accept_lens`` always (cloned here), ``cap_lens`` only with a ragged layout
    (a side output here: a static step has none)."""
    body = src(DSparkWorkerV2._forward_decode)
    assert "block_accept_lens=self._block_accept_lens(" in body
    assert re.search(r"layout\.verify_lens\.to\(torch\.int32\) if layout is not None else None", body)
    assert "cap_lens" in dspk.SIDE_OUTPUTS and "block_accept_lens" not in dspk.SIDE_OUTPUTS


def test_fingerprint_compares_float_bits_and_the_committed_draft_kv_rows():
    worker = Worker()
    b = batch(3)
    locs = dspk.verify_window(worker, b)
    assert torch.equal(locs, (b.req_pool_indices * 64 + b.seq_lens)[:, None] + torch.arange(WIDTH))
    r = result()
    r.accept_lens = torch.tensor([1, 2, WIDTH], dtype=torch.int32)
    a = dspk.fingerprint(r, worker, locs)
    assert all(not t.is_floating_point() for t in a) and len(a) == len(dspk.CLONED) + 1 + 2  # + K and V of 1 layer
    pool = worker.draft_model_runner.token_to_kv_pool
    pool.k[locs[0, 1]] = 7.0  # request 0's second window slot, past its 1 committed token
    assert all(torch.equal(x, y) for x, y in zip(a, dspk.fingerprint(r, worker, locs)))
    pool.v[locs[1, 1]] = float("nan")  # request 1's second slot: committed
    b1, b2 = dspk.fingerprint(r, worker, locs), dspk.fingerprint(r, worker, locs)
    assert not torch.equal(a[-1], b1[-1]) and torch.equal(b1[-1], b2[-1])  # NaN == NaN by bits
    r.block_accept_lens = r.block_accept_lens + 1
    assert not torch.equal(dspk.fingerprint(r, worker, locs)[3], a[3])


def test_the_verify_window_is_sglangs_plan_on_a_plain_pool():
    """alloc_verify_window plans ``width`` slots from the lengths on (req_to_token, seq_lens); the
    commit writes the draft KV there (the draft's ids of the same plan)."""
    from sglang.srt.speculative.dspark_components import dspark_planner

    body = src(dspark_planner.alloc_verify_window)
    assert "width=verify_w," in body and "seq_lens=prefix_lens," in body
    assert "verify_cache_loc_2d=verify_cache_loc.view(bs, verify_w)" in body
    commit = src(TargetVerifyExecutor.commit_hidden)
    assert "cache_loc = self.kv_injector.ids_for(verify_window.kv_loc_plan)" in commit
    assert "commit_lens=commit_lens," in commit


# --- the step hook around a fake capture ---


@pytest.fixture
def flow(monkeypatch, cpu_tensors):
    r = dspk.Route(driver=FakeDriver())
    monkeypatch.setattr(dspk, "_route", r)
    monkeypatch.setattr(dspk, "stream_handle", lambda: 0)
    captured = []
    worker = Worker()

    def fake_capture(original, w, b, tensors, key):
        step = dspk.StepGraph(len(b.seq_lens), [t.clone() for t in tensors], result(len(b.seq_lens)), [], 1,
                              len(captured) + 100, state=dspk.worker_state(w), publish={"confidence": "conf"})
        captured.append(step)
        return step

    monkeypatch.setattr(dspk, "capture", fake_capture)
    return r, captured, worker


def eager_step(out=result):
    calls = []

    def original(worker, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        calls.append(on_publish)
        return out(len(b.seq_lens))

    return original, calls


def test_two_eager_steps_then_a_capture_then_replays(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    published = []
    for _ in range(6):
        dspk.step_hook(original, worker, batch(), on_publish=lambda lens, **kw: published.append(kw))
    assert len(calls) == es.WARMUPS and len(captured) == 1 and r.replays == 6 - es.WARMUPS
    assert r.driver.launched == [100] * (6 - es.WARMUPS) and all(calls)  # eager steps got on_publish themselves
    assert published == [{"confidence": "conf"}] * (6 - es.WARMUPS)
    b = batch()
    b.seq_lens.fill_(77)
    b.spec_info.bonus_tokens.fill_(5)
    dspk.step_hook(original, worker, b)
    assert torch.equal(captured[0].slots[1], b.seq_lens) and torch.equal(captured[0].slots[3], b.spec_info.bonus_tokens)
    dspk.step_hook(original, worker, batch(orig_seq_lens=None))  # another layout: its own warm-up
    assert len(calls) == es.WARMUPS + 1 and len(r.warm) == 2


def test_on_publish_gets_the_cloned_lengths_after_the_launch(flow):
    r, captured, worker = flow
    order = []
    r.driver.launch = lambda exe, stream: order.append("launch")
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 2):
        dspk.step_hook(original, worker, batch(), on_publish=lambda lens, **kw: order.append(lens))
    kept = captured[0].result.new_seq_lens
    assert [x if isinstance(x, str) else "publish" for x in order] == ["launch", "publish"] * 2
    assert all(x is not kept and torch.equal(x, kept) for x in order if not isinstance(x, str))


def test_a_replay_records_the_lengths_draws_then_copies_then_launches(flow, monkeypatch, streams):
    """Stock records ``batch.seq_lens`` on the current stream (DW:1007) and draws the simulated length
    into its buffer before the verify reads it: a replay does both before its copy and launch."""
    r, captured, worker = flow
    order = []
    monkeypatch.setattr(dspk, "record_stream", lambda t: order.append(("record", t)))
    monkeypatch.setattr(worker._verify_executor, "begin_simulated_step", lambda: order.append(("draw", None)))
    real_copy = torch._foreach_copy_

    def copy_(dst, src_):
        order.append(("copy", src_))
        return real_copy(dst, src_)

    monkeypatch.setattr(torch, "_foreach_copy_", copy_)
    r.driver.launch = lambda exe, stream: order.append(("launch", exe))
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dspk.step_hook(original, worker, batch())
    assert not order  # the eager steps record and draw themselves
    b = batch()
    dspk.step_hook(original, worker, b)
    assert [what for what, _ in order] == ["record", "draw", "copy", "launch"]
    assert order[0][1] is b.seq_lens and any(t is b.seq_lens for t in order[2][1])


def test_a_replay_clears_the_proposers_staging_memo(flow):
    """A replay restages the draft sampler's params from its own slots; SGLang's memo would skip the
    next eager step's staging for tensors it saw before."""
    r, captured, worker = flow
    original, calls = eager_step()
    b = batch()

    def staging(w, b_, on_publish=None, grammar_barrier=None, coordination_plan=None):
        w._proposer.stage(len(b_.seq_lens), b_.sampling_info)
        return result(len(b_.seq_lens))

    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(staging, worker, b)
    assert worker._proposer.stages == 1 and r.replays == 1 and worker._proposer._staged_params_key is None
    staging(worker, b)  # the same batch's next eager step (the check's rerun, say)
    assert worker._proposer.stages == 2


def test_a_stray_device_tensor_keeps_that_step_eager_after_the_capture(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(original, worker, batch())
    dspk.step_hook(original, worker, batch(spec__extra_mask=torch.ones(2)))
    assert r.replays == 1 and len(calls) == es.WARMUPS + 1
    assert r.eager == {"the step reads SimpleNamespace.extra_mask": 1}


def test_disabled_skipped_and_ineligible_steps_run_sglangs_function(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    dspk.step_hook(original, worker, batch(seq_lens_cpu=host(torch.tensor([10, 11]))))
    dspk.step_hook(original, worker, batch(), coordination_plan=object())
    r.skip.add(2)
    for _ in range(4):
        dspk.step_hook(original, worker, batch(2))
    r.disabled = "capture failed"
    for _ in range(4):
        dspk.step_hook(original, worker, batch(3))
    assert len(calls) == 10 and not captured and r.replays == 0
    assert set(r.eager) == {"host sequence lengths (seq_lens_cpu)", "bs 2 has no step graph", "capture off",
                            "no draft input or sampling info (or a DP prefill coordination plan)"}


def test_the_number_of_graphs_is_bounded(flow):
    r, captured, worker = flow
    r.max_graphs = 2
    original, calls = eager_step()
    for bs in (1, 2, 3) * 3 + (3, 3):
        dspk.step_hook(original, worker, batch(bs))
    assert len(captured) == 2 and r.eager == {f"2 step graphs held already ({es.ENV_MAX})": 3}


def test_a_nested_call_inside_a_capture_is_sglangs(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    r.capture = object()
    dspk.step_hook(original, worker, batch())
    assert len(calls) == 1 and not r.eager


def rebuild(worker, name):
    """SGLang building one of the lazily built objects again (a new pool, say), or growing the buffer."""
    if name == "_draft_block_ids_buf":
        worker._proposer.draft_block_ids_view(bs=9, device=torch.device("cpu"))
    elif name == "_verify_backend_self_adds_seq_lens_cache":
        worker._verify_executor._verify_backend_self_adds_seq_lens_cache = True
    else:
        setattr(worker.draft_model, name, (1, "rebuilt"))


@pytest.mark.parametrize("name", ["_draft_block_ids_buf", *(n for _, n in dspk.LAZY_STATE)])
def test_a_graph_whose_worker_buffer_or_objects_changed_is_dropped_and_captured_again(flow, name):
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 2):
        dspk.step_hook(original, worker, batch(2))
    assert r.replays == 2 and len(r.graphs) == 1
    rebuild(worker, name)
    dspk.step_hook(original, worker, batch(2))
    assert r.driver.destroyed == [100] and not r.graphs and r.replays == 2 and len(calls) == es.WARMUPS + 1
    for _ in range(es.WARMUPS):
        dspk.step_hook(original, worker, batch(2))
    assert len(captured) == 2 and r.driver.launched[-1] == 101


def test_an_unchanged_worker_keeps_its_graph(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(original, worker, batch(2))
    worker._proposer.draft_block_ids_view(bs=4, device=torch.device("cpu"))  # within the pre-sized rows
    for _ in range(3):
        dspk.step_hook(original, worker, batch(2))
    assert r.replays == 4 and not r.driver.destroyed


def test_a_changed_worker_drops_every_graph_captured_before_the_change(flow):
    r, captured, worker = flow
    original, calls = eager_step()
    for bs in (1, 2, 3) * (es.WARMUPS + 1):
        dspk.step_hook(original, worker, batch(bs))
    assert len(r.graphs) == 3 and r.replays == 3
    rebuild(worker, "_fused_kv_write_cache")
    dspk.step_hook(original, worker, batch(2))
    assert sorted(r.driver.destroyed) == [100, 101, 102] and not r.graphs
    assert all(v == (1 if k[0] == 2 else 0) for k, v in r.warm.items())


def test_the_check_runs_sglangs_step_after_the_replay_and_serves_its_result(flow):
    r, captured, worker = flow
    r.check = 2
    returned = []

    def original(w, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        if on_publish is not None:
            on_publish(torch.zeros(1), confidence="eager conf")
        returned.append(result(len(b.seq_lens)))
        return returned[-1]

    published = []
    outs = [dspk.step_hook(original, worker, batch(), on_publish=lambda lens, **kw: published.append((lens, kw)))
            for _ in range(es.WARMUPS + 4)]
    assert r.checks == 2 and len(returned) == es.WARMUPS + 2 and r.replays == 4
    assert len(published) == es.WARMUPS + 4
    assert outs[es.WARMUPS + 1] is returned[-2] and published[es.WARMUPS + 1][0] is returned[-2].new_seq_lens
    assert published[es.WARMUPS + 1][1] == {"confidence": "eager conf"}  # the eager step's, published once
    r.tally.settle(r.checks)
    assert r.tally.mismatches == 0


def test_the_checked_rerun_reads_the_replays_simulated_draw(flow):
    """Each replay draws once before its launch; the check's rerun of SGLang's step draws nothing (its
    draw is shadowed) and reads the replay's length, as the replay did."""
    r, captured, worker = flow
    worker._verify_executor = Executor(simulate=True)
    r.check = 2
    seen = []

    def original(w, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        w._verify_executor.begin_simulated_step()
        seen.append(int(w._verify_executor._simulated_correct_len))
        return result(len(b.seq_lens))

    for _ in range(es.WARMUPS + 4):
        dspk.step_hook(original, worker, batch())
    # eager, eager (capture: fake), replay 1 (draw 3), replay 2 checked (draw 4; rerun reads 4), replay 3, 4 (check)
    assert worker._verify_executor.draws == es.WARMUPS + 4 and seen == [1, 2, 4, 6]
    assert "begin_simulated_step" not in vars(worker._verify_executor)


@pytest.mark.parametrize("write_at, mismatches", [(0, 3), (WIDTH - 1, 0)])
def test_the_check_counts_draft_kv_rows_that_differ_from_sglangs(flow, write_at, mismatches):
    """SGLang's step writes a draft KV row the replay did not: a mismatch where the row is committed
    (accept length 1: the window's first slot), none past it."""
    r, captured, worker = flow
    r.check = 1
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dspk.step_hook(original, worker, batch())
    pool = worker.draft_model_runner.token_to_kv_pool

    def other(w, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        pool.k[dspk.verify_window(w, b)[0, write_at]] += 1.0
        return result(len(b.seq_lens))

    for _ in range(3):
        dspk.step_hook(other, worker, batch())
    r.tally.settle(r.checks)
    assert r.checks == 3 and r.tally.mismatches == mismatches


@pytest.mark.parametrize("field", ["block_accept_lens", "bonus"])
def test_the_check_counts_a_replay_whose_outputs_differ(flow, field):
    r, captured, worker = flow
    r.check = 1
    original, calls = eager_step()
    for _ in range(es.WARMUPS):
        dspk.step_hook(original, worker, batch())

    def other(w, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        out = result(len(b.seq_lens))
        if field == "bonus":
            out.next_draft_input.bonus_tokens = out.next_draft_input.bonus_tokens + 1
        else:
            out.block_accept_lens = out.block_accept_lens + 1
        return out

    for _ in range(3):
        dspk.step_hook(other, worker, batch())
    r.tally.settle(r.checks)
    assert r.checks == 3 and r.tally.mismatches == 3


def test_with_capture_off_a_step_reads_no_rule(flow, monkeypatch):
    r, captured, worker = flow
    r.disabled = "8 captures failed"

    def unread(*args):
        raise AssertionError("read with capture off")

    for name in ("ineligible", "stray_input", "gather"):
        monkeypatch.setattr(dspk, name, unread)
    original, calls = eager_step()
    for _ in range(3):
        dspk.step_hook(original, worker, batch())
    assert len(calls) == 3 and r.eager == {"capture off": 3}


def test_replay_hook_cuts_only_inside_this_slots_capture(monkeypatch):
    cuts = []
    cap = NS(cut=lambda backend_, key: cuts.append(key))
    runner_ = NS(_outputs={4: "static out"})
    original = lambda self, key, fb, **kw: ("replayed", key)  # noqa: E731
    monkeypatch.setattr(dsg, "_route", dsg.Route(capture=cap))  # dflash_step_graph's capture: not this slot's
    monkeypatch.setattr(es, "_route", es.Route(capture=cap))
    assert dspk.replay_hook(original, runner_, 4, None) == ("replayed", 4) and not cuts
    monkeypatch.setattr(dspk, "_route", dspk.Route(capture=cap))
    assert dspk.replay_hook(original, runner_, 4, None) == "static out" and cuts == [4]


def test_a_runner_capture_after_startup_drops_this_slots_graphs_and_keeps_the_runner_graph(flow, monkeypatch):
    r, captured, worker = flow
    monkeypatch.setattr(es, "_route", es.Route())
    original, calls = eager_step()
    for bs in (1, 2) * (es.WARMUPS + 2):
        dspk.step_hook(original, worker, batch(bs))
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

    runner_ = NS(_graphs={})
    dspk.keep_hook(capture_one, runner_, 1, None)
    assert r.graphs == {} and sorted(r.driver.destroyed) == [100, 101] and r.warm == {} and r.pool is None
    assert seen["keywords"] == {"keep_graph": True} and runner_._graphs[1].instantiated and module.torch is real


# --- the real capture() over fakes of torch's CUDA calls ---


@pytest.fixture
def gpu(monkeypatch, cpu_tensors):
    return fake_gpu(monkeypatch, dspk)


RUNNERS = [NS(_graphs=collections.defaultdict(lambda: TorchGraph(None)),
              _outputs=collections.defaultdict(lambda: "static out")) for _ in range(dspk.CHILDREN)]


def sglang_step(fail_at=None, build=None, runners=RUNNERS, out=None):
    """A step shaped like DSpark v2's ``_forward_decode`` (static, greedy, folded): the draft block ids
    (SGLang's growing buffer), the simulated draw, the draft sampler's staging memo, the two runner
    replays, fresh accept outputs, ``on_publish`` with a confidence keyword, the committed draft KV
    rows, fields of the batch rebound. ``fail_at``: a batch size whose step raises under capture
    after the first runner. ``build``: (owner, attribute, value) SGLang sets under capture (a lazy
    first use). ``step.ptrs``: the buffer addresses each call ran on; ``step.lens``: the simulated
    length each call read."""
    calls, seen, ptrs, lens = [], [], [], []

    def step(worker, b, on_publish=None, grammar_barrier=None, coordination_plan=None):
        capturing = dspk._route.capture is not None
        calls.append(capturing)
        seen.append((b.seq_lens, b.spec_info, b.out_cache_loc))
        bs = len(b.seq_lens)
        ids = worker._proposer.draft_block_ids_view(bs=bs, device=b.seq_lens.device)
        ptrs.append(dspk.buffer_pointers(worker))
        ids[:, 0].copy_(b.spec_info.bonus_tokens)
        executor = worker._verify_executor
        executor.begin_simulated_step()
        simulated = executor._simulated_correct_len
        lens.append(None if simulated is None else int(simulated))
        worker._proposer.stage(bs, b.sampling_info)
        locs = dspk.verify_window(worker, b)
        for runner_ in runners:
            dspk.replay_hook(lambda self, key, fb, **kw: "replayed", runner_, bs, None)
            if capturing and bs == fail_at:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        if capturing and build is not None:
            owner, name, value = build
            setattr(owner(worker), name, value)
        correct = b.seq_lens % 3 if simulated is None else simulated.repeat(bs)
        commit = (correct + 1).to(torch.int32)
        bonus, tokens = b.spec_info.bonus_tokens + 1, torch.arange(bs * WIDTH).view(bs, WIDTH)
        new_lens = b.seq_lens + commit
        if on_publish is not None:
            on_publish(new_lens, confidence=torch.ones(bs, GAMMA))
        keep = torch.arange(WIDTH)[None, :] < commit[:, None]
        worker.draft_model_runner.token_to_kv_pool.k[locs[keep]] = 1.0
        b.out_cache_loc, b.input_ids, b.spec_info = locs.reshape(-1), tokens.reshape(-1), "verify input"
        if out is not None:
            return out()
        return NS(next_token_ids=tokens.reshape(-1), accept_lens=commit, block_accept_lens=commit + 0,
                  new_seq_lens=new_lens, cap_lens=None, logits_output=NS(), can_run_cuda_graph=True,
                  next_draft_input=NS(bonus_tokens=bonus, new_seq_lens=new_lens), extra_keep_alive_refs=None)

    step.seen, step.ptrs, step.lens = seen, ptrs, lens
    return step, calls


def test_the_block_ids_are_presized_to_the_largest_decode_graph_before_the_first_warm_up(gpu):
    from sglang.srt.speculative.dspark_components import dspark_draft

    dspark_draft._zero.cache_clear()
    r, side = gpu
    worker = Worker(max_bs=4)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dspk.step_hook(step, worker, batch(1))
    assert calls == [False] * es.WARMUPS + [True] and r.replays == 2
    buf = worker._proposer._draft_block_ids_buf
    assert buf.shape == (4, WIDTH) and bool((buf[:, 1:] == MASK).all())
    assert len(set(step.ptrs)) == 1 and step.ptrs[0] == dspk.buffer_pointers(worker)  # warm-ups on the captured one
    assert dspark_draft._zero.cache_info().currsize == 1  # the cached scalar the draft reads, built before a capture
    (graph,) = r.graphs.values()
    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(step, worker, batch(4))  # bs 4's warm-ups and capture: no growth, the bs 1 graph stays
    assert worker._proposer._draft_block_ids_buf is buf and graph.current(worker) and len(r.graphs) == 2


def test_a_capture_restores_the_batch_and_keeps_the_publish_keywords(gpu):
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step()
    for _ in range(es.WARMUPS):
        dspk.step_hook(step, worker, batch())
    b = batch()
    before = dict(vars(b)), dict(vars(b.spec_info)), dict(vars(b.sampling_info))
    published = []
    out = dspk.step_hook(step, worker, b, on_publish=lambda lens, **kw: published.append((lens, kw)))
    assert calls[-1] is True and r.replays == 1
    for old, new in zip(before, (vars(b), vars(b.spec_info), vars(b.sampling_info))):
        assert new.keys() == old.keys() and all(new[k] is old[k] for k in old)
    (graph,) = r.graphs.values()
    assert set(graph.publish) == {"confidence"} and published[0][1]["confidence"] is graph.publish["confidence"]
    assert published[0][0] is out.new_seq_lens and out.new_seq_lens is not graph.result.new_seq_lens
    assert side.log == ["enter", "begin", "end", "begin", "end", "begin", "end", "exit"]  # 3 segments, 2 children
    assert worker._proposer._staged_params_key is None  # the capture restaged from its slots


def test_the_simulated_draw_is_not_captured_and_each_replay_draws_once(gpu):
    r, side = gpu
    worker = Worker(simulate=True)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 3):
        dspk.step_hook(step, worker, batch())
    ex = worker._verify_executor
    # 2 eager steps draw (1, 2); the capture reads the buffer undrawn (2); 3 replays draw 3, 4, 5.
    assert step.lens == [1, 2, 2] and ex.draws == es.WARMUPS + 3 and r.replays == 3
    assert "begin_simulated_step" not in vars(ex)  # the shadow is gone


def test_a_failed_capture_puts_the_batch_and_the_worker_back(gpu, caplog):
    r, side = gpu
    worker = Worker(simulate=True)
    step, calls = sglang_step(fail_at=2)
    for _ in range(es.WARMUPS):
        dspk.step_hook(step, worker, batch(2))
    lazy = [v for _, _, v in dspk.lazy_state(worker)]
    b = batch(2)
    mine = b.seq_lens, b.spec_info, b.out_cache_loc
    dspk.step_hook(step, worker, b)  # the capture fails; SGLang's step runs on the scheduler's own fields
    assert step.seen[-2][0] is not mine[0] and step.seen[-1] == mine
    assert side.log == ["enter", "begin", "end", "begin", "end", "exit"] and not side.capturing and side.routed == 0
    assert [v for _, _, v in dspk.lazy_state(worker)] == lazy and "begin_simulated_step" not in vars(
        worker._verify_executor)
    assert step.lens[-1] == es.WARMUPS + 1  # SGLang's step drew for itself, after the capture
    key = (2, dspk.gather(dspk.owners(batch(2)))[0])
    assert r.failures == {key: 1} and r.failed == 1 and not r.disabled and r.pool is None and r.replays == 0
    assert "capturing the bs 2 step failed (1 of 2" in caplog.text


@pytest.mark.parametrize("owner, name, value", [
    ("draft_model", "_fused_kv_write_cache", (1, "bundle built under capture")),
    ("draft_model", "_stacked_ctx_kv_cache", {"weight": "under capture"}),
    ("draft_model", "_stacked_ctx_kv_cache", "absent before"),
    ("_verify_executor", "_verify_backend_self_adds_seq_lens_cache", True),
])
def test_an_object_sglang_builds_during_a_capture_fails_it_and_is_put_back(gpu, caplog, owner, name, value):
    """A step's first use of a lazily built object inside the capture: the graph would hold what it
    allocated there and SGLang would keep it; the capture fails and the attribute is put back (or
    removed, where it was never set)."""
    r, side = gpu
    worker = Worker()
    if value == "absent before":
        del worker.draft_model._stacked_ctx_kv_cache
        value = {"weight": "first use"}
    holder = getattr(worker, owner)
    had = name in vars(holder)
    old = getattr(holder, name, None)
    step, calls = sglang_step(build=(lambda w: getattr(w, owner), name, value))
    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(step, worker, batch(2))
    assert calls == [False] * es.WARMUPS + [True, False] and r.failed == 1 and not r.graphs
    assert (name in vars(holder)) == had and getattr(holder, name, None) is old
    assert f"SGLang built {name} during the capture" in caplog.text


def test_a_step_with_fewer_runner_graphs_leaves_its_batch_size_to_sglang(gpu):
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step(runners=RUNNERS[:1])  # the verify ran eagerly (no graph for this size)
    for _ in range(es.WARMUPS + 3):
        dspk.step_hook(step, worker, batch(3))
    assert r.skip == {3} and not r.graphs and r.eager == {"bs 3: 1 of the 2 runner graphs replayed": 1,
                                                          "bs 3 has no step graph": 2}


@pytest.mark.parametrize("field, value", [("routed_experts_output", NS(topk_ids=torch.zeros(2, 8))),
                                          ("cap_lens", torch.ones(2, dtype=torch.int32))])
def test_a_step_returning_a_side_output_stays_sglangs(gpu, field, value):
    r, side = gpu
    worker = Worker()

    def with_side():
        out = result(2)
        setattr(out, field, value)
        return out

    step, calls = sglang_step(out=with_side)
    for _ in range(es.WARMUPS + 3):
        dspk.step_hook(step, worker, batch())
    assert r.replays == 0 and not r.graphs and field in r.disabled


def test_captures_and_replays_then_a_grown_buffer_recaptures(gpu, caplog):
    r, side = gpu
    caplog.set_level("INFO", logger="sglang.srt.plugins.hostsync")
    worker = Worker(max_bs=2)
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 2):
        dspk.step_hook(step, worker, batch(2))
    assert r.replays == 2
    assert "dspark_step_graph: bs 2 step captured: 3 segments around the 2 runner graphs" in caplog.text
    step(worker, batch(8))  # an eager bs-8 step (past the decode graphs) re-creates the block ids
    for _ in range(es.WARMUPS + 2):  # the stale graph goes; two eager warm-ups, a capture, a replay
        dspk.step_hook(step, worker, batch(2))
    assert r.driver.destroyed == [201] and r.replays == 4 and len(r.graphs) == 1
    # The stale graph was the only one: the recapture goes into a fresh pool (torch refuses the old one).
    assert len(set(side.pools)) == 2 and r.pool == side.pools[-1]
    assert next(iter(r.graphs.values())).current(worker)


def test_a_captured_graph_keeps_the_objects_whose_identities_it_checks(gpu):
    """The staleness check compares ``id``s: the graph holds the objects, so a freed one's id cannot
    come back on a new object and pass for it."""
    r, side = gpu
    worker = Worker()
    step, calls = sglang_step()
    for _ in range(es.WARMUPS + 1):
        dspk.step_hook(step, worker, batch())
    (graph,) = r.graphs.values()
    assert graph.held[0] is worker.draft_model._fused_kv_write_cache
    assert graph.state[1:] == tuple(id(v) for v in graph.held)


# --- server-wide, worker and startup rules ---


def good_worker(**over):
    """A worker with ``over``'s attributes (dotted: an attribute of one of its parts)."""
    w = Worker()
    for k, v in over.items():
        owner, _, name = k.rpartition(".")
        setattr(getattr(w, owner) if owner else w, name, v)
    return w


def fa3(**attrs):
    return backend("FlashAttentionBackend", **{"fa_impl_ver": 3, "_kv_shard_pool": None, **attrs})


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"_need_mamba_verify_commit": True}, "mamba"),
    ({"_target_is_mambaish": True}, "mamba"),
    ({"_verify_planner": NS(mode_value="compact", schedules_verify_budget=True)}, "SGLANG_RAGGED_VERIFY_MODE=compact"),
    ({"_verify_planner": NS(mode_value="cap-accept", schedules_verify_budget=True)}, "cap-accept"),
    ({"_verify_planner": NS(mode_value="static", schedules_verify_budget=True)}, "static"),
    ({"_draft_sampler": None}, "no folded proposal"),
    ({"_verify_epilogue": object()}, "verify epilogue"),
    ({"_sampling_accept_graph": object()}, "verify epilogue"),
    ({"_proposer.deferred_commit": object()}, "deferred context-KV commit"),
    ({"_verify_inputs_ready": object()}, "early target metadata"),
    ({"_verify_executor._target_is_dsv41": True}, "DeepSeek V4.1"),
    ({"_observers": NS(_info_dumper=NS(enabled=True), _block_accept_recorder=None, _sts_collect_path="")},
     "info dumper"),
    ({"_observers": NS(_info_dumper=NS(enabled=False), _block_accept_recorder=object(), _sts_collect_path="")},
     "block-accept estimator"),
    ({"_observers": NS(_info_dumper=NS(enabled=False), _block_accept_recorder=None, _sts_collect_path="x")},
     "STS collection"),
    ({"model_runner": runner(translating=True)}, "target's translated KV pool"),
    ({"draft_model_runner": runner(translating=True)}, "draft's translated KV pool"),
    ({"model_runner": runner(_metadata_glue=object())}, "target runner's metadata glue graph"),
    ({"draft_model_runner": runner(_metadata_glue=object())}, "draft runner's metadata glue graph"),
    ({"model_runner": runner(backend("FlashInferAttnBackend"))}, "FlashInferAttnBackend"),
    ({"model_runner": runner(fa3()), "draft_model_runner": runner(fa3())}, None),
    ({"model_runner": runner(fa3())}, "fa3, triton"),  # target and draft alike
    ({"draft_model_runner": runner(backend("DeepseekV4AttnBackend"))}, "DeepseekV4AttnBackend"),  # a DSV4 draft
])
def test_worker_rules(over, reason):
    got = dspk.worker_unsupported(good_worker(**over))
    assert (got is None) if reason is None else (reason in got), got


def test_the_engram_hasher_and_the_confidence_probe_keep_sglangs_step(monkeypatch):
    from sglang.srt.environ import envs

    w = Worker()
    w.model_runner.ngram_embedding_manager = NS(engram_hasher=object())
    assert "engram hasher" in dspk.worker_unsupported(w)
    monkeypatch.setenv("SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS", "1")
    assert envs.SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS.get()
    assert "confidence metrics probe" in dspk.worker_unsupported(Worker())


def worker_source() -> str:
    from sglang.srt.speculative.dspark_components import dspark_observability

    return "\n".join(src(c) for c in (DSparkWorkerV2, DraftBlockProposer, TargetVerifyExecutor,
                                      dspark_observability.DsparkStepObservers))


def test_the_worker_fields_the_rules_read_are_set_by_sglang():
    text = worker_source()
    for name in ("_need_mamba_verify_commit", "_target_is_mambaish", "_verify_planner", "_draft_sampler",
                 "_verify_epilogue", "_sampling_accept_graph", "_verify_inputs_ready", "_proposer",
                 "_verify_executor", "_observers", "deferred_commit", "_draft_block_ids_buf", "_staged_params_key",
                 "_target_is_dsv41", "_simulated_correct_len", "_info_dumper", "_block_accept_recorder",
                 "_sts_collect_path", "verify_num_draft_tokens"):
        assert f"self.{name} =" in text or f"self.{name}: " in text, name
    assert "self.model_runner = target_worker.model_runner" in src(DSparkWorkerV2.__init__)
    from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import NgramEmbeddingManager
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner

    assert "engram_hasher" in NgramEmbeddingManager.__dataclass_fields__
    assert "self._metadata_glue = (" in src(DecodeCudaGraphRunner.__init__)
    assert {"mode_value", "schedules_verify_budget"} <= {n for n, v in vars(DSparkVerifyPlanner).items()
                                                          if isinstance(v, property)}


def test_the_epilogue_and_its_graphs_come_only_beside_static_dsv41_or_compact():
    """Where the worker builds the verify epilogue (and the sampling-accept graph and deferred commit
    inside it): compact mode, or a static DeepSeek V4.1 target with an MoE draft. The static dense-draft
    step this slot captures has none of them."""
    init = src(DSparkWorkerV2.__init__)
    assert re.search(r"\(self\._verify_planner\.is_compact_mode or static_epilogue_supported\)\s+and "
                     r"self\._decode_graph_allowed", init)
    assert re.search(r"static_epilogue_supported = \(\s+target_is_dsv41", init)
    assert init.index("self._verify_epilogue = DsparkVerifyEpilogue(") < init.index(
        "self._sampling_accept_graph = DsparkSamplingAcceptGraph(")


def except_path_assignments(cls) -> set[str]:
    """Every ``self.<name> = False`` / ``= None`` inside an ``except`` block of ``cls``'s methods."""
    found = set()
    for handler in ast.walk(ast.parse(textwrap.dedent(src(cls)))):
        if not isinstance(handler, ast.ExceptHandler):
            continue
        for node in ast.walk(handler):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        found.add(target.attr)
    return found


def test_no_sglang_fallback_in_the_dspark_step_turns_a_flag_off():
    """dflash_step_graph guards the flags DFlash's ``try/except`` fallbacks turn off during a capture.
    DSpark's step has no such fallback (0.5.23); a new one fails this test until it is guarded too."""
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.models.dspark import DSparkDraftMixin
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.dspark_components import (
        dspark_draft_sampler,
        dspark_kv_inject,
        dspark_planner,
    )

    classes = (DSparkWorkerV2, DraftBlockProposer, TargetVerifyExecutor, dspark_kv_inject.TargetHiddenKvInjector,
               dspark_planner.DSparkVerifyPlanner, dspark_draft_sampler.DsparkDraftSampler, DSparkDraftMixin,
               DFlashDraftModel)
    assert {c.__name__: except_path_assignments(c) for c in classes} == {c.__name__: set() for c in classes}
    # The scan finds DFlash's fallbacks (the ones dflash_step_graph guards).
    assert {"_use_triton_prepare_block", "_use_triton_accept_bonus"} <= except_path_assignments(DFlashWorkerV2)


def test_the_lazily_built_objects_are_built_on_first_use_by_sglang():
    from sglang.srt.models.dspark import DSparkDraftMixin, DSparkDraftModel

    assert issubclass(DSparkDraftModel, DSparkDraftMixin)
    model = src(DSparkDraftMixin)
    assert "self._fused_kv_write_cache = (id(pool), bundle)" in model
    assert 'getattr(self, "_stacked_ctx_kv_cache", False)' in model and "self._stacked_ctx_kv_cache = {" in model
    assert "self._verify_backend_self_adds_seq_lens_cache = hasattr(" in src(TargetVerifyExecutor)
    assert [n for _, n in dspk.LAZY_STATE] == ["_fused_kv_write_cache", "_stacked_ctx_kv_cache",
                                               "_verify_backend_self_adds_seq_lens_cache"]


def test_the_block_ids_buffer_grows_to_exactly_the_new_batch_size():
    """DD:544-555, as design section 1 reads it: a larger step frees the buffer a graph points at."""
    p = Proposer()
    a = p.draft_block_ids_view(bs=2, device=torch.device("cpu"))
    assert p._draft_block_ids_buf.shape == (2, WIDTH) and bool((a == MASK).all())
    ptr = p._draft_block_ids_buf.data_ptr()
    p.draft_block_ids_view(bs=1, device=torch.device("cpu"))
    assert p._draft_block_ids_buf.data_ptr() == ptr
    p.draft_block_ids_view(bs=3, device=torch.device("cpu"))
    assert p._draft_block_ids_buf.shape == (3, WIDTH) and p._draft_block_ids_buf.data_ptr() != ptr


def test_the_staging_memo_is_keyed_on_tensor_identity():
    body = src(DraftBlockProposer._stage_sampling_params)
    assert "all(staged[i] is key[i] for i in (0, 2, 3))" in body and "self._staged_params_key = key" in body


def test_sglangs_step_draws_the_simulated_length_through_the_call_the_slot_shadows():
    """DW:1138-1139 (and the draw-ahead path) call ``begin_simulated_step`` on the executor instance;
    SGLang's draws on the host and fills the persistent buffer the accept reads."""
    assert "self._verify_executor.begin_simulated_step()" in src(DSparkWorkerV2._forward_decode)
    assert "executor.begin_simulated_step()" in src(DSparkWorkerV2._begin_simulated_step_ahead)
    body = src(TargetVerifyExecutor.begin_simulated_step)
    assert "sample_simulated_acc_len(" in body and "self._simulated_correct_len.fill_(" in body
    assert re.search(r"correct_len = simulated_correct_len\.repeat\(bs\)", src(
        __import__("sglang.srt.speculative.dspark_components.dspark_verify", fromlist=["x"]).build_accept_outs))


def test_draw_outside_shadows_and_restores_an_instance_attribute():
    w = Worker(simulate=True)
    with dspk.draw_outside(w):
        w._verify_executor.begin_simulated_step()
        assert w._verify_executor.draws == 0
    assert "begin_simulated_step" not in vars(w._verify_executor)
    mine = lambda: None  # noqa: E731 (another plugin's instance attribute, say)
    w._verify_executor.begin_simulated_step = mine
    with dspk.draw_outside(w):
        assert w._verify_executor.begin_simulated_step is not mine
    assert w._verify_executor.begin_simulated_step is mine


def test_the_static_greedy_step_replays_two_runner_graphs():
    """The draft forward (DraftBlockProposer._run_forward) and the target verify
    (TargetVerifyExecutor._forward_prepared_verify) are the step's only runner forwards on the static
    path; the sampling-accept region (its own graph) runs only for all-sampled batches."""
    decode = src(DSparkWorkerV2._forward_decode)
    assert decode.count("self._proposer.propose(") == 1 and decode.count("self._verify_executor.run_non_compact(") == 1
    assert src(DraftBlockProposer._run_forward).count("self.draft_model_runner.forward(") == 1
    assert src(TargetVerifyExecutor._forward_prepared_verify).count(
        "self.target_worker.forward_batch_generation(") == 1
    assert "and not sampling_info.is_any_greedy" in src(DSparkWorkerV2._sampling_graph_eligible)
    assert dspk.CHILDREN == 2


def test_sglang_calls_the_hooked_decode_function_positionally():
    body = src(DSparkWorkerV2.forward_batch_generation)
    assert "return self._forward_decode(batch, on_publish, grammar_barrier)" in body
    assert "coordination_plan=plan" in src(DSparkWorkerV2._forward_dp_spec_prefill_coordination)


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
        got = dspk.unsupported(Worker())
    finally:
        ctx.__exit__(None, None, None)
    assert (got is None) if reason is None else (reason in got), got


@pytest.mark.parametrize("decode, saver, env, reason", [
    (None, False, None, None),  # no --cuda-graph-config: SGLang's default decode backend, full
    ({"backend": "full"}, False, None, None),
    ({"backend": "breakable"}, False, None, "'breakable', not 'full'"),
    ({"backend": "disabled"}, False, None, "'disabled', not 'full'"),
    (None, True, None, None),
    (None, True, "1", "SGLANG_MEMORY_SAVER_CUDA_GRAPH"),
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
        got = dspk.unsupported(Worker())
    assert (got is None) if reason is None else (reason in got), got


def test_token_count_staging_keeps_sglangs_step(monkeypatch):
    """``_make_num_token_non_padded`` (DD:48-57) copies a fresh pinned scalar to the device: captured,
    a replay would copy from freed host memory."""
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.dspark_components import dspark_draft

    assert "pin_memory=is_pin_memory_available(device)" in src(dspark_draft._make_num_token_non_padded)
    with get_context().override_server_args():
        assert dspk.unsupported(Worker()) is None
        monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: True)
        assert "token-count staging" in dspk.unsupported(Worker())


def test_the_scheduler_rules_include_the_worker_rules():
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args():
        assert "no folded proposal" in dspk.unsupported(good_worker(_draft_sampler=None))


def facts(**over):
    base = dict(speculative_algorithm="DSPARK", topk=1, page_size=16, attention_backends=("triton", "triton"),
                draft_attention_backend=None)
    return ServingFacts(**{**base, **over})


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"attention_backends": ("fa3", "fa3")}, None),
    ({"attention_backends": (None, None)}, None),  # not resolved yet: the scheduler checks the live backends
    ({"speculative_algorithm": "DFLASH"}, "inert because --speculative-algorithm is DFLASH"),
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
    ({"env": {"SGLANG_RAGGED_VERIFY_MODE": "compact"}}, "SGLANG_RAGGED_VERIFY_MODE=compact"),
    ({"env": {"SGLANG_RAGGED_VERIFY_MODE": "static"}}, None),
    ({"env": {"SGLANG_DSPARK_FOLDED_PROPOSAL": "0"}}, "SGLANG_DSPARK_FOLDED_PROPOSAL=0"),
    ({"env": {"SGLANG_OPT_DSV41_TARGET_METADATA_EARLY": "1"}}, "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY"),
    ({"env": {"SGLANG_DSPARK_DEBUG_DUMP": "core"}}, "SGLANG_DSPARK_DEBUG_DUMP"),
    ({"env": {"SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}}, "SGLANG_DSPARK_ENABLE_SPS_RECORD"),
    ({"env": {"SGLANG_DSPARK_STS_COLLECT_PATH": "/tmp/sts"}}, "SGLANG_DSPARK_STS_COLLECT_PATH"),
    ({"env": {"SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH": "/tmp/b"}}, "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH"),
    ({"env": {"SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL": "100"}}, "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL"),
    ({"env": {"SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL": "0"}}, None),
    ({"env": {"SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS": "1"}}, "SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS"),
    # The draw runs outside the graph: any simulated length and method.
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3"}}, None),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "2.5"}}, None),
    ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_METHOD": "multinomial"}}, None),
])
def test_inert_rules(over, reason):
    got = dspk.inert(facts(**over))
    assert (got is None) if reason is None else (reason in got), got


def test_the_startup_env_rules_are_the_settings_sglang_reads():
    """Each env setting ``inert`` reads is SGLang's, read where the worker rule's object is built."""
    from sglang.srt.environ import envs
    from sglang.srt.speculative import ragged_verify
    from sglang.srt.speculative.dspark_components import dspark_block_accept_estimator, dspark_observability

    observers = src(dspark_observability) + src(dspark_block_accept_estimator)
    for name in dspk.OBSERVER_ENVS:
        assert f"envs.{name}.get()" in observers, name
    assert "envs.SGLANG_RAGGED_VERIFY_MODE.get()" in src(ragged_verify.read_ragged_verify_mode)
    assert "envs.SGLANG_DSPARK_FOLDED_PROPOSAL.get()" in src(DSparkWorkerV2.init_cuda_graphs)
    assert "envs.SGLANG_OPT_DSV41_TARGET_METADATA_EARLY.get()" in src(DSparkWorkerV2.__init__)
    assert envs.SGLANG_RAGGED_VERIFY_MODE.default == "static" and envs.SGLANG_DSPARK_FOLDED_PROPOSAL.default is True


@pytest.mark.parametrize("argv, reason", [
    ((), None),
    (("--attention-backend", "fa3"), None),
    (("--attention-backend", "flashinfer"), "flashinfer"),
    (("--speculative-draft-attention-backend", "fa3"), "fa3, triton"),
    (("--disable-overlap-schedule",), "--disable-overlap-schedule"),
    (("--enable-return-routed-experts",), "--enable-return-routed-experts"),
    (("--expert-distribution-recorder-mode", "stat"), "expert distribution recording"),
])
def test_the_startup_rules_read_sglangs_argument_preparation(argv, reason):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy", "--speculative-algorithm", "DSPARK",
                                "--speculative-draft-model-path", "dummy", "--attention-backend", "triton", *argv])
    got = dspk.inert(ServingFacts.from_server_args(args, {}))
    assert (got is None) if reason is None else (reason in got), got


def test_settings_are_eagle_step_graphs(monkeypatch):
    r = dspk.Route()
    monkeypatch.setattr(dspk, "_route", r)
    monkeypatch.setenv(es.ENV_MAX, "6")
    monkeypatch.setenv(es.ENV_CHECK, "3")
    assert dspk.prepare(None) == "at most 6 step graphs; eager check every 3 replayed steps"
    assert (r.max_graphs, r.check) == (6, 3)
    monkeypatch.setenv(es.ENV_CHECK, "-1")
    assert "bad configuration" in dspk.SLOT.precheck.config()


# --- targets, pins, the catalogue and the plan ---


def test_targets_are_sglangs_as_pinned():
    from sglang_hostsync_plugin.checks import check_target, source_sha

    for target in dspk.SLOT.targets:
        assert check_target(target) is None, target.path
    # The design study's table (docs/dflash-step-graph.md section 3); the backend's are eagle_step_graph's.
    assert [t.source_sha for t in dspk.SLOT.targets] == ["ec8afef40bb075bb", "b11da397ea881b30", "cf7508aca9e2b4ae"]
    assert source_sha(DSparkWorkerV2._forward_decode) == "ec8afef40bb075bb"
    assert [t.path for t in dspk.SLOT.targets[1:]] == [t.path for t in es.SLOT.targets[1:]]
    assert dspk.SLOT.targets[0].params == tuple(inspect.signature(DSparkWorkerV2._forward_decode).parameters)


def test_the_pinned_sources_are_sglangs(monkeypatch):
    from sglang_hostsync_plugin.checks import pinned_sources

    assert dspk.upstream_pins() is None and dspk.SLOT.precheck() is None
    assert pinned_sources([tuple(p.rsplit(".", 1)) + (sha,) for p, sha in dspk.PINS
                           if "flashattention_backend" not in p], "test") is None
    monkeypatch.setattr(dspk, "PINS", ((dspk.PINS[0][0], "0" * 16),))
    assert "upstream shape changed" in dspk.upstream_pins()


@pytest.mark.parametrize("mod, algo", [(dsg, "DFLASH"), (dspk, "DSPARK")], ids=["dflash", "dspark"])
def test_registered_not_default_and_auto_picks_it_for_its_own_algorithm(mod, algo):
    """Both block step graphs: in the catalogue since their GPU tests and the must-show e2e ran
    (2026-12-07-h100-b); in no preset; ``auto``'s pick on their measured class (triton, page > 1) since
    the rerun on the final code (2026-12-07-h100-c), and only there."""
    from sglang_hostsync_plugin import choice, registry, slots
    from sglang_hostsync_plugin.slot import ServingFacts

    cat = registry.catalogue()
    assert cat[mod.NAME] is mod.SLOT and mod.NAME in {name for _, name, _ in slots.OWNED_LATE}
    assert not mod.SLOT.default and not mod.SLOT.presets

    def pick(algorithm, backend="triton", page=16):
        return choice.pick(ServingFacts(speculative_algorithm=algorithm, page_size=page,
                                        attention_backends=(backend, backend))).spec

    assert pick(algo) == f"default,{mod.NAME}"
    assert mod.NAME not in pick(algo, page=1) and mod.NAME not in pick(algo, "fa3")
    assert mod.NAME not in pick({"DFLASH": "DSPARK", "DSPARK": "DFLASH"}[algo])


def test_unsafe_pairs_are_dspark_mega_switches_and_catalogue_slots():
    from sglang_hostsync_plugin.registry import catalogue
    from sglang_hostsync_plugin.slots import upstream_switches

    unsafe = {other for other, _ in dspk.SLOT.unsafe_with}
    assert unsafe <= set(catalogue())
    mega = {s.name for s in upstream_switches.SLOTS if upstream_switches.PRESET in s.presets}
    assert unsafe - {"metadata_glue_graph"} <= mega
    assert unsafe - {"metadata_glue_graph"} == {"target_verify_metadata_glue", "target_metadata_early", "post_fold",
                                                "post_forward_graph", "fused_accept_tail", "defer_context_kv",
                                                "one_launch_commit_stage"}
    assert all(why for _, why in dspk.SLOT.unsafe_with)


def test_the_unsafe_switches_feed_the_epilogue_or_a_glue_graph_in_sglang():
    """Where SGLang reads each listed switch: the verify epilogue's construction, the deferred commit, or
    the target runner's glue graph and early metadata."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.dspark_components.dspark_deferred_commit import DeferredContextCommit

    init = src(DSparkWorkerV2.__init__)
    for flag in ("SGLANG_DSPARK_FUSED_ACCEPT_TAIL", "SGLANG_OPT_DSV41_DSPARK_POST_FOLD",
                 "SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH", "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY"):
        assert f"envs.{flag}.get()" in init, flag
    assert "envs.SGLANG_DSPARK_DEFER_CONTEXT_KV.get()" in src(DSparkWorkerV2._defer_context_kv_eligible)
    assert "envs.SGLANG_OPT_DSV41_DSPARK_ONE_LAUNCH_COMMIT_STAGE.get()" in src(DeferredContextCommit)
    assert "envs.SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE.get()" in src(
        DecodeCudaGraphRunner._glues_target_verify_metadata)


@pytest.fixture
def with_slots():
    """The catalogue, which holds both block step graphs."""
    from sglang_hostsync_plugin import registry

    return registry.catalogue()


def plan_for(algorithm, spec="default,audit,audit_block,eagle_step_graph,dflash_step_graph,dspark_step_graph",
             **over):
    from sglang_hostsync_plugin import plan as plans

    f = None if algorithm is None else facts(speculative_algorithm=algorithm, **over)
    return plans.resolve({"SGLANG_HOSTSYNC_SLOTS": spec}, facts=f)


STEP_GRAPHS = ("eagle_step_graph", dsg.NAME, dspk.NAME)


@pytest.mark.parametrize("algorithm, applies", [("DSPARK", dspk.NAME), ("DFLASH", dsg.NAME),
                                                ("EAGLE3", "eagle_step_graph")])
def test_of_the_three_step_graphs_only_the_servers_applies(with_slots, algorithm, applies):
    """The three slots hook the same backend functions; the plan refuses two selected slots on one
    function only among those not inert, so each server applies its algorithm's step graph alone,
    beside the default slots and the audit's observers."""
    from sglang_hostsync_plugin import installer

    plan = plan_for(algorithm)
    for name in STEP_GRAPHS:
        want = Status.WOULD_APPLY if name == applies else Status.SKIPPED
        assert plan.verdict(name).status is want, (name, plan.verdict(name))
    assert not [v for v in plan.verdicts if v.status is Status.FAILED]
    if algorithm == "DSPARK":
        order = []
        installer.install(installer.InstallState(), plan, with_slots, lambda path, hook, kind: order.append(path))
        assert len(order) == len(set(order)) and {t.path for t in dspk.SLOT.targets} <= set(order)


def test_beside_a_dspark_mega_switch_that_folds_the_epilogue_the_slot_is_refused(with_slots):
    plan = plan_for("DSPARK", spec="default,post_fold,dspark_step_graph")
    v = plan.verdict(dspk.NAME)
    assert v.status is Status.FAILED and "post_fold" in v.reason and "deselect one" in v.reason, v
    ok = plan_for("DSPARK", spec="default,mid_fold,prepare_inputs_once,dspark_step_graph")
    assert ok.verdict(dspk.NAME).status is Status.WOULD_APPLY, ok.verdict(dspk.NAME)


def test_without_server_facts_the_step_graphs_are_refused(with_slots):
    """Where the plan is made before the server args are known, none of the three is inert yet, so
    all claim the backend functions and are refused. Select one."""
    plan = plan_for(None)
    for name in STEP_GRAPHS:
        v = plan.verdict(name)
        assert v.status is Status.FAILED and "both hook" in v.reason, v
    one = plan_for(None, spec="default,dspark_step_graph")
    assert one.verdict(dspk.NAME).status is Status.WOULD_APPLY
