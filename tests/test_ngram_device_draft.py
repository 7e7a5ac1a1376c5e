"""ngram_device_draft: the device prompt-lookup matcher against a pure-Python
reference (no match, a match ending right before the root, several matches, histories shorter than
n, mixed batches, multi-block histories, continuations shorter than the draft), the chain layout
against SGLang's own construction (its C++ trie corpus for a chain-shaped result; SGLang's Triton
``reconstruct_indices_from_tree_mask`` for positions and retrieve lists), the history writes,
and SGLang's real ``NGRAMWorker._prepare_for_speculative_decoding`` recompiled with the slot's
edits: the verify input equals stock's fed the same chain as its host draft; a multi-step run
keeps the device history equal to each request's tokens (chunked prefill, a reused pool row,
retraction).

ngram_worker and reconstruct_tree import sgl_kernel's tree op on a machine without CUDA; the
tests that need them import them beside a stand-in ``sgl_kernel.speculative`` and drop the two
modules afterwards (as tests/test_ngram_full_mask.py does)."""

import logging
import random
import sys
import types
from array import array

import numpy as np
import pytest
import torch

from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import ngram_device_draft as ndd
from sglang_hostsync_plugin.slots import ngram_full_mask as nfm


# --- the reference ----------------------------------------------------------------------------

def ref_match(h, length, min_n, max_n):
    """(n, p): the longest suffix n-gram of ``h[:length]`` (``min_n <= n <= max_n``) that also
    ends at an earlier position ``p <= length - 2``; equally long ones: the largest ``p``.
    (0, -1): none."""
    best = (0, -1)
    for p in range(length - 1):
        n = 0
        while n < max_n and n <= p and h[p - n] == h[length - 1 - n]:
            n += 1
        if n >= min_n and (n, p) > best:
            best = (n, p)
    return best


def ref_chain(h, length, d, min_n, max_n):
    """Tokens (``d``) and tree mask (``d x d``) of the chain: the root ``h[length - 1]``, the
    match's continuation clipped at the history's end and at ``d - 1``, then padding nodes
    (token 0, children of the root), as SGLang's trie result lays out a chain."""
    _, p = ref_match(h, length, min_n, max_n)
    c = min(d - 1, length - (p + 1)) if p >= 0 else 0
    tokens = [h[length - 1]] + [h[p + 1 + j] for j in range(c)] + [0] * (d - 1 - c)
    mask = [[(q <= r) if r <= c else (q == 0 or q == r) for q in range(d)] for r in range(d)]
    return tokens, mask, c


def outputs(bs, d):
    return {"tokens": torch.full((bs * d,), -7, dtype=torch.int64),
            "mask": torch.ones(bs * d * d, dtype=torch.bool),
            "positions": torch.full((bs * d,), -7, dtype=torch.int64),
            "retrieve_index": torch.full((bs, d), -7, dtype=torch.int64),
            "next_token": torch.full((bs, d), -7, dtype=torch.int64),
            "next_sibling": torch.full((bs, d), -7, dtype=torch.int64)}


def run(hist, rows, seq_lens, d, max_n, min_n=1):
    out = outputs(rows.shape[0], d)
    ndd.draft_chain(hist, rows, seq_lens, out["tokens"], out["mask"], out["positions"], out["retrieve_index"],
                    out["next_token"], out["next_sibling"], d, max_n=max_n, min_n=min_n)
    return out


def history(seqs, rows, width=None, n_rows=None, dtype=torch.int32):
    width = width or max(len(s) for s in seqs) + 3
    hist = torch.randint(0, 3, (n_rows or max(rows) + 2, width), dtype=dtype)  # stale cells around
    for s, r in zip(seqs, rows):
        hist[r, :len(s)] = torch.tensor(s, dtype=dtype)
    return hist, torch.tensor(rows), torch.tensor([len(s) - 1 for s in seqs])


def check_against_reference(seqs, rows, d, max_n, min_n=1, **kw):
    hist, rows_t, seq_lens = history(seqs, rows, **kw)
    out = run(hist, rows_t, seq_lens, d, max_n, min_n)
    chains = []
    for b, s in enumerate(seqs):
        tokens, mask, c = ref_chain(s, len(s), d, min_n, max_n)
        assert out["tokens"][b * d:(b + 1) * d].tolist() == tokens, (b, s, tokens)
        assert out["mask"][b * d * d:(b + 1) * d * d].view(d, d).tolist() == mask, (b, s)
        chains.append(c)
    return out, chains


# --- the matcher ------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 4, 8, 12])
def test_random_histories_in_mixed_batches_match_the_reference(d):
    rng = random.Random(d)
    for trial in range(12):
        bs = rng.randint(1, 6)
        vocab = rng.choice([2, 3, 5, 50, 1000])
        seqs = [[rng.randrange(vocab) for _ in range(rng.choice([1, 2, 3, rng.randint(4, 40), rng.randint(40, 700)]))]
                for _ in range(bs)]
        rows = rng.sample(range(2 * bs + 1), bs)  # pool rows, not batch order
        check_against_reference(seqs, rows, d, max_n=rng.choice([1, 2, 3, 5, 18]))


def test_no_match_gives_the_root_and_padding_children():
    d = 6
    seq = list(range(10, 30))  # no token repeats: nothing matches
    out, (c,) = check_against_reference([seq], [3], d, max_n=18)
    assert c == 0 and out["tokens"].tolist() == [29, 0, 0, 0, 0, 0]
    assert out["positions"].tolist() == [19, 20, 20, 20, 20, 20]  # root at seq_len, padding at depth 1
    assert out["next_token"][0].tolist() == [1, -1, -1, -1, -1, -1]
    assert out["next_sibling"][0].tolist() == [-1, 2, 3, 4, 5, -1]


def test_match_ending_right_before_the_root_drafts_the_root_again():
    """A run: the latest earlier match ends at p = L - 2, its continuation is the root alone."""
    d = 5
    out, (c,) = check_against_reference([[9, 1, 2, 3, 3, 3]], [0], d, max_n=4)
    assert ref_match([9, 1, 2, 3, 3, 3], 6, 1, 4) == (2, 4)
    assert c == 1 and out["tokens"].tolist() == [3, 3, 0, 0, 0]
    assert out["next_token"][0].tolist() == [1, -1, -1, -1, -1]
    assert out["next_sibling"][0].tolist() == [-1, 2, 3, 4, -1]


def test_longest_match_wins_then_the_most_recent():
    d = 5
    # "1 2 3" occurs early (followed by 70), "2 3" later (followed by 80): the 3-gram wins.
    seq = [1, 2, 3, 70, 71, 9, 2, 3, 80, 81, 9, 9, 1, 2, 3]
    out, _ = check_against_reference([seq], [0], d, max_n=5)
    assert out["tokens"].tolist() == [3, 70, 71, 9, 2]
    # Two equally long matches (followed by 70 and by 80): the later one wins.
    seq = [1, 2, 3, 70, 71, 1, 2, 3, 80, 81, 5, 1, 2, 3]
    out, _ = check_against_reference([seq], [0], d, max_n=5)
    assert out["tokens"].tolist() == [3, 80, 81, 5, 1]
    # max_n caps the length: with 2-grams only, the later "2 3" wins over the longer early match.
    seq = [1, 2, 3, 70, 71, 9, 2, 3, 80, 81, 9, 9, 1, 2, 3]
    out, _ = check_against_reference([seq], [0], d, max_n=2)
    assert out["tokens"].tolist() == [3, 80, 81, 9, 9]
    # min_n: a single-token match is not taken with min_n 2.
    out, (c,) = check_against_reference([[4, 5, 6, 7, 5]], [0], d, max_n=3, min_n=2)
    assert c == 0 and out["tokens"].tolist() == [5, 0, 0, 0, 0]
    out, (c,) = check_against_reference([[4, 5, 6, 7, 5]], [0], d, max_n=3, min_n=1)
    assert c == 3 and out["tokens"].tolist() == [5, 6, 7, 5, 0]


def test_histories_shorter_than_n():
    d = 4
    for seq in ([7], [7, 7], [7, 8], [7, 8, 7], [7, 7, 7]):
        check_against_reference([seq], [1], d, max_n=5, min_n=1)
        check_against_reference([seq], [1], d, max_n=5, min_n=3)
    out, (c,) = check_against_reference([[7]], [0], d, max_n=5)
    assert c == 0 and out["tokens"].tolist() == [7, 0, 0, 0] and out["positions"].tolist() == [0, 1, 1, 1]
    out, (c,) = check_against_reference([[7, 7]], [0], d, max_n=5)
    assert c == 1 and out["tokens"].tolist() == [7, 7, 0, 0]


def test_continuation_shorter_than_the_draft_is_padded():
    d = 8
    seq = [1, 2, 3, 60, 61, 1, 2, 3]  # after the match: 60 61 1 2 3, then the history ends
    out, (c,) = check_against_reference([seq], [0], d, max_n=4)
    assert c == 5 and out["tokens"].tolist() == [3, 60, 61, 1, 2, 3, 0, 0]
    assert out["positions"].tolist() == [7, 8, 9, 10, 11, 12, 8, 8]
    assert out["next_token"][0].tolist() == [1, 2, 3, 4, 5, -1, -1, -1]
    assert out["next_sibling"][0].tolist() == [-1, 6, -1, -1, -1, -1, 7, -1]


def test_histories_over_several_blocks():
    """Matches near block edges, the longest far from the end (an early block), the scan's early
    stop at a full-length match in the last block, lengths around the block size."""
    rng = random.Random(5)
    block = ndd.BLOCK
    for length in (block - 1, block, block + 1, 2 * block + 3, 3 * block + 17):
        for where in (1, block - 2, block - 1, block, block + 1, length - 5):
            if where + 9 >= length:
                continue
            seq = [rng.randrange(40, 1000) for _ in range(length)]
            seq[where:where + 6] = seq[-6:]  # a 6-gram at `where`, continued by seq[where + 6]
            check_against_reference([seq], [0], 8, max_n=rng.choice([3, 6, 18]))
        seq = [rng.randrange(3) for _ in range(length)]
        check_against_reference([seq, seq[: length // 2]], [0, 2], 8, max_n=18)


def test_histories_over_several_match_chunks():
    """Programs scan CHUNK positions each and meet in an atomic max: a match in an early chunk, matches
    across a chunk edge, equally long matches in several chunks (the latest wins), a batch mixing one-chunk
    and many-chunk histories, and the keys buffer left at -1 for the next step (reused here)."""
    rng = random.Random(8)
    chunk, d = ndd.CHUNK, 6
    best = torch.full((8,), -1, dtype=torch.int64)
    length = 2 * chunk + 40
    for where in (3, chunk - 5, chunk - 4, chunk - 1, chunk, chunk + 2, 2 * chunk - 5, 2 * chunk - 3, length - 12):
        seq = [rng.randrange(40, 1000) for _ in range(length)]
        seq[where:where + 5] = seq[-5:]  # a 5-gram ending at where + 4, continued by seq[where + 5]
        hist, rows, seq_lens = history([seq, seq[:200]], [1, 4])
        out = outputs(2, d)
        ndd.draft_chain(hist, rows, seq_lens, out["tokens"], out["mask"], out["positions"], out["retrieve_index"],
                        out["next_token"], out["next_sibling"], d, max_n=5, best=best)
        for b, s in enumerate([seq, seq[:200]]):
            tokens, mask, _ = ref_chain(s, len(s), d, 1, 5)
            assert out["tokens"][b * d:(b + 1) * d].tolist() == tokens, (where, b)
        assert best.tolist() == [-1] * 8
    # The same 4-gram in every chunk: the latest occurrence's continuation.
    seq = [rng.randrange(40, 1000) for _ in range(length)]
    for at in (10, chunk + 10, 2 * chunk + 10):
        seq[at:at + 4] = seq[-4:]
        seq[at + 4] = 7 + at
    check_against_reference([seq], [0], d, max_n=4)
    assert ref_chain(seq, len(seq), d, 1, 4)[0][1] == 7 + 2 * chunk + 10


def test_lengths_past_the_history_width_stay_inside_it():
    d = 4
    hist = torch.zeros((2, 10), dtype=torch.int32)
    hist[1] = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2, 3, 1], dtype=torch.int32)
    out = run(hist, torch.tensor([1]), torch.tensor([50]), d, max_n=3)  # clamped to the 10 cells
    tokens, _, _ = ref_chain(hist[1].tolist(), 10, d, 1, 3)
    assert out["tokens"].tolist() == tokens and out["positions"][0] == 50


def test_int64_ids_and_int32_lengths():
    seqs = [[5, 6, 5, 6, 5], [1, 1, 2]]
    hist, rows, seq_lens = history(seqs, [0, 1])
    a = run(hist, rows, seq_lens, 4, 3)
    b = run(hist, rows.to(torch.int32), seq_lens.to(torch.int32), 4, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError):
        run(hist, rows, seq_lens, 4, max_n=2, min_n=3)


# --- the chain layout against SGLang's own construction -------------------------------------------

@pytest.fixture
def reconstruct(monkeypatch):
    """SGLang's Triton ``reconstruct_indices_from_tree_mask_triton`` (its XPU path; CUDA takes the
    sgl_kernel op with the same contract), imported beside a stand-in sgl_kernel."""
    stub = types.ModuleType("sgl_kernel.speculative")
    stub.reconstruct_indices_from_tree_mask = None
    pkg = types.ModuleType("sgl_kernel")
    pkg.speculative = stub
    monkeypatch.setitem(sys.modules, "sgl_kernel", pkg)
    monkeypatch.setitem(sys.modules, "sgl_kernel.speculative", stub)
    from sglang.kernels.ops.speculative import reconstruct_tree

    yield reconstruct_tree.reconstruct_indices_from_tree_mask_triton
    sys.modules.pop("sglang.kernels.ops.speculative.reconstruct_tree", None)


def sglang_indices(reconstruct, mask, seq_lens, d):
    bs = seq_lens.shape[0]
    got = {"positions": torch.full((bs * d,), -7, dtype=torch.int64)}
    for k in ("retrieve_index", "next_token", "next_sibling"):
        got[k] = torch.full((bs, d), -7, dtype=torch.int64)
    reconstruct(mask, seq_lens, got["positions"], got["retrieve_index"], got["next_token"], got["next_sibling"], bs, d)
    return got


@pytest.mark.parametrize("d", [1, 2, 3, 8, 12])
def test_positions_and_retrieve_lists_are_sglangs_derivation_of_the_mask(reconstruct, d):
    rng = random.Random(100 + d)
    for _ in range(6):
        bs = rng.randint(1, 5)
        seqs = [[rng.randrange(4) for _ in range(rng.randint(1, 60))] for _ in range(bs)]
        hist, rows, seq_lens = history(seqs, rng.sample(range(8), bs))
        out = run(hist, rows, seq_lens, d, max_n=4)
        want = sglang_indices(reconstruct, out["mask"], seq_lens, d)
        for k, v in want.items():
            assert torch.equal(out[k], v), (k, d, seqs)


@pytest.fixture(scope="module")
def corpus_cls():
    """SGLang's C++ trie corpus (built by its JIT on first use, then cached); skipped where it cannot build."""
    try:
        from sglang.kernels.ops.speculative.ngram_corpus import get_ngram_corpus_cls
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        get_ngram_corpus_cls()
    except Exception as exc:  # noqa: BLE001 (no compiler, ninja or tvm_ffi here)
        pytest.skip(f"SGLang's ngram corpus does not build here: {type(exc).__name__}: {exc}")
    return NgramCorpus


def test_chain_is_sglangs_trie_result_for_a_chain(corpus_cls, reconstruct):
    """Where SGLang's trie holds one history whose suffix continues one way only, its result
    (C++ ``fillResult`` via ``NgramCorpus.batch_get``) is a chain: the device draft of that history
    is the same tokens and mask, full length, shorter than the draft (padding), or empty."""
    d, depth = 8, 18
    a, p, b = list(range(100, 110)), [5, 6, 7], list(range(200, 230))
    cases = {"full": a + p + [40, 41] + b + p, "padded": a + p + [40, 41] + p, "none": a + b + [7],
             "short": [5, 6, 5]}
    for name, seq in cases.items():
        corpus = corpus_cls(max_trie_depth=depth, draft_token_num=d, min_bfs_breadth=1, max_bfs_breadth=10,
                            match_type="BFS", capacity=100000)
        corpus.batch_put([seq])
        corpus.synchronize()
        tokens, mask = corpus.batch_get([name], [seq[-depth:]], [len(seq)])
        hist, rows, seq_lens = history([seq], [2])
        out = run(hist, rows, seq_lens, d, max_n=depth)
        assert out["tokens"].tolist() == tokens.tolist(), (name, tokens.tolist())
        assert out["mask"].tolist() == mask.astype(bool).tolist(), name
        want = sglang_indices(reconstruct, torch.from_numpy(mask).to(torch.bool), seq_lens, d)
        assert all(torch.equal(out[k], v) for k, v in want.items()), name
    corpus = corpus_cls(max_trie_depth=depth, draft_token_num=d, min_bfs_breadth=1, max_bfs_breadth=10,
                        match_type="BFS", capacity=100000)
    corpus.batch_put([cases["padded"]])
    corpus.synchronize()
    tokens, _ = corpus.batch_get(["again"], [cases["padded"][-depth:]], [len(cases["padded"])])
    assert tokens.tolist() == [7, 40, 41, 5, 6, 7, 0, 0]  # the padding rule, from SGLang itself


# --- the history writes -----------------------------------------------------------------------

def test_append_writes_accepted_tokens_after_the_verified_length():
    d = 4
    hist = torch.full((4, 12), -1, dtype=torch.int32)
    rows = torch.tensor([2, 0])
    # request 0: prefill of 5 tokens (the first output token at 5); request 1: decode from seq_len 3,
    # 3 accepted (positions 4, 5, 6); the fourth column is the unused tail of accept_tokens.
    tokens = torch.tensor([[50, 0, 0, 0], [60, 61, 62, 99]], dtype=torch.int32).flatten()
    ndd.append_accepted(hist, rows, tokens, torch.tensor([1, 3], dtype=torch.int32), torch.tensor([5, 6]), d)
    assert hist[2].tolist() == [-1] * 5 + [50] + [-1] * 6
    assert hist[0].tolist() == [-1] * 4 + [60, 61, 62] + [-1] * 5
    ndd.append_accepted(hist, torch.tensor([1]), torch.tensor([7, 8, 9, 10]), torch.tensor([4]), torch.tensor([13]), d)
    assert hist[1].tolist() == [-1] * 10 + [7, 8]  # nothing past the width


def test_write_rows_puts_each_requests_ids_at_their_positions():
    hist = torch.full((5, 3000), -1, dtype=torch.int32)
    seqs = [list(range(1, 2500)), [9], list(range(7, 40))]
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
    offsets = torch.tensor(np.concatenate(([0], np.cumsum([len(s) for s in seqs]))), dtype=torch.int64)
    ndd.write_rows(hist, torch.tensor([4, 0, 2]), flat, offsets)
    for s, r in zip(seqs, (4, 0, 2)):
        assert hist[r, :len(s)].tolist() == s and (hist[r, len(s):] == -1).all()
    assert (hist[[1, 3]] == -1).all()


# --- SGLang's verify prep, recompiled ---------------------------------------------------------

class Worker(types.SimpleNamespace):  # weak-referenceable, as NGRAMWorker is
    pass


@pytest.fixture
def ngram_worker(monkeypatch, reconstruct):
    """SGLang's ngram_worker beside the stand-in sgl_kernel; its tree reconstruction is SGLang's
    Triton one (the CUDA op's contract), cache locs / mamba / the verify input are recorders."""
    from sglang.srt.speculative import ngram_worker as w

    monkeypatch.setattr(ndd.NGRAM_PREPARE_SITE, "_variants", {})
    monkeypatch.setattr(w, "reconstruct_indices_from_tree_mask_func", reconstruct)
    monkeypatch.setattr(w, "assign_extend_cache_locs_func", lambda **kw: torch.zeros(1, dtype=torch.int64))
    monkeypatch.setattr(w, "prepare_mamba_track_for_verify", lambda batch: None)
    monkeypatch.setattr(w, "NgramVerifyInput", lambda **kw: types.SimpleNamespace(**kw))
    yield w
    sys.modules.pop("sglang.srt.speculative.ngram_worker", None)


def make_worker(d, max_bs=8, rows=16, width=4096, max_trie_depth=18, host_draft=None):
    flat = {"draft_tokens": torch.empty(max_bs * d, dtype=torch.int64), "positions": torch.empty(max_bs * d, dtype=torch.int64),
            "tree_mask": torch.empty(max_bs * d * d, dtype=torch.bool)}
    lists = {k: torch.empty((max_bs, d), dtype=torch.int64) for k in ("ri", "rnt", "rns")}
    worker = Worker(
        draft_token_num=d, device="cpu", tree_mask=flat["tree_mask"], max_trie_depth=max_trie_depth,
        ngram_corpus=types.SimpleNamespace(_corpus_token_counts={}),
        req_to_token_pool=types.SimpleNamespace(req_to_token=torch.zeros((rows, width), dtype=torch.int32),
                                                req_generation=torch.zeros(rows, dtype=torch.int64)),
        retrieve_indexes_batch=[lists["ri"][:b] for b in range(max_bs + 1)],
        retrieve_next_token_batch=[lists["rnt"][:b] for b in range(max_bs + 1)],
        retrieve_next_sibling_batch=[lists["rns"][:b] for b in range(max_bs + 1)],
        positions_batch=[flat["positions"][: b * d] for b in range(max_bs + 1)],
        tree_mask_batch=[flat["tree_mask"][: b * d * d] for b in range(max_bs + 1)],
        draft_tokens_batch=[flat["draft_tokens"][: b * d] for b in range(max_bs + 1)],
        _prepare_draft_tokens=host_draft)
    return worker


def decode_batch(w, seqs, rows, grammar=False, greedy=True, mm=()):
    seq_lens = torch.tensor([len(s) - 1 for s in seqs])
    reqs = [types.SimpleNamespace(multimodal_inputs=object() if b in mm else None) for b in range(len(seqs))]
    return types.SimpleNamespace(
        forward_mode=w.ForwardMode.DECODE, reqs=reqs, seq_lens=seq_lens,
        sampling_info=types.SimpleNamespace(is_all_greedy=greedy),
        seq_lens_cpu=seq_lens.clone(), has_grammar=grammar, req_pool_indices=torch.tensor(rows),
        req_pool_indices_cpu=torch.tensor(rows), req_to_token_pool=types.SimpleNamespace(req_to_token=None))


def verify_input(w, fn, worker, batch):
    """The keyword arguments ``fn`` (SGLang's verify prep, stock or recompiled) hands
    ``NgramVerifyInput`` in module ``w``, cloned."""
    seen = []
    w.NgramVerifyInput = lambda **kw: seen.append(kw) or types.SimpleNamespace(**kw)
    fn(worker, batch)
    (kw,) = seen
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def reference_host_draft(seqs, d, max_n):
    """What stock's lookup would return had the trie produced the chain: SGLang's numpy layout."""
    tokens, masks = [], []
    for s in seqs:
        t, m, _ = ref_chain(s, len(s), d, 1, max_n)
        tokens += t
        masks += [int(x) for row in m for x in row]
    return lambda batch: (np.array(tokens, dtype=np.int64), np.array(masks, dtype=np.int64))


def seeded(worker, seqs, rows):
    hist = ndd.history_of(worker)
    for s, r in zip(seqs, rows):
        hist.tokens[r, :len(s)] = torch.tensor(s, dtype=torch.int32)
        hist.ready[r] = True
        hist.generation[r] = worker.req_to_token_pool.req_generation[r].item()
    return hist


@pytest.mark.parametrize("d,bs", [(8, 1), (8, 3), (4, 5), (12, 2)])
def test_recompiled_prepare_hands_verify_stocks_input_for_the_same_chain(ngram_worker, d, bs):
    w = ngram_worker
    rng = random.Random(d * 10 + bs)
    seqs = [[rng.randrange(5) for _ in range(rng.randint(1, 300))] for _ in range(bs)]
    rows = rng.sample(range(16), bs)
    original = w.NGRAMWorker._prepare_for_speculative_decoding
    original = getattr(original, "__wrapped__", original)

    stock_worker = make_worker(d, host_draft=reference_host_draft(seqs, d, 18))
    stock = verify_input(w, original, stock_worker, decode_batch(w, seqs, rows))

    def no_host_draft(batch):
        raise AssertionError("the device path must not draft on the host")

    worker = make_worker(d, host_draft=no_host_draft)
    hist = seeded(worker, seqs, rows)
    batch = decode_batch(w, seqs, rows)
    plugin = verify_input(w, lambda *a: ndd.edited(original)(*a), worker, batch)
    assert set(plugin) == set(stock)
    for key, want in stock.items():
        got = plugin[key]
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), key
        else:
            assert got == want, key
    assert torch.equal(plugin["custom_mask"], nfm.full_mask(plugin_tree(worker, bs, d), batch.seq_lens,
                                                             batch.seq_lens_cpu, d))
    assert batch.forward_mode is w.ForwardMode.TARGET_VERIFY and worker.grammar_tree_host is None
    assert worker._hostsync_device_drafted and hist.drafted == 1 and ndd.PREPARE_ONCE.live()


def plugin_tree(worker, bs, d):
    return worker.tree_mask_batch[bs]


@pytest.mark.parametrize("why", ["grammar", "prompt not written", "external corpus", "no host seq lens",
                                 "sampling", "multimodal", "row reused"])
def test_what_the_device_draft_does_not_take_runs_stocks_host_draft(ngram_worker, monkeypatch, why):
    w = ngram_worker
    d, seqs, rows = 4, [[1, 2, 1, 2, 1], [3, 3]], [5, 1]
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    calls = []
    host = reference_host_draft(seqs, d, 18)
    worker = make_worker(d, host_draft=lambda batch: calls.append(batch) or host(batch))
    hist = seeded(worker, seqs, rows)
    batch = decode_batch(w, seqs, rows, grammar=why == "grammar", greedy=why != "sampling",
                         mm=(1,) if why == "multimodal" else ())
    if why == "row reused":  # row 1 freed and allocated again (another request) since its prompt write
        worker.req_to_token_pool.req_generation[1] += 1
    if why == "prompt not written":
        hist.ready[1] = False
    if why == "external corpus":
        worker.ngram_corpus._corpus_token_counts["c"] = 10
    if why == "no host seq lens":
        batch.seq_lens_cpu = None
        monkeypatch.setattr(w, "_is_cpu", True)  # SGLang's CPU mode: no full mask, stock needs no host lengths
    got = verify_input(w, lambda *a: ndd.edited(original)(*a), worker, batch)
    assert len(calls) == 1 and "_hostsync_device_drafted" not in vars(worker)
    assert hist.stock == {"prompt not written" if why == "row reused" else why: 1} and hist.drafted == 0
    want_tokens, _ = host(batch)
    assert got["draft_token"].tolist() == want_tokens.tolist()


def test_the_server_log_counts_device_drafts_and_each_reason_for_the_host_draft(ngram_worker, caplog):
    """The first device draft and the first batch of each reason to keep SGLang's host draft are logged
    with the counts (a real server's only evidence that the device drafted at all), then no more until
    the 100th draft."""
    w = ngram_worker
    d, seqs, rows = 4, [[1, 2, 1, 2, 1], [3, 3]], [5, 1]
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    worker = make_worker(d, host_draft=reference_host_draft(seqs, d, 18))
    seeded(worker, seqs, rows)
    prepare = ndd.edited(original)
    caplog.clear()  # (the history's allocation line, where another test left the logger at INFO)
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins.hostsync"):
        for grammar in (True, True, False, False):
            verify_input(w, lambda *a: prepare(*a), worker, decode_batch(w, seqs, rows, grammar=grammar))
    lines = [r.getMessage() for r in caplog.records if ndd.NAME in r.getMessage()]
    assert lines == [
        "hostsync: ngram_device_draft: a decode batch keeps SGLang's host draft (grammar); 0 decode steps drafted "
        "on the device; SGLang's host draft: grammar 1",
        "hostsync: ngram_device_draft: 1 decode steps drafted on the device; SGLang's host draft: grammar 2",
    ], lines


def test_update_hook_skips_the_corpus_only_after_a_device_draft():
    calls = []
    worker = Worker(_hostsync_device_drafted=True)
    assert ndd.update_hook(lambda *a: calls.append(a), worker, "batch") is None and calls == []
    assert "_hostsync_device_drafted" not in vars(worker)
    ndd.update_hook(lambda *a: calls.append(a), worker, "batch")
    assert calls == [(worker, "batch")]


def test_forward_hook_leaves_a_device_triton_cannot_launch_on_to_sglang(monkeypatch):
    monkeypatch.setattr(ndd, "_INTERPRET", False)  # a CPU tensor outside the interpreter
    worker = make_worker(4)
    calls = []
    assert ndd.forward_hook(lambda *a, **kw: calls.append((a, kw)) or "result", worker, "batch", on_publish=1) == "result"
    assert calls == [((worker, "batch"), {"on_publish": 1})] and ndd.history(worker) is None


# --- the step: history kept equal to each request's tokens ----------------------------------------

def make_req(rid, ids, row):
    """SGLang's own ``Req`` at an extend of its whole prompt ``ids`` into pool row ``row`` (the slot reads
    the fill ids and ``Req.kv.req_pool_idx``: a stand-in with another layout hid a wrong attribute)."""
    from sglang.srt.managers.schedule_batch import Req as SglangReq
    from sglang.srt.sampling.sampling_params import SamplingParams

    r = SglangReq(rid, "", array("q", ids), SamplingParams(max_new_tokens=1 << 20))
    r.refresh_fill_ids()
    r.extend_end = len(ids)
    r.kv.req_pool_idx = row
    return r


def greedy_accept(truth, seq_len, tokens, next_token, next_sibling, d):
    """SGLang's greedy tree verify over a request's tree (``verify_tree_greedy``): from the root,
    the first child (then its siblings) equal to the target's next token is accepted."""
    cur, depth, accepted = 0, 0, []
    while True:
        want = truth[seq_len + depth + 1]
        accepted.append(want)
        child, seen = next_token[cur], set()
        while child != -1 and tokens[child] != want:
            assert child not in seen and len(seen) < d, "sibling lists must not cycle"
            seen.add(child)
            child = next_sibling[child]
        if child == -1 or depth + 1 >= d:
            return accepted
        cur, depth = child, depth + 1


def test_steps_keep_the_history_equal_to_each_requests_tokens(ngram_worker):
    """Extend (a radix-matched prefix, a two-chunk prefill whose first chunk's sampled token is
    garbage), decode steps verified greedily against each request's true tokens, a request that
    leaves and a new one in its pool row (shorter prompt), and a retracted request re-prefilled
    with its output: before every decode step each row holds its request's tokens on
    [0, seq_len], and the device draft is the reference chain of those tokens."""
    w = ngram_worker
    d, rng = 6, random.Random(3)
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    worker = make_worker(d, host_draft=lambda batch: pytest.fail("host draft"))
    motif = [rng.randrange(1, 50) for _ in range(7)]

    def true_stream(n):
        return (motif * (n // 7 + 2))[:n] if rng.random() < 0.5 else [rng.choice(motif) for _ in range(n)]

    truths = {"a": true_stream(400), "b": true_stream(400), "c": true_stream(400), "e": true_stream(400)}
    state = {}  # rid -> (row, seq_len)
    stats = {"accepted": 0, "steps": 0}

    def extend(reqs, lens, garbage=False):
        batch = types.SimpleNamespace(forward_mode=w.ForwardMode.EXTEND, reqs=reqs,
                                      req_pool_indices=torch.tensor([r.kv.req_pool_idx for r in reqs]),
                                      seq_lens=torch.tensor(lens))

        def forward(self, batch, **kw):  # NGRAM's extend branch: accept_tokens[:, 0] = the sampled token
            first = [-5 if garbage else truths[r.rid][n] for r, n in zip(reqs, lens)]
            acc = torch.zeros(len(reqs), d, dtype=torch.int32)
            acc[:, 0] = torch.tensor(first)
            return types.SimpleNamespace(next_draft_input=types.SimpleNamespace(
                accept_tokens=acc.flatten(), accept_lens=torch.ones(len(reqs), dtype=torch.int32),
                new_seq_lens=batch.seq_lens.clone()))

        ndd.forward_hook(forward, worker, batch)
        for r, n in zip(reqs, lens):
            state[r.rid] = (r.kv.req_pool_idx, n)

    def step(rids):
        before = {r: state[r][1] for r in rids}
        hist = ndd.history(worker)
        rows = [state[r][0] for r in rids]
        seqs = [truths[r][: state[r][1] + 1] for r in rids]
        batch = decode_batch(w, seqs, rows)
        for r, s in zip(rows, seqs):
            assert hist.tokens[r, :len(s)].tolist() == s  # the invariant the draft relies on
        out = {}

        def forward(self, batch, **kw):
            vi = verify_input(w, lambda *a: ndd.edited(original)(*a), self, batch)
            acc = torch.zeros(len(rids), d, dtype=torch.int32)
            lens = []
            for b, rid in enumerate(rids):
                tokens = vi["draft_token"][b * d:(b + 1) * d].tolist()
                assert tokens == ref_chain(seqs[b], len(seqs[b]), d, 1, worker.max_trie_depth)[0]
                got = greedy_accept(truths[rid], before[rid], tokens, vi["retrieve_next_token"][b].tolist(),
                                    vi["retrieve_next_sibling"][b].tolist(), d)
                acc[b, :len(got)] = torch.tensor(got)
                lens.append(len(got))
                stats["accepted"] += len(got) - 1
            stats["steps"] += 1
            out["new"] = torch.tensor([before[r] for r in rids]) + torch.tensor(lens)
            ndd.update_hook(lambda *a: pytest.fail("corpus update after a device draft"), self, batch)
            return types.SimpleNamespace(next_draft_input=types.SimpleNamespace(
                accept_tokens=acc.flatten(), accept_lens=torch.tensor(lens, dtype=torch.int32), new_seq_lens=out["new"]))

        ndd.forward_hook(forward, worker, batch)
        for rid, n in zip(rids, out["new"].tolist()):
            state[rid] = (state[rid][0], n)

    extend([make_req("a", truths["a"][:30], 3), make_req("b", truths["b"][:12], 7)], [30, 12])
    for _ in range(4):
        step(["a", "b"])
    # "c": a two-chunk prefill; the first chunk's sampled token (-5) lands where the second writes.
    extend([make_req("c", truths["c"][:20], 9)], [20], garbage=True)
    extend([make_req("c", truths["c"][:45], 9)], [45])
    for _ in range(4):
        step(["a", "b", "c"])
    # "b" leaves (abort or finish); "e" takes its row with a shorter prompt than b's history.
    extend([make_req("e", truths["e"][:5], 7)], [5])
    for _ in range(4):
        step(["e", "a", "c"])
    # "a" retracted and re-prefilled with its prompt and output, in another row.
    n = state["a"][1]
    extend([make_req("a", truths["a"][:n], 11)], [n])
    for _ in range(3):
        step(["c", "a", "e"])
    hist = ndd.history(worker)
    assert hist.drafted == stats["steps"] == 15 and hist.prompts == 5 and hist.stock == {}
    assert stats["accepted"] > stats["steps"]  # repeated motifs: the drafts are taken


# --- pins, rules ------------------------------------------------------------------------------

def test_targets_and_edits_match_the_installed_sglang():
    from sglang_hostsync_plugin import checks

    assert ndd.SLOT.precheck() is None and ndd.PREPARE_ONCE.check() is None
    for target in ndd.SLOT.targets:
        assert checks.check_target(target) is None, target.path


def test_registered_and_opt_in():
    """In the catalogue since its GPU tests and the copying-workload e2e passed (2026-12-07-h100-b), in no
    preset and not in ``default``. It shares the verify prep with ngram_full_mask as parts of one edit site."""
    from sglang_hostsync_plugin import choice, config, registry

    cat = registry.catalogue()
    assert cat[ndd.NAME] is ndd.SLOT and ndd.NAME not in config.parse_slot_spec("default", cat).names
    assert ndd.NAME not in choice.row_names(cat, config.parse_slot_spec)
    assert not ndd.SLOT.default and not ndd.SLOT.presets
    assert set(ndd.SLOT.conflicts) == {"ngram_late_wait"} and ndd.SLOT.requires == ("ngram_full_mask",)
    assert ndd.PREPARE_ONCE.site is nfm.PREPARE_ONCE.site and set(ndd.WITH_FULL_MASK) <= set(nfm.PREPARE_ONCE.site.parts)
    assert ndd.PREPARE_ONCE.site.check() is None  # both parts apply together to the installed source
    assert ndd.SLOT.inert(ServingFacts(speculative_algorithm="NGRAM")) is None
    assert "EAGLE" in ndd.SLOT.inert(ServingFacts(speculative_algorithm="EAGLE", topk=4))
    assert ndd.SLOT.inert(ServingFacts(speculative_algorithm=None)) is not None


def test_a_reused_row_is_not_ready_until_its_new_owners_prompt_is_written():
    """History.ready is cleared for a row allocated again since its prompt write (a request freed,
    the pool cleared: ReqToTokenPool bumps req_generation at every allocation, monotonic across
    clear), and set again by the new owner's prompt write."""
    worker = make_worker(4)
    pool = worker.req_to_token_pool
    hist = ndd.history_of(worker)
    batch = types.SimpleNamespace(reqs=[make_req("a", [1, 2, 3], 2), make_req("b", [4, 5], 5)],
                                  req_pool_indices=torch.tensor([2, 5]))
    ndd.write_prompts(hist, batch, pool)
    ndd.clear_stale(hist, pool, [2, 5])
    assert hist.ready[[2, 5]].tolist() == [True, True]
    pool.req_generation[5] += 1  # "b" freed, row 5 handed to another request (PD transfer: no prefill here)
    ndd.clear_stale(hist, pool, [2, 5])
    assert hist.ready[[2, 5]].tolist() == [True, False]
    ndd.write_prompts(hist, types.SimpleNamespace(reqs=[make_req("c", [7], 5)], req_pool_indices=torch.tensor([5])), pool)
    ndd.clear_stale(hist, pool, [2, 5])
    assert hist.ready[[2, 5]].tolist() == [True, True]


def test_conflicts_with_ngram_late_wait_for_its_deferred_wait():
    """late_wait takes step N-1's wait inside _prepare_draft_tokens, which the device path skips:
    the full mask would be sized from unfilled seq_lens_cpu. Selecting both must be refused."""
    assert "ngram_late_wait" in ndd.SLOT.conflicts
    assert "_prepare_draft_tokens" in ndd.CONFLICTS["ngram_late_wait"]
    assert set(ndd.CONFLICTS) == set(ndd.SLOT.conflicts)


def test_claims_keep_the_per_step_wait_and_numerics_caveat():
    """The slot removes the per-step wait (resolve_seq_lens_cpu) on triton only, says FlashInfer keeps
    it, and cites the real-server run that measured it."""
    from pathlib import Path

    doc = " ".join((Path(__file__).parents[1] / "docs" / "ngram-device-draft.md").read_text().split())
    module = " ".join(ndd.__doc__.split())
    for text in (module, ndd.SLOT.summary):
        assert "no host read of step N-1" not in text
    assert "resolve_seq_lens_cpu" in module and "FlashInfer keeps it" in ndd.SLOT.summary
    assert "FlashInfer keeps that wait" in module and "benchmarks/results/2026-12-07-h100-b/" in module
    for text in (module, doc):
        assert "up to verify numerics" in text and "e2e token comparison is the gate" in text
    assert "only fails to match" not in doc and "No host value of step N-1" not in doc


def test_the_decide_hook_lets_the_backends_answer_for_ngram(monkeypatch):
    """SGLang forces host lengths for NGRAM (its full mask's size); with the device draft the mask is
    sized from the allocation, so an all-triton NGRAM server publishes none (no per-step seq-lens wait),
    while another backend, two-batch overlap, pipeline parallelism or forward-pass metrics (which read
    them for NGRAM batches) keep SGLang's answer."""
    from sglang.srt import runtime_context
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.managers import overlap_utils

    on = {"tbo": False, "pp": 1, "fpm": False}
    monkeypatch.setattr(overlap_utils, "get_exec", lambda: types.SimpleNamespace(
        overlap=types.SimpleNamespace(enable_two_batch_overlap=on["tbo"])))
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: types.SimpleNamespace(pp_size=on["pp"]))
    monkeypatch.setattr(runtime_context, "get_observability", lambda: types.SimpleNamespace(
        enable_forward_pass_metrics=on["fpm"]))
    triton = TritonAttnBackend.__new__(TritonAttnBackend)  # its class declares needs_cpu_seq_lens False
    other = types.SimpleNamespace(needs_cpu_seq_lens=False)  # another backend that opts out (fa3, ...)
    ngram = lambda backends: True  # SGLang's answer for NGRAM  # noqa: E731
    assert not triton.needs_cpu_seq_lens
    assert ndd.decide_hook(ngram, [triton, None, triton]) is False
    assert ndd.decide_hook(ngram, [triton, other]) is True
    assert ndd.decide_hook(ngram, [None]) is True
    assert ndd.decide_hook(lambda b: False, [types.SimpleNamespace(needs_cpu_seq_lens=True)]) is False  # adds none
    for key, value in (("tbo", True), ("pp", 2), ("fpm", True)):
        on[key] = value
        assert ndd.decide_hook(ngram, [triton]) is True, key
        on[key] = {"tbo": False, "pp": 1, "fpm": False}[key]
    # The rule it restates is SGLang's (pinned): TBO forced, NGRAM forced, else the OR over the backends.
    from sglang_hostsync_plugin.checks import source_sha

    assert source_sha(overlap_utils.decide_needs_cpu_seq_lens) == ndd.DECIDE_SHA
    assert any(t.path == ndd.DECIDE and t.source_sha == ndd.DECIDE_SHA for t in ndd.SLOT.targets)


def test_the_device_draft_takes_a_batch_without_host_lengths_where_the_allocation_sizes_the_mask(
        ngram_worker):
    w = ngram_worker
    original = getattr(w.NGRAMWorker._prepare_for_speculative_decoding, "__wrapped__",
                       w.NGRAMWorker._prepare_for_speculative_decoding)
    d, seqs, rows = 4, [[1, 2, 1, 2, 1, 2], [3, 3, 4]], [5, 1]
    stock = verify_input(w, original, make_worker(d, host_draft=reference_host_draft(seqs, d, 18)),
                         decode_batch(w, seqs, rows))
    worker = make_worker(d, host_draft=lambda b: pytest.fail("host draft"))
    hist = seeded(worker, seqs, rows)
    batch = decode_batch(w, seqs, rows)
    batch.seq_lens_cpu = None
    for req, s in zip(batch.reqs, seqs):
        req.kv = types.SimpleNamespace(kv_allocated_len=len(s) - 1 + 2 * d)
    batch.req_to_token_pool = types.SimpleNamespace(req_to_token=torch.zeros((16, 4096)))
    plugin = verify_input(w, lambda *a: ndd.edited(original)(*a), worker, batch)
    assert hist.drafted == 1 and batch.seq_lens_cpu is None
    for key, want in stock.items():
        if key == "custom_mask":
            assert torch.equal(plugin[key][: want.numel()], want) and plugin[key].numel() > want.numel()
        elif isinstance(want, torch.Tensor):
            assert torch.equal(plugin[key], want), key


def test_a_history_too_large_for_the_free_memory_is_not_made_and_the_host_draft_stays(monkeypatch, caplog):
    """The history sits outside --mem-fraction-static: it is logged, and where it would take more than
    HISTORY_SHARE of the free device memory it is not made (once, said at warning level), every forward
    runs SGLang's own step and every decode batch keeps the host draft ("no device history")."""
    worker = make_worker(4, rows=16, width=4096)
    cells = 16 * (4096 + 4 + 1)
    monkeypatch.setattr(ndd, "_free_bytes", lambda device: int(cells * 4 / ndd.HISTORY_SHARE) - 1)
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins.hostsync"):
        assert ndd.history_of(worker) is None and ndd.history_of(worker) is None
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "16 x 4101 int32" in caplog.text
    calls = []
    batch = types.SimpleNamespace(reqs=[object()], forward_mode=types.SimpleNamespace(is_extend=lambda: True))
    assert ndd.forward_hook(lambda *a, **k: calls.append(a) or "stock", worker, batch) == "stock" and calls
    assert ndd.stock_reason(worker, batch) == "no device history"
    # With room for it: made once, logged.
    caplog.clear()
    worker = make_worker(4, rows=16, width=4096)
    monkeypatch.setattr(ndd, "_free_bytes", lambda device: int(cells * 4 / ndd.HISTORY_SHARE) + 8)
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins.hostsync"):
        hist = ndd.history_of(worker)
    assert hist is not None and ndd.history_of(worker) is hist and tuple(hist.tokens.shape) == (16, 4101)
    assert [r.levelname for r in caplog.records] == ["INFO"] and "0.3 MiB outside" in caplog.text


def test_the_pins_hold_and_name_a_changed_layout_source(monkeypatch):
    """The chain restates how SGLang derives verify indices from a tree mask: the Triton kernel (XPU) and
    the CUDA kernel that servers run (``ngram.cuh``, a package file); a change to either refuses the slot."""
    assert ndd.check_pins() is None
    monkeypatch.setattr(ndd, "RECONSTRUCT_CUDA", (ndd.RECONSTRUCT_CUDA[0], "0" * 16))
    assert "ngram.cuh sha" in ndd.check_pins() and "expected 0000000000000000" in ndd.check_pins()
    monkeypatch.setattr(ndd, "RECONSTRUCT_CUDA", ("sglang/kernels/jit/include/none.cuh", "0" * 16))
    assert ndd.check_pins().startswith("target missing: sglang/kernels/jit/include/none.cuh")
