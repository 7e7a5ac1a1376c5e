"""Slot ``ngram_late_wait`` on CUDA with SGLang's real ``FutureMap`` (its private D2H stream and
pinned mirrors): step N-1's forward publishes, sleeps ~10 ms, then stashes its accept tokens.
The resolve must return while that forward still runs (no wait: the host is back long before the
sleep ends), and after the draft prep's wait the batch holds stock's values: the stashed tokens and
lengths and the published seq lens, in the tensors it got at the resolve."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_hostsync_plugin.slots import ngram_accept_readback as readback  # noqa: E402
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm  # noqa: E402
from sglang_hostsync_plugin.slots import ngram_late_wait as late  # noqa: E402

POOL, NDT = 64, 8
SLEEP = 20_000_000  # cycles, ~10 ms


def _batch(rows):
    idx = torch.tensor(rows, dtype=torch.int64)
    return SimpleNamespace(spec_info=SimpleNamespace(future_indices=idx.cuda(), accept_tokens=None, accept_lens=None),
                           req_pool_indices_cpu=idx, seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None,
                           forward_mode=SimpleNamespace(is_decode=lambda: True))


def test_resolve_returns_under_the_forward_and_the_draft_prep_reads_stocks_values(monkeypatch):
    monkeypatch.setattr(late, "_live", False)  # step 0 waits where SGLang does, as a server's first step
    monkeypatch.setattr(late, "_pending", None)
    monkeypatch.setattr(late, "deferred", 0)
    monkeypatch.setattr(nfm.PREPARE_ONCE, "live", lambda: True)  # the verify prep's edit runs (not driven here)
    rng = random.Random(4)
    pool = SimpleNamespace(req_to_token=torch.zeros(POOL, 16, dtype=torch.int32, device="cuda"))
    fm = FutureMap(torch.device("cuda"), SpeculativeAlgorithm.NGRAM, pool, needs_cpu_seq_lens=True)
    fwd = torch.cuda.Stream()
    resolve_ms, checked = [], 0
    for step in range(10):
        rows = rng.sample(range(1, POOL), rng.randint(1, 8))
        idx = torch.tensor(rows, device="cuda")
        tokens = torch.randint(1, 32000, (len(rows), NDT), dtype=torch.int32, device="cuda")
        lens = torch.randint(1, NDT + 1, (len(rows),), dtype=torch.int32, device="cuda")
        with torch.cuda.stream(fwd):
            torch.cuda._sleep(SLEEP)
            fm.publish(idx, torch.full((len(rows),), 100 + step, device="cuda"))
            torch.cuda._sleep(SLEEP // 4)
            readback.stash_hook(FutureMap.stash, fm, idx, RelayPayload(bonus_tokens=None, accept_tokens=tokens,
                                                                      accept_lens=lens))
        batch = _batch(rng.sample(rows, len(rows)))
        if step == 0:  # allocates the pinned mirrors (cudaHostAlloc waits for the device), arms the deferral
            readback.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
            readback.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
            late.draft_tokens_hook(lambda _s, b: None, None, batch)
            assert late._live and late.deferred == 0
            continue
        t0 = time.perf_counter()
        readback.resolve_seq_lens_cpu_hook(FutureMap.resolve_seq_lens_cpu, fm, batch)
        readback.resolve_spec_extras_hook(FutureMap._resolve_spec_extras, fm, batch)
        resolve_ms.append((time.perf_counter() - t0) * 1e3)
        still_running = not fwd.query()
        held = batch.seq_lens_cpu
        seen = {}
        late.draft_tokens_hook(lambda _s, b: seen.update(tokens=b.spec_info.accept_tokens.clone(),
                                                         lens=b.spec_info.accept_lens.clone(),
                                                         seq_lens_sum=b.seq_lens_sum), None, batch)
        torch.cuda.synchronize()
        order = batch.spec_info.future_indices
        assert batch.seq_lens_cpu is held and torch.equal(held, torch.full((len(rows),), 100 + step))
        assert seen["seq_lens_sum"] == (100 + step) * len(rows)
        assert torch.equal(seen["tokens"], fm.accept_tokens_buf[order].flatten().cpu())
        assert torch.equal(seen["lens"], fm.accept_lens_buf[order].cpu())
        assert still_running, "the resolve waited for step N-1's forward"
        checked += 1
    print(f"\nngram_late_wait: {checked} steps exact; resolve host ms median "
          f"{sorted(resolve_ms)[len(resolve_ms) // 2]:.3f} (the forward sleeps ~12 ms)")
    assert checked == 9 and late.deferred == 9
