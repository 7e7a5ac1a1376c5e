"""Verify-tree inputs of an EAGLE topk 1 step as SGLang 0.5.23 builds them (the draft's prealloc
parent lists and score indices of ``BaseSpecWorker``, the target backend's mask buffer), and
stock / slot runs of ``build_tree_kernel_efficient`` on them (chain_tree_full_mask)."""

import random

import torch

from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

CONTEXT = 64  # the mask buffer's max_context_len


def make_case(rng, bs, steps, *, buffer="uint8", fill=True, seq_dtype=torch.int64, bonus_dtype=torch.int64,
              draft_dtype=torch.int64, device="cpu"):
    """kwargs of ``build_tree_kernel_efficient`` at topk 1; ``buffer`` None: SGLang allocates the mask."""
    width = steps + 1
    seq = torch.tensor([rng.randrange(1, CONTEXT) for _ in range(bs)], dtype=seq_dtype, device=device)
    parent_width = steps if steps > 1 else 0  # BaseSpecWorker's _topk1_parents_prealloc
    buf = None
    if buffer is not None:  # maybe_create_verify_mask: FULL_MASK, bs x width x (context + width); stale cells
        size = bs * width * (CONTEXT + width)
        buf = torch.randint(0, 2, (size,), device=device).to(getattr(torch, buffer))
    return dict(
        bonus_tokens=torch.randint(0, 128256, (bs,), device=device).to(bonus_dtype),
        parent_list=torch.arange(-1, parent_width - 1, dtype=torch.long, device=device).repeat(bs, 1),
        top_scores_index=torch.arange(steps, dtype=torch.long, device=device).repeat(bs, 1),
        draft_tokens=torch.randint(0, 128256, (bs, steps), dtype=draft_dtype, device=device),
        seq_lens=seq, seq_lens_sum=int(seq.sum()), topk=1, spec_steps=steps, num_verify_tokens=width,
        tree_mask_mode=TreeMaskMode.FULL_MASK, tree_mask_buf=buf, fill_prefix_mask=fill,
    )


def cases(seed, n, max_bs):
    """(rng, make_case kwargs): the fixed edge cases (one step, bool buffer, SGLang's allocation with
    and without the fill, no fill, int32 lengths and tokens, ``max_bs``), then ``n`` random ones."""
    rng = random.Random(seed)
    fixed = [dict(bs=1, steps=3), dict(bs=1, steps=1), dict(bs=8, steps=7, buffer="bool"),
             dict(bs=3, steps=3, buffer=None), dict(bs=3, steps=2, buffer=None, fill=False),
             dict(bs=4, steps=3, fill=False), dict(bs=2, steps=3, bonus_dtype=torch.int32),
             dict(bs=2, steps=3, draft_dtype=torch.int32), dict(bs=max_bs, steps=3)]
    for kw in fixed:
        yield rng, kw
    for _ in range(n):
        yield rng, dict(bs=rng.randint(1, max_bs), steps=rng.randint(1, 7), buffer=rng.choice(["uint8", "bool", None]),
                        fill=rng.random() < 0.7, bonus_dtype=rng.choice([torch.int64, torch.int32]))


def clone(kw):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def run_both(kw):
    """(stock's outputs, the slot's) on copies of the same inputs; the slot's path must be taken."""
    from sglang.srt.speculative import eagle_utils

    from sglang_hostsync_plugin.slots import chain_tree_full_mask as ct

    def fell_back(*a, **k):
        raise AssertionError("fell back to SGLang's function")

    return eagle_utils.build_tree_kernel_efficient(**clone(kw)), ct.build_tree_hook(fell_back, **clone(kw))


def same(stock, plugin, kw) -> bool:
    """Bit for bit (dtype and shape too); a mask SGLang allocated without a fill: the cells both wrote."""
    if any(a.dtype != b.dtype or a.shape != b.shape for a, b in zip(stock, plugin)):
        return False
    if kw["tree_mask_buf"] is None and not kw["fill_prefix_mask"]:
        written = written_cells(kw)
        return torch.equal(stock[0][written], plugin[0][written]) and all(
            torch.equal(a, b) for a, b in zip(stock[1:], plugin[1:]))
    return all(torch.equal(a, b) for a, b in zip(stock, plugin))


def written_cells(kw):
    """Indices of the full mask's tree cells (each request's last ``width`` columns of its rows)."""
    width, out, start = kw["num_verify_tokens"], [], 0
    for n in kw["seq_lens"].tolist():
        for r in range(width):
            out += range(start + r * (n + width) + n, start + r * (n + width) + n + width)
        start += width * (n + width)
    return torch.tensor(out, dtype=torch.long, device=kw["seq_lens"].device)
