"""Slot ``draft_extend_glue_graph`` on the CPU.

- The glue contract, on SGLang's real triton draft-extend prep
  (``TritonAttnBackend.init_forward_metadata_out_graph`` -> ``_update_draft_extend_buffers``
  -> the real KV-index gather): every tensor it reads is one of the runner's static
  buffers, the backend's graph buffers, ``req_to_token`` or a temporary of the prep
  itself; it reads no host value; and its op sequence (with every scalar argument) is
  the same for any batch contents of one batch size. That is what a captured graph
  replays.
- The route: which calls go to the glue and which stay eager, the glue's own nested
  call passing through, and the eager check counting a mismatch.
The graph capture itself needs CUDA; the real-server check is ``SGLANG_HOSTSYNC_GLUE_CHECK``.
"""

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from sglang.srt.layers.attention import triton_backend as tb
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import draft_extend_glue_graph as glue_mod

NDT, MAX_BS, ROWS, WIDTH = 8, 8, 16, 700


def _translator(req_to_token):
    """SGLang's translator for a plain pool (no virtual ids): reads pass through req_to_token."""
    tr = object.__new__(KVIndexTranslator)
    tr.__dict__.update(req_to_token=req_to_token, page_size=1, device=str(req_to_token.device), _spaces={},
                       is_translating=False)
    return tr


def _backend(device="cpu", req_to_token=None, **over):
    """A TritonAttnBackend with the fields its cuda-graph draft-extend prep uses (as
    __init__ sizes them for the captured batch sizes)."""
    if req_to_token is None:
        req_to_token = torch.randint(1, 1 << 20, (ROWS, WIDTH), dtype=torch.int32, device=device)
    b = object.__new__(tb.TritonAttnBackend)
    b.__dict__.update(
        num_draft_tokens=NDT, speculative_num_steps=3, device=device, sliding_window_size=None, max_context_len=WIDTH,
        use_sliding_window_kv_pool=False,
        qo_indptr=torch.zeros(MAX_BS + 1, dtype=torch.int32, device=device),
        kv_indptr=torch.zeros(MAX_BS + 1, dtype=torch.int32, device=device),
        cuda_graph_kv_indices=torch.zeros(MAX_BS * WIDTH, dtype=torch.int32, device=device),
        kv_index_translator=_translator(req_to_token))
    b.__dict__.update(over)
    return b


class Runner:
    """The draft-extend runner's static buffers, and the replay view execute() builds over them."""

    def __init__(self, device="cpu"):
        self.seq_lens = torch.ones(MAX_BS, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(MAX_BS, dtype=torch.int64, device=device)
        self.extend_seq_lens = torch.full((MAX_BS,), NDT, dtype=torch.int32, device=device)

    def view(self, rng, bs, raw_bs=None, mode=ForwardMode.DRAFT_EXTEND_V2):
        raw_bs = bs if raw_bs is None else raw_bs
        self.seq_lens[:bs] = torch.randint(NDT + 1, WIDTH - NDT, (bs,), generator=rng)
        self.req_pool_indices[:bs] = torch.randperm(ROWS, generator=rng)[:bs]
        spec = SimpleNamespace(extend_seq_lens_tensor=self.extend_seq_lens[:bs])  # a new view each replay
        return SimpleNamespace(batch_size=bs, forward_mode=mode, input_ids=torch.zeros(raw_bs * NDT),
                               req_pool_indices=self.req_pool_indices, seq_lens=self.seq_lens,
                               spec_info=spec, kv_loc_plan=None, out_cache_loc=None)


class Trace(TorchDispatchMode):
    """Each aten op with its arguments classified: a named static buffer, a temporary
    made earlier in the same prep, a scalar (by value), or FOREIGN."""

    def __init__(self, static: dict):
        super().__init__()
        self.static = {t.untyped_storage().data_ptr(): name for name, t in static.items()}
        self.temps: dict[int, str] = {}
        self.made = 0
        self.ops: list = []

    def _arg(self, a):
        if isinstance(a, torch.Tensor):
            ptr = a.untyped_storage().data_ptr()
            return self.static.get(ptr) or self.temps.get(ptr) or f"FOREIGN@{ptr}"
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return repr(a)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append((str(func), self._arg(args), {k: self._arg(v) for k, v in kwargs.items()}))
        out = func(*args, **kwargs)
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self.static:  # named by creation order: the allocator reuses addresses
                    self.made += 1
                    self.temps[ptr] = f"temp{self.made}"
        return out


def _traced_prep(backend, runner, fb):
    static = dict(qo_indptr=backend.qo_indptr, kv_indptr=backend.kv_indptr, kv_indices=backend.cuda_graph_kv_indices,
                  seq_lens=runner.seq_lens, req_pool_indices=runner.req_pool_indices,
                  extend_seq_lens=runner.extend_seq_lens, req_to_token=backend.kv_index_translator.req_to_token)
    trace = Trace(static)
    real = backend.kv_index_translator.pack_read_stream
    gathers = []

    def pack_read_stream(plan, **kw):  # the gather kernel's tensors, classified; it runs unrecorded
        gathers.append({k: trace._arg(v) for k, v in kw.items()})
        with _disable_current_modes():
            return real(plan, **kw)

    backend.kv_index_translator.pack_read_stream = pack_read_stream
    try:
        with trace:
            backend.init_forward_metadata_out_graph(fb)
    finally:
        del backend.kv_index_translator.pack_read_stream
    return trace.ops, gathers


def test_sglangs_triton_draft_extend_prep_meets_the_glue_contract():
    backend, runner, rng = _backend(), Runner(), torch.Generator().manual_seed(16)
    for bs in (1, 3, 8):
        first = None
        for _ in range(3):
            fb = runner.view(rng, bs)
            ops, gathers = _traced_prep(backend, runner, fb)
            flat = repr((ops, gathers))
            assert "FOREIGN" not in flat, flat
            assert not any(op.startswith(("aten._local_scalar_dense", "aten.item")) for op, _, _ in ops)
            assert gathers and gathers[0]["out"] == "kv_indices" and gathers[0]["indptr"] == "kv_indptr"
            if first is None:
                first = (ops, gathers)
            assert (ops, gathers) == first  # the same launches, scalars and buffers for any contents
            # ...and the prep computed this batch's layout (what the graph must reproduce).
            kv_lens = (runner.seq_lens[:bs] - NDT).to(torch.int32)
            assert torch.equal(backend.qo_indptr[: bs + 1], torch.arange(0, (bs + 1) * NDT, NDT, dtype=torch.int32))
            assert torch.equal(backend.kv_indptr[1: bs + 1], torch.cumsum(kv_lens, 0).to(torch.int32))
            rows = backend.kv_index_translator.req_to_token[runner.req_pool_indices[:bs]]
            want = torch.cat([rows[i, : int(kv_lens[i])] for i in range(bs)])
            assert torch.equal(backend.cuda_graph_kv_indices[: want.numel()], want)


def test_the_contract_functions_are_pinned():
    from sglang_hostsync_plugin.checks import check_slot

    assert glue_mod.pinned_sources() is None and check_slot(glue_mod.SLOT) is None
    names = {attr for _, attr, _ in glue_mod.PINS}
    assert {"_update_draft_extend_buffers", "_fill_kv_indptr_and_indices", "execute", "MetadataGlueGraph"} <= names


# --- the route -------------------------------------------------------------------

class FakeGlue:
    """SGLang's MetadataGlueGraph as the route sees it: run() calls the prep back (its
    warm-ups and capture do), then counts as captured."""

    def __init__(self, backend, corrupt=False):
        self.disabled, self.runs, self.captured, self.corrupt = False, [], set(), corrupt

    def is_captured(self, key):
        return key in self.captured

    def run(self, backend, fb, key):
        self.runs.append(key)
        backend.init_forward_metadata_out_graph(fb)  # re-enters the hooked method: must pass through
        if self.corrupt and key in self.captured:
            backend.kv_indptr[1] += 1  # a frozen replay would leave a stale layout
        self.captured.add(key)


@pytest.fixture
def routed(monkeypatch):
    """The hook in place on the class, as HookRegistry puts it, with a fresh route."""
    r = glue_mod.GlueRoute(new_glue=FakeGlue)
    monkeypatch.setattr(glue_mod, "_route", r)
    original = tb.TritonAttnBackend.init_forward_metadata_out_graph
    calls = []

    def eager(self, fb, in_capture=False):
        calls.append((fb.batch_size, in_capture))
        return original(self, fb, in_capture)

    def hooked(self, fb, in_capture=False):
        return glue_mod.prep_hook(eager, self, fb, in_capture)

    monkeypatch.setattr(tb.TritonAttnBackend, "init_forward_metadata_out_graph", hooked)
    return r, calls


def test_padding_free_draft_extend_replays_go_to_the_glue(routed):
    r, calls = routed
    backend, runner, rng = _backend(), Runner(), torch.Generator().manual_seed(1)
    backend.init_forward_metadata_out_graph(runner.view(rng, 3))
    glue = r.glues[backend]
    assert glue.runs == [(3,)] and calls == [(3, False)]  # the glue's own call ran SGLang's prep
    assert (r.glued, r.eager) == (1, 0) and not r.inside


@pytest.mark.parametrize("case", ["capture", "padded", "verify", "translated", "swa", "swa_pool", "dllm", "disabled"])
def test_everything_else_stays_eager(routed, case):
    r, calls = routed
    over = {"translated": dict(kv_index_translator=SimpleNamespace(reads_are_translated=True)),
            "swa": dict(sliding_window_size=128), "swa_pool": dict(use_sliding_window_kv_pool=True),
            "dllm": dict(dllm_attention=object())}.get(case, {})
    backend, runner, rng = _backend(**over), Runner(), torch.Generator().manual_seed(2)
    fb = runner.view(rng, 4, raw_bs=3 if case == "padded" else None,
                     mode=ForwardMode.TARGET_VERIFY if case == "verify" else ForwardMode.DRAFT_EXTEND_V2)
    if case == "disabled":
        r.glue_for(backend).disabled = True
    seen = []
    original = lambda self, fb, in_capture=False: seen.append(in_capture)  # noqa: E731
    glue_mod.prep_hook(original, backend, fb, case == "capture")
    assert seen == [case == "capture"] and r.glued == 0
    assert not r.glues.get(backend) or not r.glues[backend].runs
    counted_eager = case not in ("capture", "verify")  # draft-extend replays left to SGLang
    assert r.eager == int(counted_eager)


def test_the_eager_check_counts_a_glue_that_replays_a_stale_layout(routed, caplog):
    r, _ = routed
    r.check = 1
    backend, runner, rng = _backend(), Runner(), torch.Generator().manual_seed(3)
    for _ in range(4):
        backend.init_forward_metadata_out_graph(runner.view(rng, 2))
    assert r.checks == 3 and r.mismatches == 0  # checked from the first replay after capture
    r.glues[backend].corrupt = True
    backend.init_forward_metadata_out_graph(runner.view(rng, 2))
    assert r.checks == 4 and r.mismatches == 1
    # The log's last check line carries the current counts (what the e2e report shows).
    lines = [m.getMessage() for m in caplog.records if " check: " in m.getMessage()]
    assert lines and lines[-1].startswith("hostsync: draft_extend_glue_graph check: 4 checks, 1 mismatches")
    # The check's own eager prep left SGLang's values in the buffers.
    kv_lens = (runner.seq_lens[:2] - NDT).to(torch.int32)
    assert torch.equal(backend.kv_indptr[1:3], torch.cumsum(kv_lens, 0).to(torch.int32))


# Each output the check compares, and one entry of it inside the compared range (bs 2: not the
# indptr's end, so the KV indices' compared prefix stays the same).
COMPARED = {
    "qo_indptr": lambda b: b.qo_indptr[1:2],
    "kv_indptr": lambda b: b.kv_indptr[1:2],
    "kv_indices": lambda b: b.cuda_graph_kv_indices[:1],
}


def test_the_check_compares_one_output_per_compared_field():
    """An output added to the check needs its entry in COMPARED, and so its own test below."""
    assert len(glue_mod._outputs(_backend(), 2)) == len(COMPARED)


@pytest.mark.parametrize("field", COMPARED)
def test_the_eager_check_counts_a_stale_entry_in_each_compared_output(routed, field):
    """A glued replay that differs from the eager prep in one output only is counted."""
    r, _ = routed
    r.check = 1
    backend, runner, rng = _backend(), Runner(), torch.Generator().manual_seed(5)
    for _ in range(3):
        backend.init_forward_metadata_out_graph(runner.view(rng, 2))
    assert r.checks == 2 and r.mismatches == 0
    glue = r.glues[backend]
    replay = glue.run

    def stale_replay(backend, fb, key):
        replay(backend, fb, key)
        COMPARED[field](backend).add_(1)

    glue.run = stale_replay
    backend.init_forward_metadata_out_graph(runner.view(rng, 2))
    assert r.checks == 3 and r.mismatches == 1


@pytest.mark.parametrize("f, reason", [
    (ServingFacts("STANDALONE", topk=4, page_size=16, attention_backends=("triton", "triton")), None),
    (ServingFacts("EAGLE", attention_backends=(None, None)), None),  # not resolved yet: never guessed inert
    (ServingFacts("EAGLE", attention_backends=("fa3", "fa3"), draft_attention_backend="triton"), None),
    (ServingFacts("EAGLE", attention_backends=("flashinfer", "flashinfer")), "not triton"),
    (ServingFacts("NGRAM", attention_backends=("triton", "triton")), "is NGRAM"),
    (ServingFacts("DFLASH", attention_backends=("triton", "triton")), "is DFLASH"),
    (ServingFacts("EAGLE", attention_backends=("triton", "triton"), disable_cuda_graph=True), "disable-cuda-graph"),
    (ServingFacts("EAGLE", attention_backends=("triton", "triton"), enable_lora=True), "LoRA"),
])
def test_inert_rules(f, reason):
    got = glue_mod.inert(f)
    assert (got is None) if reason is None else (reason in got), got


def test_check_setting():
    assert glue_mod.check_every({}) == 0 and glue_mod.check_every({glue_mod.ENV_CHECK: "50"}) == 50
    for bad in ("-1", "often"):
        with pytest.raises(ValueError, match=glue_mod.ENV_CHECK):
            glue_mod.check_every({glue_mod.ENV_CHECK: bad})
    assert glue_mod.SLOT.precheck.config() is None and not glue_mod.SLOT.default
