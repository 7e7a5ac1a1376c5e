"""ngram_full_mask: the kernel builds stock's USE_FULL_MASK verify mask exactly (random batches,
lengths on and across page and block edges, draft widths), and SGLang's real
``NGRAMWorker._prepare_for_speculative_decoding``, recompiled, hands NgramVerifyInput the same
custom mask as stock with one launch; what the kernel does not take runs stock's loop.

ngram_worker imports sgl_kernel's tree op at module import on a machine without CUDA, so the
tests that run SGLang's method import it beside a stand-in ``sgl_kernel.speculative`` whose op
is never called (the tree reconstruction is stubbed out too), and drop the two modules that
bound it afterwards."""

import random
import sys
import types

import numpy as np
import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm


def stock_full_mask(tree_mask, mask, seq_lens_cpu, d):
    """SGLang 0.5.23's USE_FULL_MASK loop (ngram_worker.py ~326-370), on the CPU."""
    bs = len(seq_lens_cpu)
    ones_masks = [torch.ones((d, seq_lens_cpu[i])) for i in range(bs)]
    mask = mask.reshape(bs, d, d)
    out = []
    for i in range(bs):
        out.append(torch.cat((ones_masks[i], torch.from_numpy(mask[i]).to(device="cpu")), dim=1).to(torch.bool).flatten())
    return torch.cat(out, dim=0)


def _case(rng, bs, d, lens=None, dtype=torch.int64):
    lens = lens or [rng.choice([1, 15, 16, 17, rng.randrange(1, 3000), nfm.BLOCK - d, nfm.BLOCK, nfm.BLOCK + 1])
                    for _ in range(bs)]
    mask = (np.random.default_rng(rng.randrange(1 << 30)).random((bs * d * d,)) < 0.4).astype(np.uint8)
    mask[:: d + 1] = 1  # the diagonal, as a tree mask has it
    tree = torch.from_numpy(mask).to(torch.bool)  # tree_mask.copy_(from_numpy(mask)) in stock
    return tree, mask, torch.tensor(lens, dtype=dtype), torch.tensor(lens, dtype=torch.int64)


@pytest.mark.parametrize("d", [1, 4, 8, 13])
def test_kernel_is_stock_on_random_batches(d):
    rng = random.Random(d)
    for bs in (1, 2, 3, 5, 8):
        tree, mask, seq_lens, seq_lens_cpu = _case(rng, bs, d, dtype=rng.choice([torch.int32, torch.int64]))
        got = nfm.full_mask(tree, seq_lens, seq_lens_cpu, d)
        want = stock_full_mask(tree, mask, seq_lens_cpu.tolist(), d)
        assert got.dtype == want.dtype == torch.bool and got.shape == want.shape
        assert torch.equal(got, want), (d, bs, seq_lens_cpu.tolist())


def test_rows_longer_than_a_block_and_the_last_request():
    """A request whose window spans several blocks, its tree part split by a block edge, and
    no write past the end (the output is exactly stock's size)."""
    rng = random.Random(1)
    d = 8
    lens = [3 * nfm.BLOCK - 3, 1, 2 * nfm.BLOCK + 5]
    tree, mask, seq_lens, seq_lens_cpu = _case(rng, 3, d, lens)
    got = nfm.full_mask(tree, seq_lens, seq_lens_cpu, d)
    assert torch.equal(got, stock_full_mask(tree, mask, lens, d))
    assert got.numel() == d * (sum(lens) + 3 * d)


def test_device_lengths_beyond_the_host_size_write_nothing_past_it():
    """The size is stock's (from seq_lens_cpu); were the device lengths larger, the kernel stops
    at that size: the launch writes into the front of a sentinel buffer, whose tail stays."""
    d = 4
    tree, mask, _, seq_lens_cpu = _case(random.Random(2), 2, d, [5, 6])
    total = d * (11 + 2 * d)
    buf = torch.ones(total + 4096, dtype=torch.bool)
    buf[total:] = False
    nfm._full_mask_kernel[(2, d)](tree, torch.tensor([5, 600]), buf, total, D=d, BLOCK=nfm.BLOCK)
    assert not buf[total:].any()  # nothing past the size
    assert torch.equal(buf[: d * (5 + d)], stock_full_mask(tree, mask, [5, 6], d)[: d * (5 + d)])
    assert nfm.full_mask(tree, torch.tensor([5, 600]), seq_lens_cpu, d).numel() == total


def test_kernel_lays_out_by_the_device_lengths():
    """Device lengths that differ from the host copy (same total): the layout follows
    ``seq_lens``, what SGLang's verify attention reads; ``seq_lens_cpu`` only sizes the output."""
    d = 4
    tree, mask, _, _ = _case(random.Random(4), 2, d, [6, 5])
    got = nfm.full_mask(tree, torch.tensor([6, 5]), torch.tensor([5, 6]), d)
    assert torch.equal(got, stock_full_mask(tree, mask, [6, 5], d))


def test_fits():
    batch = types.SimpleNamespace(reqs=[1], seq_lens=torch.ones(1, dtype=torch.int64), seq_lens_cpu=torch.ones(1))
    tree = torch.zeros(4, dtype=torch.bool)
    assert nfm._INTERPRET and nfm.fits(batch, tree)  # so the tests here run the kernel
    assert not nfm.fits(types.SimpleNamespace(**{**vars(batch), "reqs": []}), tree)
    assert not nfm.fits(types.SimpleNamespace(**{**vars(batch), "seq_lens_cpu": None}), tree)
    assert not nfm.fits(batch, tree.to(torch.uint8))


@pytest.fixture
def ngram_worker(monkeypatch):
    """SGLang's ngram_worker module, imported beside a stand-in sgl_kernel.speculative; the two
    modules that bound the stand-in are dropped afterwards (the rest of SGLang stays imported)."""
    stub = types.ModuleType("sgl_kernel.speculative")
    stub.reconstruct_indices_from_tree_mask = None  # never called: the tests stub the caller
    pkg = types.ModuleType("sgl_kernel")
    pkg.speculative = stub
    monkeypatch.setitem(sys.modules, "sgl_kernel", pkg)
    monkeypatch.setitem(sys.modules, "sgl_kernel.speculative", stub)
    from sglang.srt.speculative import ngram_worker as w

    monkeypatch.setattr(nfm.NGRAM_PREPARE_SITE, "_variants", {})
    monkeypatch.setattr(nfm.NGRAM_PREPARE_SITE, "_failed", set())
    yield w
    for name in ("sglang.srt.speculative.ngram_worker", "sglang.kernels.ops.speculative.reconstruct_tree"):
        sys.modules.pop(name, None)


def _fake_worker(w, monkeypatch, d, bs, lens, seed):
    """A stand-in NGRAMWorker for SGLang's method: its buffers as __init__ makes them, the
    corpus lookup returning a random tree mask; the tree reconstruction, cache-loc assignment and
    NgramVerifyInput replaced by recorders."""
    rng = random.Random(seed)
    tree, mask, seq_lens, seq_lens_cpu = _case(rng, bs, d, lens)
    drafts = np.arange(bs * d, dtype=np.int64)
    seen = []
    monkeypatch.setattr(w, "reconstruct_indices_from_tree_mask_func", lambda *a: None)
    monkeypatch.setattr(w, "assign_extend_cache_locs_func", lambda **kw: torch.zeros(bs * d, dtype=torch.int64))
    monkeypatch.setattr(w, "prepare_mamba_track_for_verify", lambda batch: None)
    monkeypatch.setattr(w, "NgramVerifyInput", lambda **kw: seen.append(kw) or types.SimpleNamespace(**kw))
    max_bs = 8
    flat_mask = torch.empty(max_bs * d * d, dtype=torch.bool)
    flat_tokens = torch.empty(max_bs * d, dtype=torch.int64)
    self = types.SimpleNamespace(
        draft_token_num=d, device="cpu", tree_mask=flat_mask,
        retrieve_indexes_batch=[None] * (max_bs + 1), retrieve_next_token_batch=[None] * (max_bs + 1),
        retrieve_next_sibling_batch=[None] * (max_bs + 1), positions_batch=[None] * (max_bs + 1),
        tree_mask_batch=[flat_mask[: b * d * d] for b in range(max_bs + 1)],
        draft_tokens_batch=[flat_tokens[: b * d] for b in range(max_bs + 1)],
        _prepare_draft_tokens=lambda batch: (drafts, mask),
    )
    batch = types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_decode=lambda: True), reqs=[object()] * bs, seq_lens=seq_lens,
        seq_lens_cpu=seq_lens_cpu, has_grammar=False, req_pool_indices=torch.arange(bs),
        req_to_token_pool=types.SimpleNamespace(req_to_token=None))
    return self, batch, seen, (tree, mask, lens)


def _counting_kernel(monkeypatch):
    calls = []
    kernel = nfm._full_mask_kernel

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(nfm, "_full_mask_kernel", Counting())
    return calls


@pytest.mark.parametrize("bs,d", [(1, 8), (3, 8), (5, 4)])
def test_recompiled_prepare_hands_verify_the_stock_mask(ngram_worker, monkeypatch, bs, d):
    w = ngram_worker
    assert not w._is_cpu and w.USE_FULL_MASK  # stock builds the full mask here too
    calls = _counting_kernel(monkeypatch)
    original = w.NGRAMWorker._prepare_for_speculative_decoding
    original = getattr(original, "__wrapped__", original)
    masks = []
    for fn in (original, lambda *a: nfm.edited(original)(*a)):
        self, batch, seen, (tree, mask, lens) = _fake_worker(w, monkeypatch, d, bs, None, seed=bs * 10 + d)
        fn(self, batch)
        masks.append(seen[-1]["custom_mask"])
        assert batch.forward_mode is w.ForwardMode.TARGET_VERIFY
    stock, plugin = masks
    assert torch.equal(stock, stock_full_mask(tree, mask, lens or batch.seq_lens_cpu.tolist(), d))
    assert plugin.dtype == stock.dtype and plugin.shape == stock.shape and torch.equal(plugin, stock)
    assert calls == [(bs, d)]  # one launch for the batch
    assert nfm.edited(original) is not original and nfm.PREPARE_ONCE.live()


def test_recompiled_prepare_launches_the_kernel_on_the_batchs_device_lengths(ngram_worker, monkeypatch):
    """The launch gets ``batch.seq_lens`` itself: on a CPU box the host copy is the same kind of
    tensor with the same values, so only the object tells a launch on ``seq_lens_cpu`` apart."""
    w = ngram_worker
    launched = []
    kernel = nfm._full_mask_kernel

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(args) or kernel[grid](*args, **kwargs)

    monkeypatch.setattr(nfm, "_full_mask_kernel", Spy())
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    self, batch, seen, (tree, mask, lens) = _fake_worker(w, monkeypatch, 8, 3, [40, 1, 17], seed=4)
    nfm.edited(original)(self, batch)
    assert len(launched) == 1 and batch.seq_lens is not batch.seq_lens_cpu
    assert launched[0][1] is batch.seq_lens
    assert torch.equal(seen[-1]["custom_mask"], stock_full_mask(tree, mask, lens, 8))


def test_what_the_kernel_does_not_take_runs_the_stock_loop(ngram_worker, monkeypatch):
    w = ngram_worker
    calls = _counting_kernel(monkeypatch)
    monkeypatch.setattr(nfm, "_INTERPRET", False)  # a CPU tensor outside the interpreter
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    self, batch, seen, (tree, mask, _) = _fake_worker(w, monkeypatch, 8, 2, [40, 17], seed=3)
    nfm.edited(original)(self, batch)
    assert calls == [] and torch.equal(seen[-1]["custom_mask"], stock_full_mask(tree, mask, [40, 17], 8))


def test_pin_and_edit_match_the_installed_sglang(ngram_worker):
    from sglang_hostsync_plugin.checks import source_sha

    fn = ngram_worker.NGRAMWorker._prepare_for_speculative_decoding
    assert source_sha(getattr(fn, "__wrapped__", fn)) == nfm.PREPARE_SHA
    assert nfm.PREPARE_ONCE.check() is None and nfm.SLOT.precheck() is None


def test_read_source_is_inspect_getsource(ngram_worker):
    """Where ngram_worker does not import (no sgl_kernel), its targets are checked from its file:
    that text is exactly the source the import gives."""
    import inspect

    from sglang_hostsync_plugin.checks import read_source

    fn = ngram_worker.NGRAMWorker._prepare_for_speculative_decoding
    assert read_source(nfm.PREPARE) == inspect.getsource(getattr(fn, "__wrapped__", fn))


def test_without_sgl_kernel_checked_from_the_file_and_refused_when_not_in_place():
    """This CPU venv has no sgl_kernel, so ngram_worker does not import. The doctor's check reads
    its file: the pinned source and both edits apply (would apply), a changed pin is named; but
    selected and loaded, the hook cannot be in place, so a strict startup stops (why it is opt-in)."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python("""
import json
from sglang_hostsync_plugin import checks, plan as plans
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm
facts = ServingFacts(speculative_algorithm="NGRAM", topk=1, page_size=1, attention_backends=("triton", "triton"))
p = plans.resolve({"SGLANG_HOSTSYNC_SLOTS": "default,ngram_full_mask"}, facts=facts)
ok = p.verdict("ngram_full_mask").status.value
nfm.PREPARE_ONCE.sha = "0" * 16
pin = nfm.PREPARE_ONCE.check()
nfm.PREPARE_ONCE.sha = nfm.PREPARE_SHA
nfm.PREPARE_ONCE.edits = (("a line SGLang does not have\\n", "x"),)
edit = nfm.PREPARE_ONCE.check()
import dataclasses
target = checks.check_target(dataclasses.replace(nfm.SLOT.targets[0], source_sha="1" * 16))
print("RESULT" + json.dumps({"ok": ok, "pin": pin, "edit": edit, "target": target}))
""")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["ok"] == "would apply", res
    assert "source sha" in res["pin"] and "expected 0000000000000000" in res["pin"], res
    assert "SourceEditError" in res["edit"] and "a line SGLang does not have" in res["edit"], res
    assert res["target"].startswith("upstream shape changed:") and "expected 1111111111111111" in res["target"], res
    proc = run_python(LOAD_AND_STARTUP_CHECK + """
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["ngram_full_mask"].status.value,
      "readback": rt.state.statuses["ngram_accept_readback"].status.value}))
""".replace("print(", "import json\nprint(", 1), SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,ngram_full_mask")
    assert proc.returncode == 0, out(proc)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["status"] == "failed" and "hook not in place" in res["err"], res
    assert res["readback"] == "applied"


def test_inert_rule():
    assert nfm.inert(ServingFacts(speculative_algorithm="NGRAM")) is None
    assert "STANDALONE" in nfm.inert(ServingFacts(speculative_algorithm="STANDALONE", topk=4))
    assert nfm.inert(ServingFacts(speculative_algorithm=None)) is not None
    assert not nfm.SLOT.default


def test_installed_in_real_sglang_through_the_edit_site():
    """In a fresh interpreter with SGLang's HookRegistry (ngram_host, beside a stand-in sgl_kernel): the
    slot verifies as applied, and the live method, the edit site's one hook, runs the recompiled variant
    that hands verify stock's mask."""
    from helpers import LOAD_AND_STARTUP_CHECK, out, run_python

    proc = run_python("""
import sys, types
stub = types.ModuleType("sgl_kernel.speculative")
stub.reconstruct_indices_from_tree_mask = None
pkg = types.ModuleType("sgl_kernel")
pkg.speculative = stub
sys.modules["sgl_kernel"], sys.modules["sgl_kernel.speculative"] = pkg, stub
""" + LOAD_AND_STARTUP_CHECK + """
import json
import pytest, torch
sys.path.insert(0, "tests")
from sglang.srt.speculative import ngram_worker as w
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm
from test_ngram_full_mask import _fake_worker, stock_full_mask
mp = pytest.MonkeyPatch()
self, batch, seen, (tree, mask, lens) = _fake_worker(w, mp, 8, 3, [40, 1, 17], seed=5)
w.NGRAMWorker._prepare_for_speculative_decoding(self, batch)  # the hooked chain
print("RESULT" + json.dumps({"err": err, "status": rt.state.statuses["ngram_full_mask"].status.value,
      "same": bool(torch.equal(seen[-1]["custom_mask"], stock_full_mask(tree, mask, lens, 8))),
      "live": nfm.PREPARE_ONCE.live(), "variants": [list(k) for k in nfm.NGRAM_PREPARE_SITE._variants]}))
""", SGLANG_ENABLE_HOSTSYNC_PLUGIN="1", SGLANG_HOSTSYNC_SLOTS="default,ngram_host")
    assert proc.returncode == 0, out(proc)
    import json

    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res == {"err": None, "status": "applied", "same": True, "live": True, "variants": [["ngram_full_mask"]]}, res
    assert "Multiple AROUND hooks" not in proc.stderr + proc.stdout


def _reqs(allocated):
    return [types.SimpleNamespace(kv=types.SimpleNamespace(kv_allocated_len=n)) for n in allocated]


def _pool(row_width):
    return types.SimpleNamespace(req_to_token=torch.zeros((2, row_width)))


def _worker_with_verify_buffer(cells):
    buffer = types.SimpleNamespace(buffer=torch.zeros(cells, dtype=torch.uint8))
    return types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=types.SimpleNamespace(
        verify_mask=buffer)))


def test_without_host_lengths_the_mask_is_sized_from_the_allocation_and_its_prefix_is_stocks():
    """A scheduler that publishes no host lengths (ngram_device_draft's triton NGRAM servers): the size
    comes from the allocation (kv_allocated_len covers L_i + D), never below stock's exact D * sum(L_i + D),
    and the kernel writes stock's mask into its first cells (the verify reads it by device offsets)."""
    rng = random.Random(7)
    for d in (1, 4, 8):
        for bs in (1, 3, 6):
            lens = [rng.randrange(1, 900) for _ in range(bs)]
            tree, mask, seq_lens, seq_lens_cpu = _case(rng, bs, d, lens)
            allocated = [n + d + rng.randrange(0, 3 * d) for n in lens]  # covers L_i + D, as SGLang allocates
            batch = types.SimpleNamespace(reqs=_reqs(allocated), seq_lens=seq_lens, seq_lens_cpu=None,
                                          req_to_token_pool=_pool(1000 + 4 + d))
            exact = d * (sum(lens) + bs * d)
            size = nfm.mask_size(batch, d)
            assert size >= exact and batch.seq_lens_cpu is None, (d, bs)
            got = nfm.full_mask(tree, seq_lens, None, d, size)
            assert got.numel() == size
            assert torch.equal(got[:exact], stock_full_mask(tree, mask, lens, d)), (d, bs)
            # With the host lengths the size is stock's exact one.
            batch.seq_lens_cpu = seq_lens_cpu
            assert nfm.mask_size(batch, d) == exact
    # A request at the context limit: SGLang lets L reach context - 4 + D (its last overlap step), with
    # the allocation at the row's end (row = context + extra); the size still covers L + D.
    d, context, extra = 8, 1000, 12
    length = context - 4 + d
    batch = types.SimpleNamespace(reqs=_reqs([context + extra]), seq_lens=torch.tensor([length]), seq_lens_cpu=None,
                                  req_to_token_pool=_pool(context + extra))
    assert nfm.mask_size(batch, d) >= d * (length + d)
    # Neither host lengths nor allocations: no size.
    assert nfm.mask_size(types.SimpleNamespace(reqs=[object()], seq_lens_cpu=None), 4) is None


def test_a_bound_past_the_verify_buffer_reads_the_host_lengths():
    """The graph replay copies the mask into the backend's verify buffer: a bound larger than it (requests
    near the context length) takes the host lengths (stock's one wait) and stock's exact size."""
    d, lens = 4, [300, 20]
    batch = types.SimpleNamespace(reqs=_reqs([n + 3 * d for n in lens]), seq_lens=torch.tensor(lens),
                                  seq_lens_cpu=None, req_to_token_pool=_pool(4096))
    bound = nfm.mask_size(batch, d)
    assert batch.seq_lens_cpu is None
    assert nfm.mask_size(batch, d, _worker_with_verify_buffer(bound)) == bound and batch.seq_lens_cpu is None
    assert nfm.mask_size(batch, d, _worker_with_verify_buffer(bound - 1)) == d * (sum(lens) + 2 * d)
    assert batch.seq_lens_cpu.tolist() == lens
    assert nfm.verify_buffer_cells(types.SimpleNamespace(model_runner=types.SimpleNamespace(
        attn_backend=types.SimpleNamespace(verify_mask=None)))) is None


def test_fits_without_host_lengths():
    """The kernel takes a batch without host lengths when the allocation bounds it; where the kernel
    cannot run, stock's loop needs the host lengths, which fits reads (stock's one wait)."""
    seq_lens = torch.tensor([5, 9])
    tree = torch.zeros(8, dtype=torch.bool)
    batch = types.SimpleNamespace(reqs=_reqs([9, 13]), seq_lens=seq_lens, seq_lens_cpu=None)
    assert nfm.fits(batch, tree) and batch.seq_lens_cpu is None
    assert not nfm.fits(batch, tree.to(torch.uint8))
    assert batch.seq_lens_cpu is not None and batch.seq_lens_cpu.device.type == "cpu"
    assert batch.seq_lens_cpu.tolist() == [5, 9]
    bare = types.SimpleNamespace(reqs=[object(), object()], seq_lens=seq_lens, seq_lens_cpu=None)
    assert not nfm.fits(bare, tree) and bare.seq_lens_cpu.tolist() == [5, 9]


def test_recompiled_prepare_without_host_lengths_hands_verify_stocks_mask_in_a_bound_sized_tensor(
        ngram_worker, monkeypatch):
    w = ngram_worker
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    d, bs = 8, 3
    self, batch, seen, (tree, mask, lens) = _fake_worker(w, monkeypatch, d, bs, [40, 700, 17], seed=3)
    stock_batch = types.SimpleNamespace(**vars(batch))
    original(self, stock_batch)
    stock = seen[-1]["custom_mask"]
    batch.seq_lens_cpu = None
    batch.reqs = _reqs([40 + 2 * d, 700 + d, 17 + 3 * d])
    batch.req_to_token_pool = _pool(4096)
    nfm.edited(original)(self, batch)
    plugin = seen[-1]["custom_mask"]
    assert batch.seq_lens_cpu is None  # nothing read the device lengths back
    assert plugin.numel() == d * (40 + 2 * d + 700 + d + 17 + 3 * d + 3 * d) > stock.numel()
    assert torch.equal(plugin[: stock.numel()], stock)
