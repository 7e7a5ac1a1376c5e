"""draft_extend_topk_graph on a CUDA device: the replayed softmax + top-k is bit-identical to
SGLang's eager ``fast_topk(renorm_draft_probs(...))`` on the draft-extend graph's static logits over
random steps (batch sizes, topk, dtypes, rows of ties, -inf and NaN rows), the capture and the
replays make no host sync, and each call returns fresh tensors.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import random

import pytest
import torch

from sglang_hostsync_plugin.slots import draft_extend_topk_graph as tg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
VOCAB = 128256


def _bits(t):
    """The raw bits of a float tensor (NaN rows compare equal when their bits are), else ``t``."""
    if not t.is_floating_point():
        return t
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _fill(buf, rng, gen):
    buf.copy_(torch.randn(buf.shape, generator=gen, device="cuda", dtype=torch.float32) * rng.choice([1.0, 4.0]))
    kind = rng.random()
    if kind < 0.3:  # many ties: coarse values
        buf.copy_((buf * 2).round() / 2)
    elif kind < 0.4:  # a row all equal
        buf[rng.randrange(buf.shape[0])] = 1.0
    elif kind < 0.45:
        buf[rng.randrange(buf.shape[0])] = float("-inf")
    elif kind < 0.5:
        buf[rng.randrange(buf.shape[0]), rng.randrange(buf.shape[1])] = float("nan")


@pytest.fixture
def graphs(monkeypatch):
    g = tg.TopkGraphs(limit=1000)  # every view of the random steps gets its graph
    monkeypatch.setattr(tg, "GRAPHS", g)
    return g


def test_bit_identical_to_stock_on_random_steps(graphs):
    rng = random.Random(7)
    gen = torch.Generator(device="cuda").manual_seed(7)
    static = {}  # the draft-extend graph's output buffer per (bucket, dtype)
    steps = 0
    for _ in range(40):  # 40 random views, each over 4 steps of new logits: a capture, then replays
        bucket = rng.choice([1, 2, 4, 8, 16, 32])
        bs = rng.randint(1, bucket)
        dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16])
        topk = rng.choice([4, 4, 8, 2])
        buf = static.setdefault((bucket, dtype), torch.empty(bucket, VOCAB, device="cuda", dtype=dtype))
        view = buf[:bs]
        for _ in range(4):
            _fill(buf, rng, gen)
            got = tg.draft_topk(view, None, False, topk, True)
            want = tg.stock_topk(view, None, False, topk)
            torch.cuda.synchronize()
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(_bits(g), _bits(w)), (bucket, bs, dtype, topk)
            steps += 1
    assert not graphs.disabled and graphs.replays + len(graphs.entries) == steps and graphs.replays >= steps * 3 // 4
    print(f"draft_extend_topk_graph: {steps} steps bit-identical to stock, {len(graphs.entries)} graphs captured, "
          f"{graphs.replays} steps replayed")


def test_capture_and_replay_make_no_host_sync(graphs):
    buf = torch.randn(4, VOCAB, device="cuda")
    tg.stock_topk(buf, None, False, 4)  # load torch's kernels outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        first = tg.draft_topk(buf, None, False, 4, True)  # eager + capture
        outs = [tg.draft_topk(buf, None, False, 4, True) for _ in range(5)]  # replays
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    (entry,) = graphs.entries.values()
    assert graphs.replays == 5
    assert len({o[0].data_ptr() for o in [first, *outs]} | {entry[1].data_ptr()}) == 7  # fresh each call
    for o in outs:
        assert torch.equal(o[1], first[1]) and torch.equal(_bits(o[0]), _bits(first[0]))


def test_a_replay_reads_the_buffer_as_it_is_at_replay_time(graphs):
    """The graph reads the static logits when it runs: a step's new logits, written by the stream
    right before (as the draft-extend replay does), are what it ranks."""
    buf = torch.zeros(2, VOCAB, device="cuda")
    tg.draft_topk(buf, None, False, 4, True)  # capture
    for hot in (5, 70000, 128255):
        torch.cuda._sleep(1_000_000)  # the write lands after the host queued the replay
        buf.zero_()
        buf[:, hot] = 10.0
        p, i = tg.draft_topk(buf, None, False, 4, True)
        assert i[:, 0].tolist() == [hot, hot]
