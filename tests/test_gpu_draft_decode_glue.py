"""``draft_decode_glue_graph`` on CUDA with SGLang's real ``MetadataGlueGraph`` and kernels:
the triton multi-step draft prep, fed the slot's static view and captured once per batch
size, replays exactly what SGLang's eager prep computes for each new batch (every draft step's
KV indptr and indices, the KV splits), bs 1 / 3 / 8, topk 1 and 4, random lengths and rows.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

from __future__ import annotations

import pytest
import torch

from helpers import cuda_call

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend  # noqa: E402
from sglang.srt.model_executor.runner.metadata_glue_graph import MetadataGlueGraph  # noqa: E402
from sglang_hostsync_plugin.slots import draft_decode_glue_graph as glue_mod  # noqa: E402
from test_draft_decode_glue_graph import Runner, _backend  # noqa: E402

ORIGINAL = TritonMultiStepDraftBackend.init_forward_metadata_out_graph


@pytest.mark.parametrize("topk", [1, 4])
def test_glued_draft_prep_replays_the_eager_layout(topk):
    glued = _backend("cuda", topk=topk)
    eager = _backend("cuda", req_to_token=glued.kv_index_translator.req_to_token, topk=topk)
    runner, rng = Runner(glued, "cuda", topk), torch.Generator().manual_seed(7 + topk)
    glue = MetadataGlueGraph("cuda")
    checked = 0
    for step in range(40):
        bs = (1, 3, 8)[step % 3]
        fb = runner.batch(rng, bs)
        glue.run(glue_mod._Leaf(ORIGINAL, glued), glue_mod.static_view(runner, fb), (bs,))
        ORIGINAL(eager, fb, False)  # stock: the batch's own tensors
        torch.cuda.synchronize()
        a, b = glue_mod._outputs(glued, bs), glue_mod._outputs(eager, bs)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (step, bs)
        checked += glue.is_captured((bs,))
    assert not glue.disabled and glue.replays > 0
    assert checked >= 30, checked  # most steps compared a replayed graph, not a warm-up


def test_the_hook_path_replays_the_eager_layout(monkeypatch):
    """The slot's own route (``execute_hook`` + ``prep_hook``: warm-ups and capture through
    ``MetadataGlueGraph.run``, then ``replay`` with no view), bs 1 / 3 / 8 at topk 4."""
    route = glue_mod.DraftGlueRoute()
    monkeypatch.setattr(glue_mod, "_route", route)
    glued = _backend("cuda")
    eager = _backend("cuda", req_to_token=glued.kv_index_translator.req_to_token)
    runner, rng = Runner(glued, "cuda"), torch.Generator().manual_seed(11)
    for step in range(30):
        bs = (1, 3, 8)[step % 3]
        fb = runner.batch(rng, bs)
        glue_mod.execute_hook(lambda self, batch: glue_mod.prep_hook(ORIGINAL, glued, batch), runner, fb)
        ORIGINAL(eager, fb, False)
        torch.cuda.synchronize()
        a, b = glue_mod._outputs(glued, bs), glue_mod._outputs(eager, bs)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (step, bs)
    glue = route.glues[glued]
    assert not glue.disabled and glue.replays >= 20 and route.glued == 30 and route.eager == 0


def test_the_self_check_counts_on_the_device_without_a_host_sync(monkeypatch):
    """``SGLANG_HOSTSYNC_GLUE_CHECK=1`` on the hook path: no check waits for the GPU (sync-debug
    mode "error" around each step), none of the clean replays is counted as a mismatch, and
    every check of a glue that replays a corrupted layout is."""
    route = glue_mod.DraftGlueRoute(check=1)
    monkeypatch.setattr(glue_mod, "_route", route)
    glued = _backend("cuda")
    runner, rng = Runner(glued, "cuda"), torch.Generator().manual_seed(13)

    def hooked(self, batch):
        return glue_mod.prep_hook(ORIGINAL, glued, batch)

    def steps(n, strict=True):  # the warm-ups and captures synchronize (torch's graph capture)
        for step in range(n):
            fb = runner.batch(rng, (1, 3, 8)[step % 3])
            cuda_call(lambda: glue_mod.execute_hook(hooked, runner, fb), strict)

    steps(9, strict=False)  # bs 1 / 3 / 8: 2 warm-ups and the capture each
    steps(15)  # 15 checked replays
    torch.cuda.synchronize()
    route.tally.harvest()
    assert 1 <= route.tally.read <= route.checks == 15 and route.mismatches == 0
    glue = route.glues[glued]
    real_replay = glue.replay

    def corrupt_replay(key):
        real_replay(key)
        glued.cuda_graph_kv_indices[0, 0] += 1  # inside every row's valid prefix

    monkeypatch.setattr(glue, "replay", corrupt_replay)
    steps(6)
    route.tally.settle(route.checks)
    assert (route.checks, route.mismatches, route.tally.read) == (21, 6, 21)
