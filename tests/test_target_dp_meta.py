"""target_dp_meta on the CPU: the real ForwardBatch methods, stock vs plugin."""

import random

import pytest
import torch

from sglang.srt.model_executor import forward_batch_info
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from hostsync_drivers import CallCounter
from hostsync_drivers.target_dp_meta import (
    fill, make_decode_batch, make_forward_batch, make_model_runner, make_schedule_batch, prepare, prepare_snapshot,
    snapshot, spec_info, stand_in_parallel_state,
)
from sglang_hostsync_plugin.slots import target_dp_meta as tdm

DEV = "cpu"


@pytest.fixture(autouse=True)
def fresh_stagers():
    tdm.reset()
    yield
    tdm.reset()


@pytest.fixture
def nnp(monkeypatch):
    flag = {"on": True}
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: flag["on"])
    return flag


def _case(rng, dp):
    gnt = [rng.choice([0, rng.randint(1, 1 << 16)]) for _ in range(dp)]  # idle ranks: zero counts
    lp = [rng.choice([0, rng.randint(1, 1 << 16)]) for _ in range(dp)]
    kind = rng.choice(["plain", "scaled", "coordinated", "draft"])
    spec = spec_info(rng.randint(1, 8), rng.randint(1, 4)) if kind != "plain" else None
    draft = ([rng.randint(0, 99) for _ in range(dp)], [rng.randint(0, 99) for _ in range(dp)]) \
        if kind == "draft" else (None, None)
    batch = make_schedule_batch(gnt, lp, coordination=kind == "coordinated", draft=draft[0], draft_logprob=draft[1])
    num_tokens = rng.choice([None, 0, rng.randint(1, 64)])
    return batch, num_tokens, spec, kind == "draft"


def _both(batch, num_tokens, spec, is_draft, mode=ForwardMode.DECODE, batch_size=None):
    out = []
    for arm in ("stock", "plugin"):
        fb = make_forward_batch(num_tokens, DEV, spec=spec, mode=mode, batch_size=batch_size)
        out.append(snapshot(fill(arm, fb, batch, DEV, is_draft_worker=is_draft)))
    return out


def test_random_inputs_bit_identical(nnp):
    rng = random.Random(0)
    for _ in range(300):
        dp = rng.choice([1, 2, 3, 8, 16, 32])
        nnp["on"] = rng.random() < 0.8
        batch, num_tokens, spec, is_draft = _case(rng, dp)
        stock, plugin = _both(batch, num_tokens, spec, is_draft, batch_size=rng.randint(0, 16))
        assert plugin == stock
        assert stock["global_num_tokens_gpu"] is not None  # the DP path really ran


@pytest.mark.parametrize("dp", [1, 4])
def test_no_dp_counts_and_idle_draft_decode(nnp, dp):
    # No DP sync: init_mlp_sync_metadata returns before any tensor; the scalar still comes.
    stock, plugin = _both(make_schedule_batch(None, None), 12, None, False)
    assert plugin == stock and stock["global_num_tokens_gpu"] is None
    assert stock["global_num_token_non_padded"][3] == 12
    # Draft decode without input_ids counts batch_size * num_tokens_per_req.
    batch = make_schedule_batch([0] * dp, [0] * dp)
    stock, plugin = _both(batch, None, spec_info(3, 1), True, batch_size=5)
    assert plugin == stock and stock["global_num_token_non_padded"][3] == 15


def test_seed_review_rows_differ_and_fills_get_their_own_tensors(nnp):
    fbs = []
    for gnt, lp in (([6, 18, 0, 12], [1, 3, 0, 2]), ([5, 5, 5, 5], [2, 2, 2, 2]), ([9, 0, 7, 1], [4, 0, 3, 1])):
        fb = fill("plugin", make_forward_batch(8, DEV), make_schedule_batch(gnt, lp), DEV)
        fbs.append((fb, gnt, lp))
    for fb, gnt, lp in fbs:  # each call's tensors still hold its own counts
        assert fb.global_num_tokens_gpu.tolist() == gnt
        assert fb.global_num_tokens_for_logprob_gpu.tolist() == lp
        assert fb.global_num_tokens_gpu.dtype == torch.int64 and fb.global_num_tokens_gpu.is_contiguous()
    ptrs = {fb.global_num_tokens_gpu.untyped_storage().data_ptr() for fb, _, _ in fbs}
    assert len(ptrs) == 3  # fresh device storage per ForwardBatch, never aliased
    counts = tdm.stagers()[0]
    assert counts.allocations == 1 and counts.slot == 1  # host slots 0, 1, 0: the third reused the first


def test_no_pinned_or_host_allocation_after_first_fill(nnp, monkeypatch):
    fill("plugin", make_forward_batch(8, DEV), make_schedule_batch([1, 2], [1, 1]), DEV)
    calls = CallCounter(monkeypatch, torch, "tensor")
    for i in range(20):
        fill("plugin", make_forward_batch(8, DEV), make_schedule_batch([i, 2], [1, i]), DEV)
    counts, non_padded, _ = tdm.stagers()
    assert calls.n == 0 and counts.allocations == 1 and non_padded.allocations == 1
    calls.n = 0
    fill("stock", make_forward_batch(8, DEV), make_schedule_batch([1, 2], [1, 1]), DEV)
    assert calls.n == 3  # stock: 2 count tensors + the scalar, every step


def test_stager_follows_dp_changes(nnp):
    for dp in (2, 8, 2):
        fb = fill("plugin", make_forward_batch(8, DEV), make_schedule_batch(list(range(dp)), [1] * dp), DEV)
        assert fb.global_num_tokens_gpu.tolist() == list(range(dp))
    assert tdm.stagers()[0].allocations == 3


# prepare_mlp_sync_batch: SGLang's method with the padded-count H2D replaced.

@pytest.fixture
def parallel(monkeypatch):
    def stand_in(**kw):
        stand_in_parallel_state(monkeypatch, DEV, **kw)
    return stand_in


def _prepare_case(rng):
    dp = rng.choice([1, 2, 4, 8])
    rank = rng.randrange(dp)
    idle = rng.random() < 0.2
    bs = 0 if idle else rng.randint(1, 8)
    counts = [rng.choice([0, rng.randint(1, 12)]) for _ in range(dp)]  # idle ranks included
    counts[rank] = bs
    return dict(dp_rank=rank, padding=rng.choice(["max_len", "sum_len"]), attn_tp_size=rng.choice([1, 2, 4])), bs, counts


def test_prepare_mlp_sync_batch_bit_identical(parallel, monkeypatch):
    rng = random.Random(1948)
    model_runner = make_model_runner()
    tensors = CallCounter(monkeypatch, torch, "tensor", on=False)
    for _ in range(200):
        state, bs, counts = _prepare_case(rng)
        parallel(**state)
        stock = prepare_snapshot(prepare("stock", make_decode_batch(bs, DEV, counts), model_runner))
        fb = make_decode_batch(bs, DEV, counts)
        tensors.on = True
        plugin = prepare_snapshot(prepare("plugin", fb, model_runner))
        tensors.on = False
        assert plugin == stock, (state, bs, counts)
    # The decode path's only torch.tensor is the replaced site: the staged path ran every time.
    assert tensors.n == 0 and tdm.stagers()[2].allocations >= 1


def test_prepare_mlp_sync_batch_allocates_no_count_tensor(parallel, monkeypatch):
    parallel()
    model_runner = make_model_runner()
    prepare("plugin", make_decode_batch(3, DEV, [3, 5]), model_runner)
    fbs = [make_decode_batch(3, DEV, [3, 5]) for _ in range(11)]
    calls = CallCounter(monkeypatch, torch, "tensor")
    for fb in fbs[:10]:
        prepare("plugin", fb, model_runner)
    assert calls.n == 0 and fbs[9].global_num_tokens_gpu.tolist() == [5, 5]
    prepare("stock", fbs[10], model_runner)
    assert calls.n == 1  # stock: a pinned tensor per eager forward


def test_prepare_mlp_sync_batch_falls_back_for_other_count_tensors(parallel):
    """A global_num_tokens_gpu the stager cannot write (int32 here) gets SGLang's own copy_."""
    parallel()
    model_runner = make_model_runner()
    out = []
    for arm in ("stock", "plugin"):
        fb = make_decode_batch(2, DEV, [2, 6])
        fb.global_num_tokens_gpu = fb.global_num_tokens_gpu.to(torch.int32)
        out.append(prepare_snapshot(prepare(arm, fb, model_runner)))
    assert out[0] == out[1] and out[1]["global_num_tokens_gpu"][0] == "torch.int32"
    assert tdm.stagers()[2].allocations == 0


# SGLang's own predicates for the staged sites, on the published config of each argument set:
# ForwardBatch's DP counts exist where the scheduler runs ``require_mlp_sync()``'s preparation,
# and the non-padded count is staged where ``enable_num_token_non_padded()`` holds.
SGLANG_STAGES_COUNTS = """
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import publish, SpawnRanks
from sglang.srt.utils.common import require_mlp_sync
from sglang.srt.model_executor import forward_batch_info as fbi
from sglang.srt.layers.moe import utils as moe_utils
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import target_dp_meta as tdm
out = []
for argv in json.loads(sys.argv[1]):
    args = prepare_server_args(["--model-path", "dummy", *argv])
    args.resolve_once()
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    moe_utils.initialize_moe_config()
    fbi._dp_tp_moe_masks_pad_rows.cache_clear()
    stages = bool(require_mlp_sync() or fbi.enable_num_token_non_padded())
    out.append([argv, stages, tdm.SLOT.inert(ServingFacts.from_server_args(args, {}))])
print("STAGES " + json.dumps(out))
"""


def test_inert_exactly_where_sglang_stages_no_counts():
    """The slot registers no hook where SGLang's ``require_mlp_sync()`` and
    ``enable_num_token_non_padded()`` are both false (a dense model on one GPU, plain TP), and is
    never inert where either holds."""
    import json
    from helpers import out, run_python

    argvs = [[], ["--tp-size", "2"], ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "dummy"],
             ["--tp-size", "2", "--attn-dp-size", "2"], ["--tp-size", "2", "--ep-size", "2"],
             ["--tp-size", "2", "--moe-a2a-backend", "deepep"], ["--tp-size", "2", "--moe-dense-tp-size", "1"],
             ["--tp-size", "4", "--attn-dp-size", "2", "--ep-size", "4"]]
    proc = run_python(SGLANG_STAGES_COUNTS.replace("sys.argv[1]", repr(json.dumps(argvs))), timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STAGES ")]
    assert proc.returncode == 0 and line, out(proc)
    rows = json.loads(line[0][len("STAGES "):])
    assert len(rows) == len(argvs)
    for argv, stages, reason in rows:
        assert (reason is None) == stages, (argv, stages, reason)
    assert [stages for _, stages, _ in rows].count(False) == 3 and [s for _, s, _ in rows].count(True) == 5
    assert "SGLang stages no DP counts" in rows[0][2]


def test_doctor_facts_follow_the_moe_arguments():
    from sglang_hostsync_plugin import doctor

    for extra, inert in (([], True), (["--ep-size", "2"], False), (["--moe-a2a-backend", "deepep"], False),
                         (["--moe-dense-tp-size", "1"], False), (["--attn-dp-size", "2"], False)):
        ns = doctor._parser().parse_args(["doctor", "--speculative-algorithm", "EAGLE", *extra])
        report = doctor.facts_of(ns)
        assert (tdm.SLOT.inert(report) is not None) == inert, extra


def test_the_deprecated_dp_attention_flag_gives_the_launcher_the_schedulers_facts():
    """The launcher reads the args right after ``prepare_server_args``, before SGLang resolves
    ``--enable-dp-attention --dp-size N`` into ``--attn-dp-size N``; the scheduler reads them resolved.
    Both see attention DP, so the slot applies in both (and their plans match)."""
    import json
    from helpers import out, run_python

    code = """
import json
from sglang.srt.server_args import prepare_server_args
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import target_dp_meta as tdm
rows = []
for argv in (["--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"], ["--dp-size", "2"], ["--tp-size", "2"]):
    args = prepare_server_args(["--model-path", "dummy", *argv])
    launcher = ServingFacts.from_server_args(args, {})
    args.resolve_once()
    scheduler = ServingFacts.from_server_args(args, {})
    rows.append([launcher.dp_attention, scheduler.dp_attention, launcher.matches(scheduler.record()),
                 tdm.SLOT.inert(launcher) is None])
print("FACTS " + json.dumps(rows))
"""
    proc = run_python(code, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("FACTS ")]
    assert proc.returncode == 0 and line, out(proc)
    deprecated, replicas, tp = json.loads(line[0][len("FACTS "):])
    assert deprecated == [True, True, True, True]
    assert replicas == [False, False, True, False] and tp == [False, False, True, False]  # --dp-size alone: replicas
