"""Driver for ``fused_relay_stash``: two real SGLang 0.5.23 ``FutureMap``s with the same buffer
contents, one stashed by SGLang's ``FutureMap.stash`` and one by the slot's hook, on the same
payload; ``same`` compares every relay buffer bit for bit."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_hostsync_plugin.slots import fused_relay_stash as frs

BUFS = ("output_tokens_buf", "topk_p_buf", "topk_index_buf", "hidden_states_buf")


def make_payload(rng: random.Random, bs: int, topk: int = 4, hidden_dim: int | None = None, device="cpu",
                 bonus_dtype=torch.int32, hidden_dtype=torch.bfloat16, topk_p=True) -> RelayPayload:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    return RelayPayload(
        bonus_tokens=torch.randint(0, 128256, (bs,), generator=g).to(bonus_dtype).to(device),
        topk_p=torch.rand(bs, topk, generator=g).to(device) if topk_p else None,
        topk_index=torch.randint(0, 128256, (bs, topk), generator=g).to(device) if topk_p else None,
        hidden_states=(torch.randn(bs, hidden_dim, generator=g).to(hidden_dtype).to(device)
                       if hidden_dim else None),
    )


def make_maps(rng: random.Random, pool: int, like: RelayPayload, algo: str = "STANDALONE", device="cpu",
              monkeypatch=None):
    """Two FutureMaps whose buffers (initialised from ``like``, as stock's first stash does) hold
    the same random contents."""
    import sglang.srt.speculative.spec_utils as spec_utils

    hidden = like.hidden_states is not None
    maps = []
    for _ in range(2):
        fm = FutureMap(torch.device(device), SpeculativeAlgorithm.from_string(algo),
                       SimpleNamespace(req_to_token=torch.zeros(pool, 8, dtype=torch.int32, device=device)))
        monkeypatch.setattr(spec_utils, "spec_need_hidden_states", lambda: hidden)
        fm._maybe_init_forward_bufs(like)
        maps.append(fm)
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for name in BUFS:
        buf = getattr(maps[0], name)
        if buf is None:
            continue
        fill = (torch.rand(buf.shape, generator=g) if buf.is_floating_point()
                else torch.randint(-5, 1 << 20, buf.shape, generator=g)).to(buf.dtype).to(device)
        for fm in maps:
            getattr(fm, name).copy_(fill)
    return maps


def indices_for(rng: random.Random, pool: int, bs: int, device="cpu", dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(rng.sample(range(pool), bs), dtype=dtype, device=device)


def fell_back(*args, **kwargs):
    raise AssertionError("fell back to SGLang's stash")


def run_both(stock_map, plugin_map, indices, payload, original=fell_back):
    FutureMap.stash(stock_map, indices, payload)
    frs.stash(plugin_map, indices, payload, original)


def same(a, b) -> bool:
    for name in BUFS:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None):
            return False
        # bitwise, so a float buffer's NaN or -0.0 compares too
        if x is not None and not (x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))):
            return False
    return True
