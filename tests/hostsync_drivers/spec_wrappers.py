"""Operands of the SGLang wrappers ``spec_kernel_replay`` replays, shaped as the EAGLE v2 step
passes them (SGLang 0.5.23 callers: overlap_utils, eagle_worker_common, eagle_utils,
eagle_worker_v2). ``case(name, rng, bs, variant, device)`` -> (args, kwargs), fresh contents with
the same operand signature for the same (name, bs, variant)."""

import torch

from sglang.kernels.ops.speculative import cache_locs, eagle, gather_spec_extras as gse

POOL = 64  # request slots (rows of the relay buffers and of req_to_token)
CONTEXT = 2048  # req_to_token columns
TOPK, STEPS, DRAFT = 4, 3, 8


def _rows(rng, bs, device):
    return torch.tensor(rng.sample(range(POOL), bs), dtype=torch.int64, device=device)


def _seq_lens(rng, bs, device, room):
    return torch.tensor([rng.randrange(1, CONTEXT - room) for _ in range(bs)], dtype=torch.int64, device=device)


def _req_to_token(device):
    return torch.randperm(POOL * CONTEXT, device=device).to(torch.int32).view(POOL, CONTEXT)


def _accepts(rng, bs, nd, device):
    """accept_lens (1..nd) and accept_index (a chain per row, -1 past it) as verify leaves them."""
    lens = [rng.randint(1, nd) for _ in range(bs)]
    index = torch.full((bs, nd), -1, dtype=torch.int32)
    for r, n in enumerate(lens):
        index[r, :n] = torch.arange(r * nd, r * nd + n, dtype=torch.int32)
    return torch.tensor(lens, dtype=torch.int32, device=device), index.to(device)


def case(name: str, rng, bs: int, variant: str = "", device="cuda"):
    g = torch.Generator(device=device).manual_seed(rng.randrange(1 << 30))
    if name == "gather_spec_extras":  # variant "hidden": EAGLE's hidden states; "": STANDALONE
        hidden = torch.randn(POOL, 256, device=device, generator=g).to(torch.bfloat16) if variant == "hidden" else None
        return (_rows(rng, bs, device), torch.rand(POOL, TOPK, device=device, generator=g),
                torch.randint(0, 128256, (POOL, TOPK), device=device, generator=g),
                torch.randint(0, 128256, (POOL,), device=device, generator=g), hidden), {}
    if name == "assign_draft_cache_locs_contiguous_func":  # variant "positions": topk 1 writes them
        cols = STEPS + 1
        positions = torch.empty(bs, dtype=torch.int64, device=device) if variant == "positions" else None
        topk = 1 if positions is not None else TOPK
        return (_rows(rng, bs, device), _req_to_token(device), _seq_lens(rng, bs, device, topk * cols),
                torch.zeros(bs * topk * cols, dtype=torch.int64, device=device), topk, cols), \
            {"positions": positions, "mrope": None}
    if name == "assign_extend_cache_locs_uniform_func":
        return (), {"req_pool_indices": _rows(rng, bs, device), "req_to_token": _req_to_token(device),
                    "start_offset": _seq_lens(rng, bs, device, DRAFT), "batch_size": bs,
                    "draft_token_num": DRAFT, "device": device}
    if name == "prepare_verify_commit_outputs":
        # variant "fused": topk 1's draft-extend inputs too; "mamba": and the mamba track steps
        # (page 16); "int32": topk > 1 with int32 lengths (the result's dtype is their promotion)
        lens, index = _accepts(rng, bs, DRAFT, device)
        predict = torch.randint(0, 128256, (bs * DRAFT,), device=device, generator=g, dtype=torch.int64)
        seq_lens = _seq_lens(rng, bs, device, DRAFT)
        kw = {"num_draft_tokens": DRAFT, "mamba_track_interval": 16 if variant == "mamba" else 0} \
            if variant in ("fused", "mamba") else {}
        return (predict, index, lens, seq_lens.to(torch.int32) if variant == "int32" else seq_lens), kw
    if name == "prepare_draft_extend_layout":  # variant "mrope": the mrope positions too
        return (_seq_lens(rng, bs, device, DRAFT), DRAFT, variant == "mrope"), {}
    if name == "prepare_draft_extend_inputs":
        lens, _ = _accepts(rng, bs, DRAFT, device)
        return (lens, torch.randint(0, 128256, (bs * DRAFT,), device=device, generator=g, dtype=torch.int64), DRAFT), {}
    raise KeyError(name)


FUNCTIONS = {
    "gather_spec_extras": gse.gather_spec_extras,
    "assign_draft_cache_locs_contiguous_func": cache_locs.assign_draft_cache_locs_contiguous_func,
    "assign_extend_cache_locs_uniform_func": cache_locs.assign_extend_cache_locs_uniform_func,
    "prepare_draft_extend_layout": eagle.prepare_draft_extend_layout,
    "prepare_draft_extend_inputs": eagle.prepare_draft_extend_inputs,
    "prepare_verify_commit_outputs": eagle.prepare_verify_commit_outputs,
}
# (wrapper, variants): every result structure the EAGLE v2 step asks of it
VARIANTS = (
    ("gather_spec_extras", ("hidden", "")),
    ("assign_draft_cache_locs_contiguous_func", ("", "positions")),
    ("assign_extend_cache_locs_uniform_func", ("",)),
    ("prepare_draft_extend_layout", ("", "mrope")),
    ("prepare_draft_extend_inputs", ("",)),
    ("prepare_verify_commit_outputs", ("", "fused", "mamba", "int32")),
)


def replayed(name: str):
    """What the slot's ``Replay`` wraps for SGLang's wrapper ``name`` (a copy with one line
    edited for prepare_verify_commit_outputs, see spec_kernel_replay)."""
    from sglang_hostsync_plugin.slots import spec_kernel_replay as skr

    fn = FUNCTIONS[name]
    return skr.VERIFY_COMMIT_EDIT(fn) if name == "prepare_verify_commit_outputs" else fn


def clone(x):
    """Operands copied, so two calls see the same contents (in-place outputs included)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, tuple):
        return tuple(clone(y) for y in x)
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    return x


def same(a, b) -> bool:
    """Equal results: tensors bit for bit (dtype and shape too), the same nesting and None holes."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
