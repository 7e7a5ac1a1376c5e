"""Slot ``ngram_accept_readback`` on CUDA with SGLang's real ``FutureMap`` (its private
D2H stream and pinned seq-lens mirror): the forward stream publishes step N-1's seq
lens, then sleeps, then stashes its accept tokens/lens. The slot's host tensors must
still be the stashed values, i.e. its copies waited for the stash and not only for the
publish SGLang's synchronize is gated on. A control copy gated on the publish alone reads
stale rows under the same delay, so the test can fail."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_hostsync_plugin.slots import ngram_accept_readback as slot  # noqa: E402

POOL, NDT = 64, 8
SLEEP = 20_000_000  # cycles, ~10 ms: the stash lands long after the publish


def _batch(rows):
    idx = torch.tensor(rows, dtype=torch.int64)
    return SimpleNamespace(spec_info=SimpleNamespace(future_indices=idx.cuda(), accept_tokens=None, accept_lens=None),
                           req_pool_indices_cpu=idx, seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def test_host_accept_tokens_wait_for_the_delayed_stash():
    rng = random.Random(3)
    pool = SimpleNamespace(req_to_token=torch.zeros(POOL, 16, dtype=torch.int32, device="cuda"))
    fm = FutureMap(torch.device("cuda"), SpeculativeAlgorithm.NGRAM, pool, needs_cpu_seq_lens=True)
    fwd = torch.cuda.Stream()
    control_mirror = torch.zeros(POOL, NDT, dtype=torch.int32, pin_memory=True)
    stale_controls = checked = 0
    for step in range(12):
        rows = rng.sample(range(1, POOL), rng.randint(1, 8))
        idx = torch.tensor(rows, device="cuda")
        tokens = torch.randint(1, 32000, (len(rows), NDT), dtype=torch.int32, device="cuda")
        lens = torch.randint(1, NDT + 1, (len(rows),), dtype=torch.int32, device="cuda")
        with torch.cuda.stream(fwd):  # step N-1's forward: publish, more work, then the relay stash
            fm.publish(idx, torch.full((len(rows),), 100 + step, device="cuda"))
            torch.cuda._sleep(SLEEP)
            slot.stash_hook(FutureMap.stash, fm, idx, RelayPayload(bonus_tokens=None, accept_tokens=tokens,
                                                                  accept_lens=lens))
        if step == 0:
            torch.cuda.synchronize()
            continue
        batch = _batch(rng.sample(rows, len(rows)))  # step N: the same requests, another order
        if step % 2:  # control: gated on the publish alone, as SGLang's own seq-lens copy is
            d2h = torch.cuda.Stream()
            d2h.wait_event(fm.publish_ready)
            with torch.cuda.stream(d2h):
                control_mirror.copy_(fm.accept_tokens_buf, non_blocking=True)
            d2h.synchronize()
            seen = control_mirror[batch.req_pool_indices_cpu]
            torch.cuda.synchronize()
            stale_controls += not torch.equal(seen, fm.accept_tokens_buf[batch.spec_info.future_indices].cpu())
            continue
        slot.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
        slot.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
        got_tokens, got_lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
        assert got_tokens.device.type == "cpu" and got_lens.device.type == "cpu"
        torch.cuda.synchronize()
        order = batch.spec_info.future_indices
        assert torch.equal(got_tokens, fm.accept_tokens_buf[order].flatten().cpu())  # stock's value
        assert torch.equal(got_lens, fm.accept_lens_buf[order].cpu())
        assert torch.equal(batch.seq_lens_cpu, torch.full((len(rows),), 100 + step))
        checked += 1
    print(f"\nngram_accept_readback: {checked} delayed steps exact; control gated on publish only: "
          f"{stale_controls}/{12 // 2} stale")
    assert checked == 5 and slot._states[fm].staged == 5
    assert stale_controls > 0, "the delay must make a publish-gated copy stale, or the test shows nothing"
