"""chain_tree_full_mask on a CUDA device: bit-identical to SGLang's real
``build_tree_kernel_efficient`` (its CUDA tree kernel) on random topk 1 batches (mask buffer uint8
and bool, with and without the fill, a mask SGLang allocates, int32 / int64 tokens (int64 lengths: SGLang's CUDA kernel takes no other),
one to seven draft steps, bs 1-48); through ``triton_replay_launch`` the second call of a signature
replays without Triton's JIT, same results; no host sync on the slot's path.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers.chain_tree import cases, make_case, run_both, same
from sglang_hostsync_plugin.slots import chain_tree_full_mask as ct
from sglang_hostsync_plugin.slots import triton_replay_launch as trl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def test_bit_identical_to_sglangs_cuda_tree_on_random_chains():
    trl.switch_off()
    for i, (rng, kw) in enumerate(cases(17, 60, max_bs=48)):
        inputs = make_case(rng, device=DEV, **kw)
        stock, plugin = run_both(inputs)
        torch.cuda.synchronize()
        assert same(stock, plugin, inputs), (i, kw)


def test_replayed_second_call_is_identical_and_skips_the_jit(jit_calls):
    """A preallocated mask buffer (the triton backend's): the second call of a signature replays. A mask
    SGLang's function would allocate is sized by the step's lengths (a new signature each step), so
    that case launches through the JIT every time."""
    rng = random.Random(3)
    trl.switch_on()
    try:
        for kw in (dict(bs=1, steps=3), dict(bs=5, steps=3, buffer="bool"), dict(bs=2, steps=7), dict(bs=2, steps=7, buffer=None)):
            first, second = make_case(rng, device=DEV, **kw), make_case(rng, device=DEV, **kw)
            run_both(first)  # records this signature
            before = len(jit_calls)
            stock, plugin = run_both(second)
            torch.cuda.synchronize()
            assert (ct._chain_tree_kernel in jit_calls[before:]) == (kw.get("buffer", "uint8") is None), kw
            assert same(stock, plugin, second), kw
    finally:
        trl.switch_off()


def test_slot_path_has_no_host_sync():
    inputs = make_case(random.Random(4), 4, 3, device=DEV)
    run_both(inputs)  # compile outside the check
    torch.cuda.synchronize()

    def fell_back(*a, **k):
        raise AssertionError("fell back to SGLang's function")

    torch.cuda.set_sync_debug_mode("error")
    try:
        ct.build_tree_hook(fell_back, **inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
