"""Rank agreement on the slot set: two real gloo processes on the CPU."""

import os

import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_hostsync_plugin.ranks import SlotSetMismatch, agree_on_slot_set, slot_set_digest


def _worker(rank, init_file, sets, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        agree_on_slot_set(sets[rank], group=dist.group.WORLD)
        results[rank] = "ok"
    except SlotSetMismatch as exc:
        results[rank] = str(exc)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, sets):
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    init_file = os.path.join(tmp_path, "pg")
    procs = [ctx.Process(target=_worker, args=(r, init_file, sets, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    return dict(results)


def test_same_set_agrees(tmp_path):
    res = _run(tmp_path, [["dspark_dp_meta", "event_ring"], ["event_ring", "dspark_dp_meta"]])
    assert res == {0: "ok", 1: "ok"}


def test_mismatch_stops_both_ranks_naming_both_sets(tmp_path):
    res = _run(tmp_path, [["dspark_dp_meta", "event_ring"], ["dspark_dp_meta"]])
    for rank in (0, 1):
        assert "rank 0: [dspark_dp_meta, event_ring]" in res[rank]
        assert "rank 1: [dspark_dp_meta]" in res[rank]


def test_digest_is_order_independent():
    assert slot_set_digest(["a", "b"]) == slot_set_digest(["b", "a"]) != slot_set_digest(["a"])
    assert not dist.is_initialized()
    assert agree_on_slot_set(["a"]) == slot_set_digest(["a"])  # no process group: nothing to agree
