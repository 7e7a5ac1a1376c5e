"""SGLang functions that more than one slot edits (``source_edit.EditSite``): each slot adds its
own snippets to the site here, and the installer hooks the function once for all of them."""

from __future__ import annotations

from ..source_edit import EditSite

DRAFT_EXTEND = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"
DRAFT_EXTEND_SHA = "43fac9eb9ad0ac5e"

# greedy_row_argmax (the topk-1 branch's argmax), draft_extend_topk_graph (the topk > 1 branch).
DRAFT_EXTEND_SITE = EditSite(DRAFT_EXTEND, DRAFT_EXTEND_SHA)

NGRAM_PREPARE = "sglang.srt.speculative.ngram_worker.NGRAMWorker._prepare_for_speculative_decoding"
NGRAM_PREPARE_SHA = "7417a9ce177df775"

# ngram_full_mask (the full verify mask from the device tree), ngram_device_draft (the draft on the device).
NGRAM_PREPARE_SITE = EditSite(NGRAM_PREPARE, NGRAM_PREPARE_SHA)
