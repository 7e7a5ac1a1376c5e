"""Slot ``draft_decode_glue_graph`` on the CPU.

- The glue contract, on SGLang's real triton multi-step draft prep
  (``TritonMultiStepDraftBackend.init_forward_metadata_out_graph`` -> ``common_template`` ->
  ``generate_draft_decode_kv_indices`` and ``get_num_kv_splits``) fed the slot's static view:
  every tensor its kernels and ops touch is one of the runner's static buffers, the backend's
  graph buffers or ``req_to_token``; it reads no host value; and its launches (with every
  scalar) are the same for any batch contents of one batch size. Fed the batch's own tensors
  (stock's call) the contract fails, which is why the view exists.
- The route: which calls go to the glue and which stay eager, and the eager check counting a
  mismatch. The graph capture itself needs CUDA (``test_gpu_draft_decode_glue.py``).
"""

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from sglang.srt.layers.attention import triton_backend as tb
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import draft_decode_glue_graph as glue_mod
from test_draft_extend_glue_graph import Trace, _translator

TOPK, STEPS, MAX_BS, ROWS, WIDTH, CTX = 4, 3, 8, 16, 640, 600


def _leaf(device, splits):
    b = object.__new__(tb.TritonAttnBackend)
    b.__dict__.update(static_kv_splits=False, device_core_count=132, enable_deterministic=False, max_kv_splits=16,
                      split_tile_size=None, num_head=32, num_kv_head=8, cuda_graph_num_kv_splits=splits,
                      use_sliding_window_kv_pool=False)
    return b


def _backend(device="cpu", req_to_token=None, topk=TOPK, **over):
    """A TritonMultiStepDraftBackend with the fields its cuda-graph prep reads (as __init__ and
    init_cuda_graph_state size them)."""
    if req_to_token is None:
        req_to_token = torch.randint(1, 1 << 20, (ROWS, WIDTH), dtype=torch.int32, device=device)
    splits = torch.full((MAX_BS * topk,), 16, dtype=torch.int32, device=device)
    b = object.__new__(tb.TritonMultiStepDraftBackend)
    b.__dict__.update(
        topk=topk, speculative_num_steps=STEPS, max_context_len=CTX, device=device, page_size=1,
        draft_window_size=0, draft_sink_size=0, window_rail=False, cuda_graph_window_kv_indices=None,
        kv_indptr=torch.zeros((STEPS, MAX_BS * topk + 1), dtype=torch.int32, device=device),
        cuda_graph_kv_indices=torch.zeros((STEPS, MAX_BS * topk * CTX), dtype=torch.int64, device=device),
        kv_index_translator=_translator(req_to_token),
        attn_backends=[_leaf(device, splits) for _ in range(STEPS - 1)])
    b.__dict__.update(over)
    return b


class Runner:
    """EAGLEDraftCudaGraphRunner as the route sees it: its static buffers, and the batch whose
    values execute() copies into them before the prep."""

    def __init__(self, backend, device="cpu", topk=TOPK):
        self.draft_attn_backend, self.device, self.topk = backend, device, topk
        self.buffers = SimpleNamespace(
            seq_lens=torch.ones(MAX_BS, dtype=torch.int64, device=device),
            req_pool_indices=torch.zeros(MAX_BS, dtype=torch.int64, device=device),
            positions=torch.zeros(MAX_BS * topk, dtype=torch.int64, device=device))

    def batch(self, rng, bs, padding=0):
        """A fresh batch (new tensors, as every step), copied into the buffers as execute does;
        the SimpleNamespace execute hands the backend."""
        seq_lens = torch.randint(8, CTX - 2 * STEPS, (bs,), generator=rng).to(self.device)
        rows = torch.randperm(ROWS, generator=rng)[:bs].to(self.device)
        positions = seq_lens.repeat_interleave(self.topk)
        b = self.buffers
        b.seq_lens[:bs].copy_(seq_lens)
        b.req_pool_indices[:bs].copy_(rows)
        b.positions[: bs * self.topk].copy_(positions)
        return SimpleNamespace(batch_size=bs, seq_lens=seq_lens, req_pool_indices=rows, positions=positions,
                               seq_lens_sum=int(seq_lens.sum()), kv_loc_plan=None, spec_info=SimpleNamespace(),
                               num_padding=padding)


def _want(backend, runner, bs):
    """Each draft step's KV indices as SGLang's kernel lays them out (page 1): per request and
    branch, the prefix rows then the branch's first ``step + 1`` draft slots."""
    rt = backend.kv_index_translator.req_to_token
    lens = runner.buffers.seq_lens[:bs].tolist()
    rows = runner.buffers.req_pool_indices[:bs].tolist()
    out = []
    for step in range(STEPS):
        parts = []
        for r, n in zip(rows, lens):
            for k in range(backend.topk):
                parts += [rt[r, :n], rt[r, n + k * STEPS: n + k * STEPS + step + 1]]
        out.append(torch.cat(parts).to(torch.int64))
    return out


class Launches:
    """SGLang's two Triton kernels in ``triton_backend``, recorded with their arguments
    classified by ``trace`` (tensor -> buffer name, scalar -> value); they still run."""

    def __init__(self, monkeypatch, trace):
        self.calls, self.trace = [], trace
        for name in ("generate_draft_decode_kv_indices", "get_num_kv_splits_triton"):
            monkeypatch.setattr(tb, name, self._wrap(name, getattr(tb, name)))

    def _wrap(self, name, kernel):
        launches = self

        class Recorded:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches.calls.append((name, grid, launches.trace._arg(args),
                                           {k: launches.trace._arg(v) for k, v in kwargs.items()}))
                    with _disable_current_modes():
                        return kernel[grid](*args, **kwargs)
                return launch

        return Recorded()


def _traced_prep(monkeypatch, backend, runner, fb):
    static = dict(kv_indptr=backend.kv_indptr, kv_indices=backend.cuda_graph_kv_indices,
                  num_kv_splits=backend.attn_backends[-1].cuda_graph_num_kv_splits,
                  seq_lens=runner.buffers.seq_lens, req_pool_indices=runner.buffers.req_pool_indices,
                  positions=runner.buffers.positions, req_to_token=backend.kv_index_translator.req_to_token)
    trace = Trace(static)
    launches = Launches(monkeypatch, trace)
    with trace:
        tb.TritonMultiStepDraftBackend.init_forward_metadata_out_graph(backend, fb)
    monkeypatch.undo()
    return trace.ops, launches.calls


def test_sglangs_triton_draft_prep_on_the_static_view_meets_the_glue_contract(monkeypatch):
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(16)
    for bs in (1, 3, 8):
        first = None
        for _ in range(3):
            fb = runner.batch(rng, bs)
            ops, calls = _traced_prep(monkeypatch, backend, runner, glue_mod.static_view(runner, fb))
            flat = repr((ops, calls))
            assert "FOREIGN" not in flat, flat
            assert not any(op.startswith(("aten._local_scalar_dense", "aten.item")) for op, _, _ in ops)
            assert [c[0] for c in calls] == ["generate_draft_decode_kv_indices", "get_num_kv_splits_triton"]
            if first is None:
                first = (ops, calls)
            assert (ops, calls) == first  # the same launches, scalars and buffers for any contents
            # ...and the prep computed this batch's layout (what the graph must reproduce).
            want, num = _want(backend, runner, bs), bs * TOPK
            for step in range(STEPS):
                end = int(backend.kv_indptr[step, num])
                assert torch.equal(backend.cuda_graph_kv_indices[step, :end], want[step]), (bs, step)


def test_stocks_own_call_reads_the_batchs_tensors(monkeypatch):
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(4)
    _, calls = _traced_prep(monkeypatch, backend, runner, runner.batch(rng, 2))
    assert "FOREIGN" in repr(calls)  # a graph captured from this call would read a stale step's batch


def test_the_contract_functions_are_pinned():
    from sglang_hostsync_plugin.checks import check_slot

    assert glue_mod.pinned_sources() is None and check_slot(glue_mod.SLOT) is None


# --- the route -------------------------------------------------------------------

class FakeGlue:
    """SGLang's MetadataGlueGraph as the route sees it: run() calls the leaf's prep (its warm-ups
    and capture do) and counts the key as captured; replay() re-runs the prep on the view of the
    capture, as a graph would replay it on the same addresses (the runner's static buffers)."""

    def __init__(self, backend, corrupt=False):
        self.disabled, self.runs, self.replays, self.captured, self.corrupt = False, [], 0, {}, corrupt
        self.views = []

    def is_captured(self, key):
        return key in self.captured

    def run(self, leaf, fb, key):
        assert leaf.attn_backend_list is None and leaf.forward_metadata is None  # what the glue snapshots
        assert key not in self.captured  # a captured key goes to replay()
        self.runs.append(key)
        self.views.append(fb)
        leaf.init_forward_metadata_out_graph(fb)
        self.captured[key] = (leaf, fb)

    def replay(self, key):
        leaf, fb = self.captured[key]
        leaf.init_forward_metadata_out_graph(fb)
        self.replays += 1
        if self.corrupt:
            leaf.backend.kv_indptr[0, 1] += 1  # a frozen replay would leave a stale layout


@pytest.fixture
def routed(monkeypatch):
    r = glue_mod.DraftGlueRoute(new_glue=FakeGlue)
    monkeypatch.setattr(glue_mod, "_route", r)
    original = tb.TritonMultiStepDraftBackend.init_forward_metadata_out_graph
    calls = []

    def eager(self, fb, in_capture=False):
        calls.append((fb.batch_size, in_capture))
        return original(self, fb, in_capture)

    return r, calls, (lambda backend, fb, in_capture=False: glue_mod.prep_hook(eager, backend, fb, in_capture))


def _in_execute(runner, fn):
    return glue_mod.execute_hook(lambda self, fb: fn(), runner, None)


def test_unpadded_replays_inside_execute_go_to_the_glue_with_the_static_view(routed):
    r, calls, hooked = routed
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(1)
    fb = runner.batch(rng, 3)
    _in_execute(runner, lambda: hooked(backend, fb))
    glue = r.glues[backend]
    assert glue.runs == [(3,)] and calls == [(3, False)] and (r.glued, r.eager) == (1, 0)
    view = glue.views[0]
    assert view.seq_lens.data_ptr() == runner.buffers.seq_lens.data_ptr()
    assert view.req_pool_indices.data_ptr() == runner.buffers.req_pool_indices.data_ptr()
    assert view.positions.data_ptr() == runner.buffers.positions.data_ptr()
    assert view.seq_lens.shape[0] == 3 and view.positions.shape[0] == 3 * TOPK
    assert r.runner is None and not r.inside  # the execute scope is closed


@pytest.mark.parametrize("case", ["outside", "capture", "other_backend", "padded", "translated", "window_rail",
                                  "swa_pool", "disabled"])
def test_everything_else_stays_eager(routed, case):
    r, _, _ = routed
    over = {"translated": dict(kv_index_translator=SimpleNamespace(reads_are_translated=True)),
            "window_rail": dict(window_rail=True)}.get(case, {})
    backend = _backend(**over)
    if case == "swa_pool":
        backend.attn_backends[0].use_sliding_window_kv_pool = True
    runner, rng = Runner(_backend() if case == "other_backend" else backend), torch.Generator().manual_seed(2)
    fb = runner.batch(rng, 4, padding=1 if case == "padded" else 0)
    if case == "disabled":
        r.glue_for(backend).disabled = True
    seen = []
    original = lambda self, fb, in_capture=False: seen.append((fb, in_capture))  # noqa: E731
    call = lambda: glue_mod.prep_hook(original, backend, fb, case == "capture")  # noqa: E731
    call() if case == "outside" else _in_execute(runner, call)
    assert seen == [(fb, case == "capture")] and r.glued == 0  # SGLang's prep on the batch's own view
    assert not r.glues.get(backend) or not r.glues[backend].runs
    assert r.eager == int(case in ("padded", "translated", "window_rail", "swa_pool", "disabled"))


def test_a_captured_key_replays_the_capture_and_lays_out_each_new_batch(routed):
    r, calls, hooked = routed
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(6)
    for _ in range(3):
        fb = runner.batch(rng, 3)
        _in_execute(runner, lambda: hooked(backend, fb))
        want = _want(backend, runner, 3)
        for step in range(STEPS):
            assert torch.equal(backend.cuda_graph_kv_indices[step, : want[step].numel()], want[step])
    glue = r.glues[backend]
    assert glue.runs == [(3,)] and glue.replays == 2 and r.glued == 3 and r.eager == 0


def test_the_eager_check_counts_a_glue_that_replays_a_stale_layout(routed, caplog):
    r, _, hooked = routed
    r.check = 1
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(3)
    for _ in range(4):
        fb = runner.batch(rng, 2)
        _in_execute(runner, lambda: hooked(backend, fb))
    assert r.checks == 3 and r.mismatches == 0  # checked from the first replay after capture
    r.glues[backend].corrupt = True
    fb = runner.batch(rng, 2)
    _in_execute(runner, lambda: hooked(backend, fb))
    assert r.checks == 4 and r.mismatches == 1
    lines = [m.getMessage() for m in caplog.records if " check: " in m.getMessage()]
    assert lines and lines[-1].startswith("hostsync: draft_decode_glue_graph check: 4 checks, 1 mismatches")
    # The check's own eager prep left SGLang's layout in the buffers.
    want = _want(backend, runner, 2)
    assert torch.equal(backend.cuda_graph_kv_indices[0, : want[0].numel()], want[0])


# Each output the check compares, and one entry of it inside the compared range: the last draft
# step's rows (every step is compared), not the indptr's end (bs 2, topk 4: column 8).
COMPARED = {
    "kv_indptr": lambda b: b.kv_indptr[STEPS - 1, 1:2],
    "num_kv_splits": lambda b: b.attn_backends[-1].cuda_graph_num_kv_splits[:1],
    "kv_indices": lambda b: b.cuda_graph_kv_indices[STEPS - 1, :1],
}


def test_the_check_compares_one_output_per_compared_field():
    """An output added to the check needs its entry in COMPARED, and so its own test below."""
    assert len(glue_mod._outputs(_backend(), 2)) == len(COMPARED)


@pytest.mark.parametrize("field", COMPARED)
def test_the_eager_check_counts_a_stale_entry_in_each_compared_output(routed, field):
    """A replay that differs from the eager prep in one output only is counted."""
    r, _, hooked = routed
    r.check = 1
    backend = _backend()
    runner, rng = Runner(backend), torch.Generator().manual_seed(5)
    for _ in range(3):
        fb = runner.batch(rng, 2)
        _in_execute(runner, lambda: hooked(backend, fb))
    assert r.checks == 2 and r.mismatches == 0
    glue = r.glues[backend]
    replay = glue.replay

    def stale_replay(key):
        replay(key)
        COMPARED[field](backend).add_(1)

    glue.replay = stale_replay
    fb = runner.batch(rng, 2)
    _in_execute(runner, lambda: hooked(backend, fb))
    assert r.checks == 3 and r.mismatches == 1


@pytest.mark.parametrize("f, reason", [
    (ServingFacts("STANDALONE", topk=4, page_size=16, attention_backends=("triton", "triton")), None),
    (ServingFacts("EAGLE", attention_backends=(None, None)), None),
    (ServingFacts("EAGLE", attention_backends=("flashinfer", "flashinfer")), "not triton"),
    (ServingFacts("NGRAM", attention_backends=("triton", "triton")), "multi-step draft"),
    (ServingFacts("EAGLE", attention_backends=("triton", "triton"), disable_cuda_graph=True), "disable-cuda-graph"),
    (ServingFacts("EAGLE", attention_backends=("triton", "triton"), two_batch_overlap=True), "two-batch overlap"),
])
def test_inert_rules(f, reason):
    got = glue_mod.SLOT.inert(f)
    assert (got is None) if reason is None else (reason in got), got
