"""fused_relay_stash on a CUDA device: every relay buffer of a real SGLang ``FutureMap`` on the
GPU bit-identical after the slot's stash and SGLang's ``FutureMap.stash``, over random server-like
steps (STANDALONE and EAGLE shapes), and no host sync on the fused path.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers.relay_stash import fell_back, indices_for, make_maps, make_payload, run_both, same
from sglang_hostsync_plugin.slots import fused_relay_stash as frs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def test_bit_identical_to_stock_on_random_steps(monkeypatch):
    rng = random.Random(31)
    steps = 0
    for trial in range(12):
        hidden = rng.choice([None, 4096, 5120])  # STANDALONE, EAGLE (8B / 14B hidden)
        topk = rng.choice([1, 4, 8])
        pool = rng.randint(8, 600)
        stock, plugin = make_maps(rng, pool, make_payload(rng, 1, topk, hidden, device=DEV),
                                  "EAGLE" if hidden else "STANDALONE", device=DEV, monkeypatch=monkeypatch)
        for _ in range(8):
            bs = rng.randint(1, min(pool, 64))
            payload = make_payload(rng, bs, topk, hidden, device=DEV, topk_p=rng.random() > 0.1)
            indices = indices_for(rng, pool, bs, device=DEV)
            run_both(stock, plugin, indices, payload)
            torch.cuda.synchronize()
            assert same(stock, plugin), (trial, bs, topk, hidden)
            steps += 1
    print(f"fused_relay_stash: {steps} stashes bit-identical to FutureMap.stash")


def test_fused_path_has_no_host_sync(monkeypatch):
    rng = random.Random(2)
    payload = make_payload(rng, 4, 4, 4096, device=DEV)
    stock, plugin = make_maps(rng, 64, payload, "EAGLE", device=DEV, monkeypatch=monkeypatch)
    indices = indices_for(rng, 64, 4, device=DEV)
    run_both(stock, plugin, indices, payload)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        frs.stash(plugin, indices, payload, fell_back)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
