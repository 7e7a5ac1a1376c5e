"""triton_replay_launch on a CUDA device: each of the plugin's Triton wrappers, switched to
SGLang's ``replay_launches``, records on the first call of an operand signature and, on the
next call with new contents of that signature, relaunches without Triton's JIT dispatch
(``JITFunction.run`` is not entered) and returns exactly what the plain wrapper returns.
Host time per call, JIT vs replay: benchmarks/bench_replay_launch.py.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from hostsync_drivers import device_plan, eagle_tail, relay_stash, tree_compact
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft
from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl
from sglang_hostsync_plugin.slots import fused_relay_stash as frs
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra
from sglang_hostsync_plugin.slots import flashinfer_device_plan as fdp_slot
from sglang_hostsync_plugin.slots import triton_replay_launch as trl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _replay_off():
    yield
    trl.switch_off()


def _shuffled(rng, *ts):
    """The same tensors' rows in another order: new contents, the same operand signature."""
    perm = torch.tensor(rng.sample(range(ts[0].shape[0]), ts[0].shape[0]), device=ts[0].device)
    return [t[perm].contiguous() for t in ts]


def _argmax_cases(rng):
    for rows in (1, 4, 8, 32):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(rows, 128256, device="cuda").to(dtype)
            yield (a,), (torch.randn(rows, 128256, device="cuda").to(dtype),), {}
            yield (a,), (torch.randn(rows, 128256, device="cuda").to(dtype),), {"keepdim": True}


def _compact_cases(hidden: bool):
    """Cases of compact_hidden (EAGLE) or compact_plain (STANDALONE: no hidden states)."""
    def cases(rng):
        for kw in (dict(bs=1, topk=4, steps=3, hidden_dim=4096), dict(bs=6, topk=4, steps=3, hidden_dim=4096),
                   dict(bs=8, topk=8, steps=7, hidden_dim=512)):
            kw["hidden_dim"] = kw["hidden_dim"] if hidden else None
            one, two = (tree_compact.make_case(rng, device="cuda", **kw) for _ in range(2))
            args = [(c["accept_index"], c["accept_lens"], c["out_cache_loc"], c["predict"],
                     *((c["hidden"],) if hidden else ()), c["bs"], c["nd"]) for c in (one, two)]
            yield args[0], args[1], {}
    return cases


def _page_locs_cases(rng):
    for bs, topk, page, steps in ((1, 4, 16, 3), (5, 4, 16, 3), (8, 8, 64, 7)):
        size, (rows, base, last, pages) = eagle_tail.make_case(rng, bs, topk, page, num_steps=steps, device="cuda")
        rt = rows.to(torch.int32)
        seq = (base + last).to(torch.int64)
        idx = torch.arange(bs, device="cuda", dtype=torch.int64)
        idx2, seq2 = _shuffled(rng, idx, seq)
        yield (rt, idx, seq, topk, steps, page), (rt, idx2, seq2, topk, steps, page), {}


def _tail_cases(rng):
    for bs, topk, page in ((1, 4, 16), (6, 4, 16), (8, 8, 64)):
        _, (rows, base, last, pages) = eagle_tail.make_case(rng, bs, topk, page, num_steps=3, device="cuda")
        args = [rows.to(torch.int64), base, last, pages]
        yield (*args, topk, page), (*_shuffled(rng, *args), topk, page), {}


def _stash_cases(rng):
    for bs, topk, hidden in ((1, 4, None), (6, 4, None), (8, 8, 4096)):
        bufs = (torch.zeros(64, dtype=torch.int64, device="cuda"), torch.zeros(64, topk, device="cuda"),
                torch.zeros(64, topk, dtype=torch.int64, device="cuda"),
                torch.zeros(64, hidden, dtype=torch.bfloat16, device="cuda") if hidden else None)
        args = []
        for _ in range(2):
            p = relay_stash.make_payload(rng, bs, topk, hidden, device="cuda")
            idx = relay_stash.indices_for(rng, 64, bs, device="cuda")
            args.append((idx, p.bonus_tokens, bufs[0], p.topk_p, bufs[1], p.topk_index, bufs[2], p.hidden_states,
                         bufs[3]))
        yield args[0], args[1], {}


def _stash_result(fn):
    """stash_rows returns nothing: the buffers it writes, zeroed before the call and cloned after, are its result."""
    def call(*args, **kw):
        for buf in args[2::2]:
            if buf is not None:
                buf.zero_()
        fn(*args, **kw)
        return tuple(a.clone() if a is not None else None for a in args[2::2])
    return call


def _plan_cases(rng):
    """flashinfer_device_plan's launch: one captured prefill layout, other request lengths each call."""
    for bs in (1, 5, 8):
        first, layout = device_plan.prefill_launch(rng, bs)
        yield first, device_plan.prefill_launch(rng, bs, layout=layout)[0], {}


def _plan_result(fn):
    """The plan launch returns nothing: the workspace it writes, zeroed before the call and cloned after."""
    def call(*args, **kw):
        args[1].zero_()
        fn(*args, **kw)
        return args[1].clone()
    return call


WRAPPERS = {"stash_rows": (frs.stash_rows, _stash_cases), "row_argmax": (gra.row_argmax, _argmax_cases),
            "launch_plan": (fdp_slot.launch_plan, _plan_cases),
            "compact_hidden": (ftc.compact_hidden, _compact_cases(True)),
            "compact_plain": (ftc.compact_plain, _compact_cases(False)),
            "page_locs_launch": (fdl.page_locs_launch, _page_locs_cases),
            "tail_slots_triton": (eft.tail_slots_triton, _tail_cases)}


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return (a is None and b is None) or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_replayed_launches_return_the_plain_wrappers_results(name, jit_calls):
    fn, cases = WRAPPERS[name]
    assert (fn, fn.__wrapped__) in trl._wrappers.fns
    if name == "stash_rows":
        fn = _stash_result(fn)
    if name == "launch_plan":
        fn = _plan_result(fn)
    n = changed = 0
    for first, second, kw in cases(random.Random(hash(name) % 1000)):
        trl.switch_off()
        want_first, want_second = fn(*first, **kw), fn(*second, **kw)  # plain (compiles outside the replay)
        trl.switch_on()
        got_first = fn(*first, **kw)  # records this signature
        before = len(jit_calls)
        got_second = fn(*second, **kw)  # new contents, same signature: replayed
        torch.cuda.synchronize()
        assert len(jit_calls) == before, f"{name}: the second call went through Triton's JIT dispatch"
        assert _same(got_first, want_first) and _same(got_second, want_second), (name, n)
        changed += not _same(want_first, want_second)
        n += 1
    assert changed, f"{name}: no case changed the results between the two calls"
    print(f"triton_replay_launch: {name}: {n} signatures recorded and replayed, identical to the plain wrapper")


def test_replay_has_no_host_sync(jit_calls):
    trl.switch_on()
    x = torch.randn(8, 128256, device="cuda")
    gra.row_argmax(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        before = len(jit_calls)
        gra.row_argmax(x)
        assert len(jit_calls) == before
    finally:
        torch.cuda.set_sync_debug_mode("default")
