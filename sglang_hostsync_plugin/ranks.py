"""All TP/DP ranks must run the same slot set: a rank that skips a change to a
collective its peers made would deadlock them. Agree at startup."""

from __future__ import annotations

import hashlib


class SlotSetMismatch(RuntimeError):
    pass


def slot_set_digest(names) -> str:
    return hashlib.sha256(",".join(sorted(names)).encode()).hexdigest()[:16]


def agree_on_slot_set(names, group=None) -> str:
    """All-gather this rank's slot set over ``group``; raise naming every differing set."""
    import torch.distributed as dist

    digest = slot_set_digest(names)
    if not dist.is_available() or not dist.is_initialized():
        return digest
    world = dist.get_world_size(group)
    if world == 1:
        return digest
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (dist.get_rank(), digest, sorted(names)), group=group)
    if len({d for _, d, _ in gathered}) > 1:
        sets = "; ".join(f"rank {r}: [{', '.join(n) or 'none'}]" for r, _, n in gathered)
        raise SlotSetMismatch(
            f"hostsync slot sets differ across ranks ({sets}). Every rank must run the "
            "same SGLANG_HOSTSYNC_SLOTS and the same SGLang; see each rank's status block."
        )
    return digest
