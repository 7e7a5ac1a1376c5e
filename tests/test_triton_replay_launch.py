"""Slot ``triton_replay_launch`` on the CPU: the wrappers it covers, the switch between the plain
wrapper and SGLang's ``replay_launches``, its pins, environment warning and inert rules. The replay
itself needs compiled kernels (``tests/test_gpu_triton_replay_launch.py``); under
``TRITON_INTERPRET`` SGLang records no launch, so a switched wrapper must still return the plain
results."""

import random

import pytest
import torch
from hostsync_drivers import tree_compact

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft
from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl
from sglang_hostsync_plugin.slots import fused_relay_stash as frs
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra
from sglang_hostsync_plugin.slots import flashinfer_device_plan as fdp_slot
from sglang_hostsync_plugin.slots import triton_replay_launch as trl


@pytest.fixture
def off():
    yield
    trl.switch_off()


def test_every_plugin_triton_wrapper_is_declared():
    declared = {wrapper for wrapper, _ in trl._wrappers.fns}
    assert {gra.row_argmax, ftc.compact_plain, ftc.compact_hidden, fdl.page_locs_launch, eft.tail_slots_triton, frs.stash_rows} <= declared
    assert fdp_slot.launch_plan in declared  # flashinfer_device_plan's plan kernel
    assert gra._bind()["_hostsync_row_argmax"] is gra.row_argmax  # the edit binds the declared wrapper


def test_the_switch_picks_the_plain_wrapper_or_the_replay(monkeypatch, off):
    monkeypatch.setattr(trl, "_wrappers", trl.Wrappers())
    calls = []

    @trl.replayed
    def launch(x, k=1):
        calls.append("plain")
        return x + k

    trl._wrappers.replays[launch.__wrapped__] = lambda x, k=1: calls.append("replay") or x * k
    assert launch(3, k=2) == 5 and calls == ["plain"]
    trl._wrappers.on = True
    assert launch(3, k=2) == 6 and calls == ["plain", "replay"]
    trl.switch_off()
    assert launch(3) == 4 and calls[-1] == "plain"


def test_switch_on_routes_through_sglangs_replay_launches(monkeypatch, off):
    from sglang.kernels.ops.diffusion.common import fast_launch

    monkeypatch.setattr(trl, "_wrappers", trl.Wrappers())
    made = []
    real = fast_launch.replay_launches
    monkeypatch.setattr(fast_launch, "replay_launches", lambda fn: made.append(fn) or real(fn))

    @trl.replayed
    def double(x):
        return x * 2

    assert trl.switch_on() == 1 and made == [double.__wrapped__]
    assert trl.switch_on() == 1 and len(made) == 1  # built once per wrapper, not per call
    assert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))


def test_switched_wrappers_return_the_plain_results_under_the_interpreter(off):
    x = torch.randn(6, 5000)
    x[2, 7] = x[2, 4000] = x.max() + 1  # a tie: the first index
    want = torch.argmax(x, dim=-1)
    trl.switch_on()
    for _ in range(2):  # record, then the signature's second call
        assert torch.equal(gra.row_argmax(x), want)
        assert torch.equal(gra.row_argmax(x, keepdim=True), want.unsqueeze(-1))


@pytest.mark.parametrize("hidden_dim", [None, 16])
def test_compaction_wrappers_return_tensors_only(hidden_dim):
    """SGLang's replay keeps a wrapper whose result holds a None on its normal path for good (the
    STANDALONE compaction did until 12-03): each replayed wrapper returns tensors only, and
    ``compact`` adds the absent hidden states back."""
    from sglang.kernels.ops.diffusion.common import fast_launch

    t = torch.zeros(2)
    assert fast_launch._plan((t, None), [t], [object()]) is fast_launch._NORMAL  # why: SGLang's rule
    c = tree_compact.make_case(random.Random(7), bs=3, topk=4, steps=3, hidden_dim=hidden_dim)
    args = (c["accept_index"], c["accept_lens"], c["out_cache_loc"], c["predict"])
    if hidden_dim:
        inner = ftc.compact_hidden(*args, c["hidden"], c["bs"], c["nd"])
    else:
        inner = ftc.compact_plain(*args, c["bs"], c["nd"])
    assert isinstance(inner, tuple) and all(isinstance(x, torch.Tensor) for x in inner)
    whole = ftc.compact(*args, c["hidden"], c["bs"], c["nd"])
    assert len(whole) == 4 and (whole[3] is None) == (hidden_dim is None)
    assert all(torch.equal(a, b) for a, b in zip(inner, whole))


def test_pins_env_warning_and_inert_rules():
    from sglang_hostsync_plugin.checks import check_slot

    assert trl.pinned_sources() is None and check_slot(trl.SLOT) is None
    assert trl.env_warning({}) is None and trl.env_warning({trl.ENV_OFF: "1"}) is None
    assert "turns SGLang's replay_launches off" in trl.env_warning({trl.ENV_OFF: "0"})
    assert trl.SLOT.inert(ServingFacts("STANDALONE", topk=4)) is None
    assert trl.SLOT.inert(ServingFacts("NGRAM")) is None
    assert "DFLASH" in trl.SLOT.inert(ServingFacts("DFLASH"))
    assert "unset" in trl.SLOT.inert(ServingFacts())
    assert not trl.SLOT.default and "eagle_host" in trl.SLOT.presets
