"""Stock vs plugin drivers for target_dp_meta on the real ForwardBatch methods.

``fill(arm, ...)`` runs ``ForwardBatch._init_num_token_non_padded`` and
``ForwardBatch.init_mlp_sync_metadata`` the way ``ForwardBatch.init_new`` does,
on a ForwardBatch and a ScheduleBatch built without ``__init__``, and returns the
fields those methods set."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from hostsync_drivers import dp_meta
from sglang_hostsync_plugin.slots import target_dp_meta as tdm

FIELDS = (
    "dp_spec_prefill_coordination_applied", "original_global_num_tokens_cpu", "global_num_tokens_cpu",
    "global_num_tokens_for_logprob_cpu", "global_num_tokens_gpu", "global_num_tokens_for_logprob_gpu",
    "can_run_decode_cuda_graph", "can_run_dp_draft_cuda_graph", "global_num_token_non_padded",
    "global_num_token_non_padded_cpu",
)
STOCK_MLP = ForwardBatch.init_mlp_sync_metadata
STOCK_NNP = ForwardBatch._init_num_token_non_padded


def make_schedule_batch(gnt, gnt_logprob, *, coordination=False, draft=None, draft_logprob=None):
    """dp_meta's ScheduleBatch plus the fields the target side also reads."""
    b = dp_meta.make_batch(gnt, gnt_logprob, coordination=coordination)
    b.draft_global_num_tokens = draft
    b.draft_global_num_tokens_for_logprob = draft_logprob
    b.can_run_dp_draft_cuda_graph = False
    return b


def make_forward_batch(num_tokens, device, *, spec=None, mode=ForwardMode.DECODE, batch_size=None):
    fb = object.__new__(ForwardBatch)  # the real class, without the dataclass __init__
    fb.input_ids = None if num_tokens is None else torch.zeros((num_tokens,), dtype=torch.int64, device=device)
    fb.spec_info = spec
    fb.forward_mode = mode
    fb.batch_size = batch_size if batch_size is not None else (num_tokens or 0)
    for name in FIELDS:
        setattr(fb, name, None)
    return fb


def spec_info(per_req=4, logprob_per_req=1):
    return SimpleNamespace(num_tokens_per_req=per_req, num_tokens_for_logprob_per_req=logprob_per_req)


def fill(arm, fb, batch, device, *, is_draft_worker=False):
    if arm == "plugin":
        tdm.init_num_token_non_padded_hook(STOCK_NNP, fb, device=device, is_draft_worker=is_draft_worker)
        tdm.init_mlp_sync_metadata_hook(STOCK_MLP, fb, batch, device, is_draft_worker=is_draft_worker)
    else:
        STOCK_NNP(fb, device=device, is_draft_worker=is_draft_worker)
        STOCK_MLP(fb, batch, device, is_draft_worker=is_draft_worker)
    return fb


def snapshot(fb, fields=FIELDS) -> dict:
    """The fields as comparable values: tensors as (dtype, shape, device type, values)."""
    out = {}
    for name in fields:
        v = getattr(fb, name)
        if isinstance(v, torch.Tensor):
            v = (str(v.dtype), tuple(v.shape), v.device.type, v.cpu().tolist())
        out[name] = v
    return out


# prepare_mlp_sync_batch (the eager forward's DP padding) on a real ForwardBatch. The
# parallel state it reads is stood in for, in its module's globals (both arms see it).
PREPARE_FIELDS = ("global_num_tokens_cpu", "global_num_tokens_gpu", "global_num_tokens_padded_cpu",
                  "global_dp_buffer_len", "batch_size", "input_ids", "positions", "seq_lens", "out_cache_loc",
                  "req_pool_indices", "forward_mode", "dp_padding_mode")
STOCK_PREPARE = ForwardBatch.prepare_mlp_sync_batch


def stand_in_parallel_state(patcher, device, padding: str = "max_len", dp_rank: int = 0, attn_tp_size: int = 1) -> None:
    from sglang.srt.layers.dp_attention import DpPaddingMode
    from sglang.srt.model_executor import forward_batch_info as fbi

    mode = DpPaddingMode.MAX_LEN if padding == "max_len" else DpPaddingMode.SUM_LEN
    patcher.setattr(fbi, "DpPaddingMode", SimpleNamespace(
        get_dp_padding_mode=lambda is_extend, counts: mode, MAX_LEN=DpPaddingMode.MAX_LEN,
        SUM_LEN=DpPaddingMode.SUM_LEN))

    parallel = SimpleNamespace(attn_tp_size=attn_tp_size, tp_group=None)
    graph = SimpleNamespace(cuda_graph_config=SimpleNamespace(prefill=SimpleNamespace(bs=None)))
    patcher.setattr(fbi, "get_parallel", lambda: parallel)
    patcher.setattr(fbi, "get_exec", lambda: SimpleNamespace(graph=graph))
    patcher.setattr(fbi, "dp_slot_in", lambda counts: dp_rank)
    patcher.setattr(fbi, "set_dp_buffer_len_from_batch", lambda batch: None)
    patcher.setattr(fbi, "set_is_extend_in_batch", lambda flag: None)
    patcher.setattr(fbi, "mambaish_config", lambda config: None)
    patcher.setattr(fbi, "_is_cpu", torch.device(device).type == "cpu")  # SGLang's CPU build: no pinned memory


def make_model_runner():
    backend = SimpleNamespace(get_cpu_graph_seq_len_fill_value=lambda: 1,
                              get_cuda_graph_seq_len_fill_value=lambda: 1,
                              late_layer_num_tokens=lambda batch: None)
    return SimpleNamespace(attn_tp_sequence_sharded=lambda n: False, is_draft_worker=False, attn_backend=backend,
                           model_config=SimpleNamespace(hf_config=SimpleNamespace()))


def make_decode_batch(bs: int, device, counts: list[int]):
    """A decode ForwardBatch after ``init_new`` + ``init_mlp_sync_metadata``: ``bs``
    requests here, ``counts`` tokens on each DP rank."""
    ids = torch.arange(bs, dtype=torch.int64, device=device)
    fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=ids.clone(),
                      req_pool_indices=ids.clone(), seq_lens=ids + 5, out_cache_loc=ids.clone(),
                      seq_lens_sum=int(bs * 5 + bs * (bs - 1) // 2), positions=ids.clone())
    fb.is_extend_in_batch = False
    fb.global_num_tokens_cpu = list(counts)
    fb.global_num_tokens_for_logprob_cpu = list(counts)
    fb.global_num_tokens_gpu = torch.tensor(counts, dtype=torch.int64, device=device)
    return fb


def prepare(arm, fb, model_runner):
    if arm == "plugin":
        tdm.PREPARE.hook(STOCK_PREPARE, fb, model_runner)
    else:
        STOCK_PREPARE(fb, model_runner)
    return fb


def prepare_snapshot(fb) -> dict:
    return snapshot(fb, PREPARE_FIELDS)
