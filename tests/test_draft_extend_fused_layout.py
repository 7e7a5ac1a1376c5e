"""draft_extend_fused_layout: SGLang's real ``prepare_for_draft_extend``, stock and recompiled, on
batches that carry host lengths (FlashInfer's case): the forward batch it returns has the same
device lengths, positions, start offsets, post-extend lengths and host mirrors, and the slot's
path makes no host-list tensors (no pinned staging). ``ForwardBatch.init_new`` is a stand-in
that runs init_new's own extend-length branch (checked below to be SGLang's text) on the
arguments it gets; the rest of init_new needs a model runner."""

import inspect
import random
import types

import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import draft_extend_fused_layout as dfl

# ForwardBatch.init_new's extend-length branch in SGLang 0.5.23 (forward_batch_info.py ~1230-1259),
# which the stand-in below runs; the test that follows checks it is still SGLang's text.
INIT_NEW_BRANCH = '''            if isinstance(extend_seq_lens, list):
                # Main path: H2D from host lists; populate *_cpu mirrors.
                assert isinstance(extend_prefix_lens, list)
                pin_memory = is_pin_memory_available(device)
                ret.extend_seq_lens = torch.tensor(
                    extend_seq_lens, dtype=torch.int32, pin_memory=pin_memory
                ).to(device, non_blocking=True)
                ret.extend_prefix_lens = torch.tensor(
                    extend_prefix_lens, dtype=torch.int32, pin_memory=pin_memory
                ).to(device, non_blocking=True)
                ret.extend_prefix_lens_cpu = list(extend_prefix_lens)
                ret.extend_seq_lens_cpu = list(extend_seq_lens)
            else:
                # gpu_only: device tensors handed in directly; leave *_cpu unset.
                assert isinstance(extend_seq_lens, torch.Tensor)
                ret.extend_seq_lens = extend_seq_lens
                ret.extend_prefix_lens = extend_prefix_lens
            ret.extend_num_tokens = batch.extend_num_tokens
            if extend_position_info is None:
                positions, ret.extend_start_loc = compute_position(
                    model_runner.prefill_attention_backend_str,
                    ret.extend_prefix_lens,
                    ret.extend_seq_lens,
                    ret.extend_num_tokens,
                )
            else:
                positions, ret.extend_start_loc, _ = extend_position_info
            if ret.positions is None:
                ret.positions = positions
'''


def test_the_stand_in_runs_sglangs_own_branch():
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    fn = ForwardBatch.init_new
    assert INIT_NEW_BRANCH in inspect.getsource(getattr(fn, "__wrapped__", fn))


class StandInForwardBatch:
    """``init_new``: the fields prepare_for_draft_extend's caller path reads, the extend-length
    branch executed from SGLang's text, and a count of host-list tensors made."""

    host_list_tensors = 0

    def __init__(self):
        self.positions = None
        self.extend_prefix_lens_cpu = self.extend_seq_lens_cpu = None
        self.metadata_ready = False

    def mark_forward_metadata_ready(self):
        self.metadata_ready = True

    @classmethod
    def init_new(cls, batch, model_runner, capture_hidden_mode=None, return_hidden_states_before_norm=False,
                 extend_position_info=None, kv_loc_plan=None):
        from sglang.srt.model_executor import forward_batch_info as fbi

        ret = cls()
        ret.forward_mode, ret.seq_lens, ret.seq_lens_cpu = batch.forward_mode, batch.seq_lens, batch.seq_lens_cpu
        ret.spec_info, ret.input_ids = batch.spec_info, batch.input_ids
        extend_seq_lens, extend_prefix_lens, device = batch.extend_lens, batch.prefix_lens, batch.seq_lens.device
        if isinstance(extend_seq_lens, list):
            cls.host_list_tensors += 2
        scope = {"ret": ret, "batch": batch, "model_runner": model_runner, "extend_seq_lens": extend_seq_lens,
                 "extend_prefix_lens": extend_prefix_lens, "device": device,
                 "extend_position_info": extend_position_info, "torch": torch,
                 "is_pin_memory_available": lambda d: d.type == "cuda", "compute_position": fbi.compute_position}
        exec(compile("if True:\n" + INIT_NEW_BRANCH, "init_new_branch", "exec"), scope)
        return ret


def _case(rng, bs, width, dtype, device="cpu"):
    lens = [rng.choice([1, 15, 16, 17, rng.randrange(1, 5000)]) for _ in range(bs)]
    seq_lens = torch.tensor(lens, dtype=dtype, device=device)
    mode = types.SimpleNamespace(is_idle=lambda: False)
    batch = types.SimpleNamespace(
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(), forward_mode=mode, multimodal_inputs=[None] * bs,
        model_config=types.SimpleNamespace(vocab_size=1000), spec_info=None, input_ids=None)
    runner = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model_is_mrope=False, requires_mm_token_modalities=False),
        spec_algorithm=types.SimpleNamespace(is_standalone=lambda: True), prefill_attention_backend_str="flashinfer",
        attn_backend=types.SimpleNamespace(init_forward_metadata=lambda fb: None))
    spec = types.SimpleNamespace(num_front_tokens=0, positions=None, hidden_states=None)
    predict = torch.arange(bs * width, dtype=torch.int64, device=device)
    return batch, runner, spec, predict


def _run(fn, case, width):
    batch, runner, spec, predict = case
    return fn(spec, batch, predict, width, runner, None, return_hidden_states_before_norm=False)


@pytest.fixture
def ewc(monkeypatch):
    from sglang.srt.speculative import eagle_worker_common as ewc

    monkeypatch.setattr(ewc, "ForwardBatch", StandInForwardBatch)
    monkeypatch.setattr(StandInForwardBatch, "host_list_tensors", 0)
    monkeypatch.setattr(dfl.PREPARE_ONCE, "_edited", None)
    return ewc


FIELDS = ("extend_seq_lens", "extend_prefix_lens", "positions", "extend_start_loc", "seq_lens", "seq_lens_cpu")


@pytest.mark.parametrize("bs,width", [(1, 4), (3, 8), (8, 4), (17, 2)])
def test_same_forward_batch_without_host_list_tensors(ewc, bs, width):
    assert dfl._INTERPRET  # so the fused branch's Triton kernel runs here
    original = getattr(ewc.prepare_for_draft_extend, "__wrapped__", ewc.prepare_for_draft_extend)
    seed = bs * 31 + width
    dtype = random.Random(seed).choice([torch.int32, torch.int64])
    stock = _run(original, _case(random.Random(seed), bs, width, dtype), width)
    assert StandInForwardBatch.host_list_tensors == 2  # stock stages both host lists
    plugin = _run(lambda *a, **k: dfl.PREPARE_ONCE.hook(original, *a, **k), _case(random.Random(seed), bs, width, dtype), width)
    assert StandInForwardBatch.host_list_tensors == 2  # the slot's path staged none
    for name in FIELDS:
        a, b = getattr(stock, name), getattr(plugin, name)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
    assert plugin.extend_prefix_lens_cpu == stock.extend_prefix_lens_cpu == stock.seq_lens_cpu.sub(width).tolist()
    assert plugin.extend_seq_lens_cpu == stock.extend_seq_lens_cpu == [width] * bs
    assert plugin.seq_lens_sum == stock.seq_lens_sum and plugin.metadata_ready and stock.metadata_ready


@pytest.mark.parametrize("change", ["idle", "mrope", "mm", "no_host_lens"])
def test_what_the_slot_does_not_take_runs_the_list_branch(ewc, change):
    original = getattr(ewc.prepare_for_draft_extend, "__wrapped__", ewc.prepare_for_draft_extend)
    batch, runner, spec, predict = case = _case(random.Random(1), 3, 4, torch.int64)
    if change == "idle":
        batch.forward_mode = types.SimpleNamespace(is_idle=lambda: True)
        assert not dfl.fused_with_mirrors(batch, runner)
        return  # (an idle batch takes init_new's idle branch, which the stand-in does not cover)
    if change == "mrope":
        runner.model_config.model_is_mrope = True
    elif change == "mm":
        runner.model_config.requires_mm_token_modalities = True
    else:
        batch.seq_lens_cpu = None
    assert not dfl.fused_with_mirrors(batch, runner)
    dfl.PREPARE_ONCE.hook(original, *(spec, batch, predict, 4, runner, None), return_hidden_states_before_norm=False)
    # the host lists were staged as stock does (without host lengths stock's own device path runs)
    assert StandInForwardBatch.host_list_tensors == (0 if change == "no_host_lens" else 2)


def test_not_taken_outside_cuda_and_the_interpreter(monkeypatch):
    batch, runner, _, _ = _case(random.Random(2), 2, 4, torch.int64)
    assert dfl.fused_with_mirrors(batch, runner)
    monkeypatch.setattr(dfl, "_INTERPRET", False)
    assert not dfl.fused_with_mirrors(batch, runner)  # CPU lengths: SGLang's list branch


def test_pin_edits_and_inert_rule():
    from sglang_hostsync_plugin.checks import source_sha
    from sglang.srt.speculative import eagle_worker_common as ewc

    fn = ewc.prepare_for_draft_extend
    assert source_sha(getattr(fn, "__wrapped__", fn)) == dfl.PREPARE_SHA
    assert dfl.PREPARE_ONCE.check() is None and dfl.SLOT.precheck() is None
    fi = ServingFacts(speculative_algorithm="EAGLE", topk=4, page_size=16, attention_backends=("flashinfer", "flashinfer"))
    assert dfl.inert(fi) is None
    assert "triton" in dfl.inert(ServingFacts(speculative_algorithm="EAGLE", topk=4, page_size=16,
                                              attention_backends=("triton", "triton")))
    assert "NGRAM" in dfl.inert(ServingFacts(speculative_algorithm="NGRAM", attention_backends=("flashinfer", "flashinfer")))
    assert not dfl.SLOT.default
