"""``SGLANG_HOSTSYNC_SLOTS=auto``: the slot set the real-traffic runs measured identical to stock and
fastest for the server's kind of configuration.

The choice is data: one row per configuration class, with the spec it picks and the results folder
that backs it. A configuration no row covers gets ``default`` and says so. The plan applies the pick
once the server facts decide the class (``pick`` returns None while SGLang has not resolved the topk
or the attention backend yet); until then the selection is every row's slots, so the plan only
narrows (``plan.Plan.with_facts``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .slot import ServingFacts, Slot

AUTO = "auto"
CONSERVATIVE = "default"
FIRST = "benchmarks/results/2026-12-06-h100-real-traffic/"
SECOND = "benchmarks/results/2026-12-06-h100-real-traffic-b/"
FINAL = "benchmarks/results/2026-12-06-h100-final/"
RERUN = "benchmarks/results/2026-12-07-h100/"
BLOCKS = "benchmarks/results/2026-12-07-h100-b/"
MATRIX = "benchmarks/results/2026-12-07-h100-c/"
LATEST = "benchmarks/results/2026-12-07-h100-d/"
FI_AUTO = "benchmarks/results/2026-12-07-h100-e/"
DEVICE_PLAN = "benchmarks/results/2026-12-07-h100-f/"
NO_SYNC = "benchmarks/results/2026-12-08-h100/"


@dataclass(frozen=True)
class Choice:
    label: str  # the configuration class, as the status line says it
    spec: str  # what SGLANG_HOSTSYNC_SLOTS it amounts to
    evidence: str | None  # the results folder(s), comma-separated; None: nobody measured this class
    gain: str = ""  # tok/s/user over stock at c1 / c8 (real acceptance, H100)


@dataclass(frozen=True)
class Row:
    applies: Callable[[ServingFacts, str], bool]  # (facts, target backend) -> this class
    choice: Choice


def _eagle(topk_one: bool | None, backend: str, paged: bool | None = True):
    def applies(f: ServingFacts, be: str) -> bool:
        # FROZEN_KV_MTP (its own worker) is in SGLang's EAGLE family but was never measured.
        return (f.is_eagle_family() and not f.is_frozen_kv_mtp()
                and be == backend and (paged is None or ((f.page_size or 1) > 1) == paged)
                and (topk_one is None or (f.topk == 1) == topk_one))
    return applies


ROWS = (
    Row(_eagle(True, "triton", paged=None), Choice(
        "EAGLE family, topk 1, triton", "default,eagle_step_graph", f"{SECOND}, {MATRIX}",
        "EAGLE3 page 16 1.88x / 1.62x, STANDALONE page 1 2.06x / 1.62x")),
    Row(_eagle(False, "triton"), Choice(
        "EAGLE family, topk > 1, triton, page > 1", "default,eagle_host", f"{FIRST}, {SECOND}",
        "STANDALONE 1.56x / 1.40x, EAGLE3 1.58x / 1.42x")),
    Row(_eagle(False, "triton", paged=False), Choice(
        "EAGLE family, topk > 1, triton, page 1", "default,eagle_host", FINAL, "STANDALONE 1.35x / 1.24x")),
    # flashinfer_device_plan at topk 1 (host-bound target) over its base: 1.22x c1 unaudited, 0.95x c8 audited (round
    # medians), inside the noise.
    Row(_eagle(True, "flashinfer"), Choice(
        "EAGLE family, topk 1, FlashInfer, page > 1", "default,flashinfer,eagle_host,-metadata_glue_graph",
        f"{SECOND}, {FINAL}, {FI_AUTO}, {DEVICE_PLAN}", "0.99-1.17x / 0.92-1.10x")),
    # Base set 1.22-1.30x / 1.23-1.35x (FI_AUTO, SECOND); the device plan over it, audited: 1.16x / 1.08x ("small"),
    # 1.04x / 1.13x (8B-shaped). flashinfer_prefill_host_indptr waits for a run with SGLang's prefill CUDA graphs on.
    Row(_eagle(False, "flashinfer"), Choice(
        "EAGLE family, topk > 1, FlashInfer, page > 1",
        "default,flashinfer,eagle_host,-metadata_glue_graph,flashinfer_device_plan",
        f"{FI_AUTO}, {DEVICE_PLAN}, {NO_SYNC}", "STANDALONE 1.05-1.30x / 1.02-1.23x")),
    # ngram_device_draft read faster (1.13-1.49x / 1.19-1.31x) but changed 2 of 25 outputs on prompts its drafts
    # rarely accept (LATEST): picks must be identical to stock.
    Row(lambda f, be: f.is_ngram() and be == "triton" and f.page_size == 1, Choice(
        "NGRAM, triton, page 1", "default,eagle_host,ngram_host", f"{RERUN}, {LATEST}", "1.03-1.23x / 1.08-1.24x")),
    # Each step graph is inert in the other's configuration (DFlash's worker is not DSpark's).
    Row(lambda f, be: f.is_dflash() and be == "triton" and f.page_size > 1, Choice(
        "DFlash, triton, page > 1", "default,dflash_step_graph", f"{BLOCKS}, {MATRIX}", "2.44-3.08x / 1.50-1.97x")),
    Row(lambda f, be: f.is_dspark() and be == "triton" and f.page_size > 1, Choice(
        "DSpark, triton, page > 1", "default,dspark_step_graph", f"{BLOCKS}, {MATRIX}, {LATEST}",
        "2.04-2.19x / 1.45-1.84x")),
    # default,eagle_host,ngram_host read 0.995x / 1.325x beside it: faster at c8 only.
    Row(lambda f, be: f.is_ngram() and be == "flashinfer" and f.page_size == 1, Choice(
        "NGRAM, FlashInfer, page 1", CONSERVATIVE, MATRIX, "1.08x / 1.24x")),
)


def _unmeasured(why: str) -> Choice:
    return Choice(f"not measured ({why})", CONSERVATIVE, None)


def undecided() -> Choice:
    """What a pick the facts never decided falls back to."""
    return _unmeasured("the server facts left the configuration open")


def pick(f: ServingFacts | None) -> Choice | None:
    """The choice for these facts; None while they leave the class open (no facts, an EAGLE-family
    topk or an attention backend SGLang has not resolved yet)."""
    if f is None:
        return None
    if not f.speculative_algorithm:
        return _unmeasured("no speculative decoding")
    # Every measured server: one GPU, overlap on, CUDA graphs, no adaptive steps; an EAGLE-family (not
    # FROZEN_KV_MTP), NGRAM, DFlash or DSpark algorithm. These decide before SGLang resolves the rest.
    if not ((f.is_eagle_family() and not f.is_frozen_kv_mtp()) or f.is_ngram() or f.is_dflash() or f.is_dspark()):
        return _unmeasured(f"{f.speculative_algorithm}")
    for on, why in ((f.tp_size > 1 or f.dp_attention, "tensor or attention DP parallel"),
                    (f.pp_size > 1, "pipeline parallel"),
                    (f.disaggregation_mode != "null", f"PD disaggregation ({f.disaggregation_mode})"),
                    (f.two_batch_overlap, "two-batch overlap"), (f.disable_overlap_schedule, "overlap off"),
                    (f.speculative_adaptive, "adaptive steps"), (f.disable_cuda_graph, "CUDA graphs off"),
                    (f.enable_lora, "LoRA"), (f.enable_pdmux, "pdmux"), (f.moe_counts, "MoE token counts"),
                    (f.expert_distribution, "expert distribution recording"),
                    (f.returns_capture_outputs, "routed-expert / indexer outputs")):
        if on:
            return _unmeasured(why)
    prefill, decode = f.attention_backends
    if (f.is_eagle_family() and f.topk is None) or prefill is None or decode is None or f.page_size is None:
        return None
    # An EAGLE draft backend left unset is the prefill backend (SGLang's resolve_draft_worker_attention_backend):
    # no later re-pick.
    for on, why in ((prefill != decode, f"prefill {prefill}, decode {decode}"),
                    (f.draft_attention_backend not in (None, decode), f"draft {f.draft_attention_backend}")):
        if on:
            return _unmeasured(why)
    for row in ROWS:
        if row.applies(f, decode):
            return row.choice
    return _unmeasured(f"{f.speculative_algorithm}, {decode}, topk {f.topk}, page {f.page_size}")


def is_auto(spec: str) -> bool:
    return any(t.strip().lower() == AUTO for t in spec.split(","))


def row_names(catalogue: Mapping[str, Slot], parse) -> set[str]:
    """Every slot some choice picks (``parse``: the grammar, ``config.parse_slot_spec``)."""
    names = set(parse(CONSERVATIVE, catalogue).names)
    for row in ROWS:
        names |= set(parse(row.choice.spec, catalogue).names)
    return names


def pinned(choice: Choice, spec: str) -> str:
    """The ``SGLANG_HOSTSYNC_SLOTS`` value that pins ``choice`` (the user's other tokens kept)."""
    rest = [t.strip() for t in spec.split(",") if t.strip() and t.strip().lower() != AUTO]
    return ",".join([choice.spec, *rest])


def line(choice: Choice, spec: str) -> str:
    """The status line and the doctor's: what was chosen, why, and how to pin it."""
    why = f"measured {choice.gain} stock at c1 / c8 ({choice.evidence})" if choice.evidence \
        else "the conservative set"
    if choice.evidence and pinned(choice, spec) != choice.spec:  # e.g. auto,-eagle_step_graph
        why += f", for {choice.spec} itself: your other tokens change that set, not measured"
    return f"auto: {choice.label}: {why}; pin it with SGLANG_HOSTSYNC_SLOTS={pinned(choice, spec)}"
