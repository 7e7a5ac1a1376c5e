"""Stock vs plugin drivers for draft_input_reuse on the real DFlashDraftInputV2.

A step is what the scheduler does with DFlash under spec-v2: the previous step's
result builds a new draft input (``make_draft_input_v2``), then
``prepare_for_decode(batch)`` plans the next step. ``alloc_for_spec_decode`` (the
consumer of the prepared lengths) is replaced by a recorder that copies what it is
given on the stream it runs on."""

import random
from types import SimpleNamespace

import torch

from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import dflash_info_v2, draft_worker_common
from sglang_hostsync_plugin import installer
from hostsync_drivers import Patcher  # noqa: F401 (re-exported)
from sglang_hostsync_plugin.slots import draft_input_reuse as dir_slot

BLOCK = 4




def fresh_ring(patcher):
    """A new process-wide ring for one test."""
    ring = dir_slot.PrepareBufferRing()
    patcher.setattr(dir_slot, "_ring", ring)
    return ring


def plugin_class(active=True):
    state = installer.InstallState(active={dir_slot.NAME} if active else set())
    return installer.compose_class(state, dflash_info_v2.DFlashDraftInputV2,
                                   [(dir_slot.NAME, dir_slot.DraftInputReuse)])


class Recorder:
    """Stands in for alloc_for_spec_decode: snapshots the device lengths it is given."""

    def __init__(self, device, slots=0):
        self.device = device
        self.calls = []
        self.device_rows = torch.zeros((slots, 2, 64), dtype=torch.int32, device=device) if slots else None

    def __call__(self, tree_cache, req_to_token_pool, *, reqs, req_pool_indices, cur_kv_lens, cur_kv_lens_cpu,
                 nxt_kv_lens, nxt_kv_lens_cpu, num_needed_tokens, batch):
        bs = cur_kv_lens.shape[0]
        if self.device_rows is not None:  # the GPU stress: a device-side copy, read later
            row = self.device_rows[len(self.calls)]
            row[0, :bs].copy_(cur_kv_lens)
            row[1, :bs].copy_(nxt_kv_lens)
            self.calls.append(bs)
        else:
            self.calls.append((cur_kv_lens.cpu().tolist(), nxt_kv_lens.cpu().tolist(),
                               cur_kv_lens_cpu.tolist(), nxt_kv_lens_cpu.tolist(), num_needed_tokens))


def make_req(rng, page_size):
    committed = rng.randint(1, 300)
    allocated = committed + rng.randint(0, 3 * page_size)
    return SimpleNamespace(kv=SimpleNamespace(kv_committed_len=committed, kv_allocated_len=allocated),
                           sampling_params=SimpleNamespace(top_k=rng.choice([1, 1, 5, 20])),
                           decode_batch_idx=0)


def make_batch(reqs, device, page_size):
    return SimpleNamespace(
        reqs=reqs, device=device, batch_size=lambda: len(reqs), maybe_evict_swa=lambda: None,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=page_size),
        tree_cache=None, req_to_token_pool=None,
        req_pool_indices=torch.arange(len(reqs), device=device), seq_lens_cpu=None, seq_lens_sum=None,
    )


def new_input(cls, bs, device, patcher):
    """What DFlashWorkerV2 returns as the next draft input (make_draft_input_v2), with
    the module global rebound to ``cls`` as HookRegistry's class REPLACE does."""
    patcher.setattr(draft_worker_common, "DFlashDraftInputV2", cls)
    info = draft_worker_common.make_draft_input_v2(
        bonus_tokens=torch.zeros(bs, dtype=torch.int64, device=device),
        new_seq_lens=torch.zeros(bs, dtype=torch.int64, device=device),
    )
    assert type(info) is cls
    return info


def snapshot(info, batch):
    return (info.max_top_k, info.uniform_top_k_value, info.nxt_kv_lens_cpu.tolist(), info.nxt_kv_lens_sum,
            batch.seq_lens_cpu.tolist(), batch.seq_lens_sum)


def run_steps(cls, steps, device, patcher, seed=0, page_size=4, keep_views=False, max_bs=200):
    """Random batches with composition changes (filter_batch) across ``steps`` steps."""
    rng = random.Random(seed)
    recorder = Recorder(device)
    patcher.setattr(dflash_info_v2, "alloc_for_spec_decode", recorder)
    reqs = [make_req(rng, page_size) for _ in range(rng.randint(1, 8))]
    out = []
    with get_context().override_server_args(speculative_num_draft_tokens=BLOCK):
        for step in range(steps):
            if step and rng.random() < 0.3 and len(reqs) > 1:  # a request finished
                keep = sorted(rng.sample(range(len(reqs)), rng.randint(1, len(reqs) - 1)))
                reqs = [reqs[i] for i in keep]
            elif rng.random() < 0.3 and len(reqs) < max_bs:  # requests joined
                reqs = reqs + [make_req(rng, page_size) for _ in range(rng.randint(1, min(40, max_bs - len(reqs))))]
            for r in reqs:  # last step's commit
                r.kv.kv_committed_len += rng.randint(0, BLOCK)
                r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, r.kv.kv_committed_len)
            batch = make_batch(reqs, device, page_size)
            info = new_input(cls, len(reqs), device, patcher)
            info.prepare_for_decode(batch)
            out.append(snapshot(info, batch) + (recorder.calls[-1],))
            if keep_views and len(reqs) > 1:  # the scheduler's filter_batch on the prepared input
                info.filter_batch(new_indices=torch.arange(len(reqs) - 1, device=device),
                                  new_indices_cpu=list(range(len(reqs) - 1)))
                out.append((info.nxt_kv_lens_cpu.tolist(), info.nxt_kv_lens_sum))
    return out
