"""``draft_extend_glue_graph`` on CUDA with SGLang's real ``MetadataGlueGraph``: the
triton draft-extend prep, captured once per batch size, replays exactly what SGLang's
eager prep computes for new batch contents (qo / kv indptr and the gathered KV
indices), bs 1 / 3 / 8, random lengths and request rows."""

from __future__ import annotations

import pytest
import torch

from helpers import cuda_call

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from sglang.srt.model_executor.runner.metadata_glue_graph import MetadataGlueGraph  # noqa: E402
from test_draft_extend_glue_graph import NDT, Runner, _backend  # noqa: E402


def _layout(backend, bs):
    kv_indptr = backend.kv_indptr[: bs + 1].clone()
    return (backend.qo_indptr[: bs + 1].clone(), kv_indptr,
            backend.cuda_graph_kv_indices[: int(kv_indptr[-1])].clone())


def test_glued_draft_extend_prep_replays_the_eager_layout():
    glued, eager = _backend("cuda"), None
    eager = _backend("cuda", req_to_token=glued.kv_index_translator.req_to_token)
    runner, rng = Runner("cuda"), torch.Generator().manual_seed(5)
    glue = MetadataGlueGraph("cuda")
    checked = 0
    for step in range(40):
        bs = (1, 3, 8)[step % 3]
        fb = runner.view(rng, bs)
        glue.run(glued, fb, (bs,))  # 2 eager warm-ups per key, then capture, then replays
        eager.init_forward_metadata_out_graph(fb)
        torch.cuda.synchronize()
        a, b = _layout(glued, bs), _layout(eager, bs)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (step, bs)
        checked += glue.is_captured((bs,))
    assert not glue.disabled and glue.replays > 0
    assert checked >= 30, checked  # most steps compared a replayed graph, not a warm-up


def test_the_self_check_counts_on_the_device_without_a_host_sync(monkeypatch):
    """``SGLANG_HOSTSYNC_GLUE_CHECK=1`` through ``prep_hook``: no check waits for the GPU, the clean
    replays count no mismatch, and a glue whose replay corrupts the KV indices is counted."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sglang_hostsync_plugin.slots import draft_extend_glue_graph as glue_mod

    route = glue_mod.GlueRoute(check=1)
    monkeypatch.setattr(glue_mod, "_route", route)
    backend, runner, rng = _backend("cuda"), Runner("cuda"), torch.Generator().manual_seed(17)
    original = TritonAttnBackend.init_forward_metadata_out_graph

    def steps(n, strict=True):  # the warm-ups and captures synchronize (torch's graph capture)
        for step in range(n):
            fb = runner.view(rng, (1, 3, 8)[step % 3])
            cuda_call(lambda: glue_mod.prep_hook(original, backend, fb, False), strict)

    steps(9, strict=False)  # bs 1 / 3 / 8: 2 warm-ups and the capture each
    steps(15)
    torch.cuda.synchronize()
    route.tally.harvest()
    assert 1 <= route.tally.read <= route.checks == 15 and route.mismatches == 0
    glue = route.glues[backend]
    real_run = glue.run

    def corrupt_run(*args):
        real_run(*args)
        backend.cuda_graph_kv_indices[0] += 1  # inside the valid prefix (every length is >= 1)

    monkeypatch.setattr(glue, "run", corrupt_run)
    steps(6)
    route.tally.settle(route.checks)
    assert (route.checks, route.mismatches, route.tally.read) == (21, 6, 21)
