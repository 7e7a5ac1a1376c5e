"""draft_extend_fused_layout on a CUDA device: SGLang's real prepare_for_draft_extend, stock (host
lists, pinned H2D) and recompiled (SGLang's fused launch), give the same forward batch on random
batches, with init_new's extend-length branch run from SGLang's text (the stand-in of
tests/test_draft_extend_fused_layout.py), and the slot's path does not sync.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang_hostsync_plugin.slots import draft_extend_fused_layout as dfl
from test_draft_extend_fused_layout import FIELDS, StandInForwardBatch, _case, _run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def ewc(monkeypatch):
    from sglang.srt.speculative import eagle_worker_common as ewc

    monkeypatch.setattr(ewc, "ForwardBatch", StandInForwardBatch)
    monkeypatch.setattr(dfl.PREPARE_ONCE, "_edited", None)
    return ewc


def test_identical_to_stock_on_random_batches(ewc):
    original = getattr(ewc.prepare_for_draft_extend, "__wrapped__", ewc.prepare_for_draft_extend)
    n = 0
    for seed in range(24):
        rng = random.Random(seed)
        bs, width, dtype = rng.choice([1, 2, 3, 8, 17, 64]), rng.choice([2, 4, 8]), rng.choice([torch.int32, torch.int64])
        stock = _run(original, _case(random.Random(seed), bs, width, dtype, "cuda"), width)
        plugin = _run(lambda *a, **k: dfl.PREPARE_ONCE.hook(original, *a, **k),
                      _case(random.Random(seed), bs, width, dtype, "cuda"), width)
        for name in FIELDS:
            a, b = getattr(stock, name), getattr(plugin, name)
            assert a.device == b.device and a.dtype == b.dtype and torch.equal(a, b), (seed, name)
        assert plugin.extend_prefix_lens_cpu == stock.extend_prefix_lens_cpu
        assert plugin.extend_seq_lens_cpu == stock.extend_seq_lens_cpu and plugin.seq_lens_sum == stock.seq_lens_sum
        n += 1
    print(f"draft_extend_fused_layout: {n} random batches identical to stock")


def test_no_host_sync_on_the_slots_path(ewc):
    original = getattr(ewc.prepare_for_draft_extend, "__wrapped__", ewc.prepare_for_draft_extend)
    # the batches are built outside the check: making them copies host lists to the device
    cases = [_case(random.Random(3), 8, 4, torch.int64, "cuda") for _ in range(2)]
    call = lambda case: _run(lambda *a, **k: dfl.PREPARE_ONCE.hook(original, *a, **k), case, 4)  # noqa: E731
    call(cases[0])  # compile outside the check
    torch.cuda.synchronize()
    staged = StandInForwardBatch.host_list_tensors
    torch.cuda.set_sync_debug_mode("error")
    try:
        call(cases[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert StandInForwardBatch.host_list_tensors == staged  # the fused path ran (stock's pinned H2D does not sync either)
