"""``draft_extend_glue_graph`` on CUDA with SGLang's real ``MetadataGlueGraph``: the
triton draft-extend prep, captured once per batch size, replays exactly what SGLang's
eager prep computes for new batch contents (qo / kv indptr and the gathered KV
indices), bs 1 / 3 / 8, random lengths and request rows."""

from __future__ import annotations

import pytest
import torch

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
