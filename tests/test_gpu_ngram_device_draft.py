"""ngram_device_draft on a CUDA device: the matcher and chain layout equal the
pure-Python reference on random histories (bs up to 48, lengths up to 20k, draft widths 1-16),
positions and retrieve lists equal SGLang's CUDA ``reconstruct_indices_from_tree_mask`` on the
chain's mask, the three kernels make no host sync, and SGLang's real
``_prepare_for_speculative_decoding`` recompiled with the slot's edits hands the verify the same
input as stock fed the same chain (the device path without a host sync). It prints the draft
kernel's GPU time per call.

Then a real NGRAM server (the e2e: ``ngram-p1`` on triton, the random-weight "small-bigram" checkpoints,
whose outputs repeat every 16 tokens, so n-gram drafting has something to copy; real acceptance)
with ``default,ngram_full_mask,ngram_device_draft`` against stock and against ``default,ngram_full_mask``:
the real-traffic mix identical to stock one at a time and clean under concurrent clients with aborts,
the slot applied, and the audit's syncs per step at c1 below the base arm's (part 2: no per-step
seq-lens wait on triton), and its server log counts decode steps drafted on the device; accept length
and run-ahead are printed. ``HOSTSYNC_NGRAM_E2E_DIR``: check an e2e output directory made by the
same command, or by one with these arms among others and other concurrencies (c1 among them:
``CALL=8 bash scripts/device_pending.sh``), instead of starting the servers here.

Skipped without CUDA (CI); run by scripts/gpu_run.sh."""

import random
import time

import pytest
import torch

from sglang_hostsync_plugin.slots import ngram_device_draft as ndd
from test_ngram_device_draft import decode_batch, make_worker, ref_chain, reference_host_draft, verify_input

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def case(rng, bs, d, max_len, vocab=None):
    seqs = [[rng.randrange(vocab or rng.choice([2, 4, 30, 32000])) for _ in range(rng.randint(1, max_len))]
            for _ in range(bs)]
    rows = rng.sample(range(bs * 2 + 1), bs)
    width = max(len(s) for s in seqs) + d + 1
    hist = torch.randint(0, 5, (bs * 2 + 1, width), dtype=torch.int32)
    for s, r in zip(seqs, rows):
        hist[r, :len(s)] = torch.tensor(s, dtype=torch.int32)
    return seqs, hist.cuda(), torch.tensor(rows, device="cuda"), torch.tensor([len(s) - 1 for s in seqs], device="cuda")


def outputs(bs, d):
    return [torch.empty(bs * d, dtype=torch.int64, device="cuda"), torch.empty(bs * d * d, dtype=torch.bool, device="cuda"),
            torch.empty(bs * d, dtype=torch.int64, device="cuda"),
            *(torch.empty((bs, d), dtype=torch.int64, device="cuda") for _ in range(3))]


def test_identical_to_the_reference_and_to_sglangs_cuda_tree_op():
    from sglang.kernels.ops.speculative.tree import reconstruct_indices_from_tree_mask

    rng = random.Random(11)
    n = 0
    for d in (1, 4, 8, 12, 16):
        for bs, max_len in ((1, 50), (3, 3000), (8, 600), (17, 20000), (48, 200)):
            max_n = rng.choice([1, 3, 8, 18])
            seqs, hist, rows, seq_lens = case(rng, bs, d, max_len)
            out = outputs(bs, d)
            ndd.draft_chain(hist, rows, seq_lens, *out, d, max_n=max_n)
            tokens, mask = out[0].cpu(), out[1].cpu()
            for b, s in enumerate(seqs):
                want_t, want_m, _ = ref_chain(s, len(s), d, 1, max_n)
                assert tokens[b * d:(b + 1) * d].tolist() == want_t, (d, bs, b)
                assert mask[b * d * d:(b + 1) * d * d].view(d, d).tolist() == want_m, (d, bs, b)
            sg = outputs(bs, d)[2:]
            reconstruct_indices_from_tree_mask(out[1], seq_lens, *sg, bs, d)
            for got, want in zip(out[2:], sg):
                assert torch.equal(got, want), (d, bs)
            n += 1
    print(f"ngram_device_draft: {n} random batches identical to the reference and SGLang's tree op")


def test_no_host_sync():
    rng = random.Random(2)
    seqs, hist, rows, seq_lens = case(rng, 8, 12, 4000)
    out = outputs(8, 12)
    acc = torch.randint(0, 100, (8 * 12,), dtype=torch.int32, device="cuda")
    lens = torch.randint(1, 13, (8,), dtype=torch.int32, device="cuda")
    flat = torch.randint(0, 100, (1000,), dtype=torch.int64, device="cuda")
    offsets = torch.tensor([0, 100, 300, 300, 600, 700, 800, 900, 1000], device="cuda")
    for _ in range(2):  # the first compiles
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if _ else "default")
        try:
            ndd.draft_chain(hist, rows, seq_lens, *out, 12, max_n=18)
            ndd.append_accepted(hist, rows, acc, lens, seq_lens + lens, 12)
            ndd.write_rows(hist, rows, flat, offsets)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_recompiled_prepare_hands_verify_stocks_input_on_the_device(monkeypatch):
    from sglang.srt.speculative import ngram_worker as w

    monkeypatch.setattr(ndd.NGRAM_PREPARE_SITE, "_variants", {})
    monkeypatch.setattr(w, "NgramVerifyInput", w.NgramVerifyInput)  # verify_input swaps in a recorder
    monkeypatch.setattr(w, "assign_extend_cache_locs_func", lambda **kw: torch.zeros(1, dtype=torch.int64))
    monkeypatch.setattr(w, "prepare_mamba_track_for_verify", lambda batch: None)
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    rng = random.Random(5)
    for d, bs in ((8, 1), (12, 5), (4, 16)):
        seqs = [[rng.randrange(6) for _ in range(rng.randint(1, 2000))] for _ in range(bs)]
        rows = rng.sample(range(32), bs)

        def batch():  # the CPU test's decode batch (greedy, no multimodal), its device tensors on CUDA
            b = decode_batch(w, seqs, rows)
            b.seq_lens, b.req_pool_indices = b.seq_lens.cuda(), b.req_pool_indices.cuda()
            return b

        def cuda_worker(host_draft):
            worker = make_worker(d, max_bs=16, rows=32, width=2100, host_draft=host_draft)
            for name in ("retrieve_indexes_batch", "retrieve_next_token_batch", "retrieve_next_sibling_batch",
                         "positions_batch", "tree_mask_batch", "draft_tokens_batch"):
                full = getattr(worker, name)[-1]
                base = full.cuda()
                setattr(worker, name, [base[: len(v)] for v in getattr(worker, name)])
            worker.tree_mask = worker.tree_mask_batch[-1]
            worker.device = "cuda"
            worker.req_to_token_pool.req_to_token = worker.req_to_token_pool.req_to_token.cuda()
            return worker

        stock = verify_input(w, original, cuda_worker(reference_host_draft(seqs, d, 18)), batch())
        worker = cuda_worker(lambda b: pytest.fail("host draft"))
        hist = ndd.history_of(worker)
        for s, r in zip(seqs, rows):
            hist.tokens[r, :len(s)] = torch.tensor(s, dtype=torch.int32, device="cuda")
            hist.ready[r] = True
            hist.generation[r] = worker.req_to_token_pool.req_generation[r].item()  # the row's current owner
        verify_input(w, lambda *a: ndd.edited(original)(*a), worker, batch())  # compiles
        step = batch()  # the test's own H2D copies of the batch (pageable) sync; SGLang's batch is on the device
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            plugin = verify_input(w, lambda *a: ndd.edited(original)(*a), worker, step)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for key, want in stock.items():
            if isinstance(want, torch.Tensor):
                assert plugin[key].dtype == want.dtype and torch.equal(plugin[key], want), (key, d, bs)


def test_draft_time_per_call():
    """GPU time of one draft launch (printed; what the device pays for the host lookup it removes)."""
    rng = random.Random(9)
    for bs, length in ((1, 1000), (1, 32000), (8, 8000), (48, 4000), (48, 32000)):
        # Every request at ``length`` tokens (case() draws shorter ones, and a history that narrow).
        hist = torch.randint(0, 32000, (bs * 2 + 1, length + 13), dtype=torch.int32, device="cuda")
        rows = torch.tensor(rng.sample(range(bs * 2 + 1), bs), device="cuda")
        seq_lens = torch.full((bs,), length - 1, device="cuda")
        out = outputs(bs, 12)
        ndd.draft_chain(hist, rows, seq_lens, *out, 12, max_n=18)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(20):
            ndd.draft_chain(hist, rows, seq_lens, *out, 12, max_n=18)
        end.record()
        host = (time.perf_counter() - t0) / 20 * 1e6
        torch.cuda.synchronize()
        print(f"ngram_device_draft: bs {bs} length {length}: GPU {start.elapsed_time(end) / 20 * 1e3:.1f} us, "
              f"host {host:.1f} us per call (max_n 18, D 12, random tokens)")


# ---------------------------------------------------------------------------
# A real NGRAM server
# ---------------------------------------------------------------------------
CONFIG = "ngram-p1"
BASE_SPEC = "default,ngram_full_mask"
DEV_SPEC = "default,ngram_full_mask,ngram_device_draft"
HOST_SPEC = "default,eagle_host,ngram_host"  # what auto picks for NGRAM triton page 1: the trie with the host slots


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from helpers import e2e_with_slot

    return e2e_with_slot(tmp_path_factory.mktemp("ngram_dist"), "HOSTSYNC_NGRAM_E2E_DIR", "test_gpu_ngram_device_draft",
                         None, None,
                         ["--configs", CONFIG, "--checkpoint-shape", "small-bigram", "--arms", "stock", "--slots",
                          BASE_SPEC, "--slots", DEV_SPEC, "--slots", HOST_SPEC, "--concurrency", "1", "4", "--rounds", "2", "--traffic", "full", "--traffic-requests", "48",
                          "--traffic-aborts", "8", "--server-arg=--disable-prefill-cuda-graph", "--ready-timeout", "240",
                          "--time-budget", "400"], timeout=480)


def test_the_ngram_servers_started_and_the_slot_applied(e2e):
    from helpers import assert_started_and_applied

    assert_started_and_applied(e2e, f"{CONFIG}/slots:{DEV_SPEC}", ndd.NAME)


def test_the_real_traffic_mix_is_identical_to_stock_with_the_device_draft(e2e):
    from sglang_hostsync_plugin.e2e.run import traffic_failures

    t = e2e["traffic"][f"{CONFIG}/slots:{DEV_SPEC}"]
    assert not t.get("errors"), t.get("errors")
    assert t["sequential"]["identical"] and t["sequential"]["compared"] > 0, t["sequential"]
    assert t["concurrent"]["completed"] > 0 and t["concurrent"]["aborted"] > 0, t["concurrent"]
    assert t["tokens_after_drain"] == 0 and not t.get("log_problems"), t
    bad = [b for b in traffic_failures(e2e) if b.startswith(CONFIG + "/")]
    assert not bad, bad


def test_the_device_draft_removes_the_per_step_wait(e2e):
    cells = {(c["arm"], c["concurrency"]): c for c in e2e["cells"] if c["config"] == CONFIG}
    concs = sorted(c for a, c in cells if a == f"slots:{BASE_SPEC}")  # 1 and 4 here; a reused run may have others
    assert concs[:1] == [1] and len(concs) >= 2, sorted(cells)
    for conc in concs:
        base, dev = cells.get((f"slots:{BASE_SPEC}", conc)), cells.get((f"slots:{DEV_SPEC}", conc))
        assert base and dev and base["audit"] and dev["audit"], sorted(cells)
        b, d = base["audit"], dev["audit"]
        print(f"ngram c{conc}: syncs/step {b['syncs_per_step']:.3f} -> {d['syncs_per_step']:.3f}, run-ahead "
              f"{b['run_ahead_fraction']:.3f} -> {d['run_ahead_fraction']:.3f}, accept length "
              f"{base['accept_length']} -> {dev['accept_length']}, tok/s/user {base['tok_s_user_median']:.1f} -> "
              f"{dev['tok_s_user_median']:.1f}")
        host = cells.get((f"slots:{HOST_SPEC}", conc))
        if host and host["audit"]:
            print(f"ngram c{conc} {HOST_SPEC}: syncs/step {host['audit']['syncs_per_step']:.3f}, run-ahead "
                  f"{host['audit']['run_ahead_fraction']:.3f}, accept length {host['accept_length']}, tok/s/user "
                  f"{host['tok_s_user_median']:.1f}")
        assert b["steps"] > 50 and d["steps"] > 50
        if conc == 1:
            assert d["syncs_per_step"] < b["syncs_per_step"] - 0.5, (b["sync_sites"], d["sync_sites"])


def test_the_device_drafted_the_decode_steps(e2e):
    """The slot's count lines in its server log (``ngram_device_draft.drafted_line``): decode steps were
    drafted on the device, not all left to SGLang's host draft (identical outputs alone cannot tell)."""
    import os
    import re

    out = os.environ.get("HOSTSYNC_NGRAM_E2E_DIR") or os.path.join(os.environ.get("OUT", "/tmp"),
                                                                    "test_gpu_ngram_device_draft")
    log = e2e["servers"][f"{CONFIG}/slots:{DEV_SPEC}"]["log"]
    with open(os.path.join(out, log), errors="replace") as f:
        lines = [x.strip() for x in f if f"hostsync: {ndd.NAME}: " in x]
    counts = [int(m.group(1)) for m in map(re.compile(r"(\d+) decode steps drafted on the device").search, lines) if m]
    print("\n".join(lines[-8:]))
    assert counts and max(counts) > 0, lines[-8:]
