"""Stock vs plugin drivers for target_dp_meta on the real ForwardBatch methods.

``fill(arm, ...)`` runs ``ForwardBatch._init_num_token_non_padded`` and
``ForwardBatch.init_mlp_sync_metadata`` the way ``ForwardBatch.init_new`` does,
on a ForwardBatch and a ScheduleBatch built without ``__init__``, and returns the
fields those methods set."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_hostsync_plugin.drivers import dp_meta
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


def snapshot(fb) -> dict:
    """The fields as comparable values: tensors as (dtype, shape, device type, values)."""
    out = {}
    for name in FIELDS:
        v = getattr(fb, name)
        if isinstance(v, torch.Tensor):
            v = (str(v.dtype), tuple(v.shape), v.device.type, v.cpu().tolist())
        out[name] = v
    return out
