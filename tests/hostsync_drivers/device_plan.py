"""Driver for ``flashinfer_device_plan``'s launch: a captured CUDA-graph prefill plan's layout (32 / 8 heads,
8 rows a request, page 1) and ``launch_plan``'s arguments for random request lengths over it."""

from __future__ import annotations

import random

import torch

from sglang_hostsync_plugin import flashinfer_device_plan as fdp, flashinfer_split as fs


def prefill_launch(rng: random.Random, bs: int, device="cuda", layout: tuple[dict, int] | None = None):
    """(``launch_plan``'s arguments, the layout): a fresh int workspace, lengths up to 30000 tokens; pass the
    layout back for another call of the same captured shape (a replay's signature)."""
    from test_flashinfer_device_plan import prefill_layout  # tests/ is on the path

    lens = [rng.randrange(1, 30000) for _ in range(bs)]
    call = fs.PlannerCall(tuple(range(0, (bs + 1) * 8, 8)), tuple(fs.page_indptr(lens, 1)), bs * 8, bs, 32, 8, 1,
                          True, 128, 128, False, -1, -1, False, 0, 0)
    info, size = layout or prefill_layout(fs.plan_call(call), bs, bs * 8)
    i32 = dict(dtype=torch.int32, device=device)
    args = fdp.prefill_args(torch.tensor(call.qo_indptr, **i32), torch.tensor(call.kv_indptr, **i32),
                            torch.zeros(size, dtype=torch.uint8, device=device), info, batch_size=bs, gqa=4,
                            max_batch_size_if_split=info["padded_batch_size"], page_size=1)
    return args, (info, size)
