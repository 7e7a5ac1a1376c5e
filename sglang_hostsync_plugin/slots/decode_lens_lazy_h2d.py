"""Slot ``decode_lens_lazy_h2d``: the spec decode prep copies the KV lengths to the GPU only on the
steps that allocate KV (host work per step).

SGLang 0.5.23, ``eagle_utils.eagle_prepare_for_decode`` (EAGLE family and NGRAM, every decode
step): it builds the current and next page-aligned KV lengths as host tensors, copies both to the
GPU (two pageable H2D launches on the schedule stream) and hands them to
``allocation.alloc_for_spec_decode``. That function reads the device lengths only when the step
needs new KV (``num_needed_tokens > 0``: ``get_last_loc``, the page allocator,
``assign_req_to_token_pool``); otherwise it reads the host lengths alone. With a page of 16 and
about three tokens accepted per step, most steps allocate nothing, and the two copies' results
are dropped unread. On the H200 (2026-12-04, page 16 c1, with and without the slot) decode prep
took 165 vs 241 µs per step at topk 1 and 162 vs 215 at topk 4.

With this slot the two copies run on the steps that allocate, as stock; on the others
``alloc_for_spec_decode`` gets None for the device lengths it does not read. Every other line is
SGLang's. Hook target: ``eagle_prepare_for_decode`` (AROUND; recompiled from its pinned source with
one edit, ``source_edit.PinnedEdit``); ``alloc_for_spec_decode``'s source is pinned too, since the
edit relies on when it reads the device lengths.
"""

from __future__ import annotations

from ..checks import pinned_sources
from ..slot import Slot, SlotKind, config_precheck, not_eagle_or_ngram
from ..source_edit import PinnedEdit
from .upstream_switches import HOST_PRESET

NAME = "decode_lens_lazy_h2d"
PREPARE = "sglang.srt.speculative.eagle_utils.eagle_prepare_for_decode"
PREPARE_SHA = "a7054af5ba19aa6e"
# The edit is exact only while alloc_for_spec_decode reads the device lengths just when it allocates.
PINS = (("sglang.srt.mem_cache.allocation", "alloc_for_spec_decode", "2e06c4d5727280e3"),)

LAZY_EDIT = (
    "    cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)\n"
    "    nxt_kv_lens_device = nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True)\n",
    "    if num_needed_tokens > 0:\n"
    "        cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)\n"
    "        nxt_kv_lens_device = nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True)\n"
    "    else:  # hostsync: alloc_for_spec_decode reads the device lengths only when it allocates\n"
    "        cur_kv_lens_device = nxt_kv_lens_device = None\n",
)

PREPARE_ONCE = PinnedEdit(NAME, PREPARE, (LAZY_EDIT,), dict, PREPARE_SHA)


def _upstream() -> str | None:
    return PREPARE_ONCE.check() or pinned_sources(PINS, "the allocation that reads the device lengths")


def inert(f) -> str | None:
    return not_eagle_or_ngram(f, "only EAGLE-family and NGRAM decode prep runs eagle_prepare_for_decode "
                                 "(DFlash and UNO prepare their own)")


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE-family / NGRAM decode prep)",
    summary="the decode prep's two KV-length H2D copies only on steps that allocate KV (the others "
            "never read them)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, _upstream),
    inert=inert,
    targets=(PREPARE_ONCE.target(),),
)
