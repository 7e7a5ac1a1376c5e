"""The #31468 mechanisms: in SGLang since 0.5.16, verified here, never re-implemented.

Each slot's contract check drives the installed SGLang's own code with stand-in
inputs on the CPU and fails if the mechanism is missing or reverted. The checks
run before any hook is registered (doctor, launcher, every process); none needs
a GPU or a model.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping

from ..slot import Slot, SlotKind

ORIGIN = "sglang#31468"


class _NoD2H:
    """Mixin for a stand-in device tensor: any host read of its values raises."""

    def _d2h(self, *args, **kwargs):
        raise _HostRead(type(self).__name__)

    max = item = cpu = tolist = numpy = __bool__ = __int__ = _d2h


class _HostRead(RuntimeError):
    pass


def _no_d2h(t):
    import torch

    cls = type("DeviceOnlyTensor", (_NoD2H, torch.Tensor), {})
    return t.as_subclass(cls)


def _guard(check: Callable[[], str | None]) -> Callable[[], str | None]:
    """Turn a missing symbol or an unexpected failure into the slot's refusal reason."""

    def run() -> str | None:
        try:
            return check()
        except (ImportError, AttributeError) as exc:
            return f"target missing: {type(exc).__name__}: {exc}"
        except _HostRead as exc:
            return f"contract broken: a host read of a device tensor ({exc})"
        except Exception as exc:  # the upstream code changed shape under the check
            return f"contract broken: {type(exc).__name__}: {exc}"

    run.__name__ = check.__name__
    run.__doc__ = check.__doc__
    return run


@_guard
def check_fused_compact_rebuild() -> str | None:
    """The compact draft-cache rebuild is one Triton kernel, and DFlash calls it."""
    from triton.runtime.jit import KernelInterface

    from sglang.kernels.ops.speculative import cache_locs
    from sglang.srt.speculative import dflash_worker_v2

    if not isinstance(cache_locs.rebuild_compact_draft_req_to_token, KernelInterface):
        return "contract broken: rebuild_compact_draft_req_to_token is not a Triton kernel"
    if dflash_worker_v2.rebuild_compact_draft_req_to_token_func is not cache_locs.rebuild_compact_draft_req_to_token_func:
        return "contract broken: DFlashWorkerV2 no longer calls rebuild_compact_draft_req_to_token_func"
    return None


@_guard
def check_host_envelope_bound() -> str | None:
    """The host seq_lens bound is min(len, window + page): >= the exact sawtooth,
    also when fed the reserved over-estimate."""
    import torch

    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    for window, page in ((8, 4), (13, 16), (5, 1)):
        worker = types.SimpleNamespace(draft_window_size=window, page_size=page, device="cpu")
        lens = torch.arange(0, 4 * (window + page), dtype=torch.int64)
        out = torch.empty_like(lens, dtype=torch.int32)
        DFlashWorkerV2._compute_compact_draft_seq_lens_host(worker, lens, out=out)
        envelope = torch.clamp(lens, max=window + (page if page > 1 else 0))
        if not torch.equal(out.to(torch.int64), envelope):
            return f"contract broken: host bound is not min(len, window+page) (window={window}, page={page})"
        # The host len is the reserved over-estimate of the device len: the bound
        # must still cover SGLang's exact (sawtooth) compact length.
        for over in range(page + 1):
            device_lens = torch.clamp(lens - over, min=0)
            exact = DFlashWorkerV2._compute_compact_draft_seq_lens(worker, device_lens)
            if bool((out.to(torch.int64) < exact.to(torch.int64)).any()):
                return f"contract broken: host bound under-shoots the exact compact length (window={window}, page={page})"
    return None


@_guard
def check_hybrid_needs_cpu_seq_lens() -> str | None:
    """HybridAttnBackend ORs needs_cpu_seq_lens over the sub-backends it runs."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.runtime_context import get_context

    runner = types.SimpleNamespace(
        kv_cache_dtype=None, token_to_kv_pool=None, req_to_token_pool=None,
        kv_index_translator=None, model_config=types.SimpleNamespace(context_len=1),
    )
    for mode in ("prefill", "decode"):
        with get_context().override_server_args(speculative_attention_mode=mode):
            for prefill in (False, True):
                for decode in (False, True):
                    got = HybridAttnBackend(
                        runner,
                        types.SimpleNamespace(needs_cpu_seq_lens=prefill),
                        types.SimpleNamespace(needs_cpu_seq_lens=decode),
                    ).needs_cpu_seq_lens
                    want = decode or (mode == "prefill" and prefill)
                    if got is not want:
                        return (
                            f"contract broken: HybridAttnBackend.needs_cpu_seq_lens={got} for "
                            f"prefill={prefill}, decode={decode}, mode={mode} (expected {want})"
                        )
    return None


class _StandInTpGroup:
    """A TP group of ``world_size`` ranks simulated in one process: the gathers
    return what each rank's shard of the head produces (first max, global id)."""

    def __init__(self, hidden, weight, world_size: int):
        import torch

        self.world_size = world_size
        shard = weight.shape[0] // world_size
        maxes, ids = [], []
        for rank in range(world_size):
            logits = hidden @ weight[rank * shard:(rank + 1) * shard].T
            value, index = torch.max(logits, dim=-1)
            maxes.append(value)
            ids.append(index + rank * shard)
        self._parts = {True: torch.cat(maxes), False: torch.cat(ids)}

    def all_gather_into_tensor(self, out, inp):
        out.copy_(self._parts[inp.dtype.is_floating_point])


@_guard
def check_draft_sampler_in_graph() -> str | None:
    """The DFlash greedy draft sampler is vocab-parallel (tp>1 folds into the draft
    graph) and picks exactly the full-vocab argmax, ties at shard boundaries included."""
    import torch

    from sglang.srt.environ import EnvBool
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

    field = _eager_sampler_field()
    if not isinstance(field, EnvBool) or field.default is not False:
        return "contract broken: SGLANG_DFLASH_EAGER_DRAFT_SAMPLER is not an EnvBool defaulting to off"
    gen = torch.Generator().manual_seed(0)
    block, bs, hidden_dim, tp = 4, 3, 8, 2
    vocab = 16 * tp
    weight = torch.randn(vocab, hidden_dim, generator=gen)
    hidden = torch.randn(bs * block, hidden_dim, generator=gen)
    # A tie across the shard boundary: rows 15 and 16 (ranks 0 and 1) are equal and,
    # through a constant hidden feature, the top score of every token.
    hidden[:, -1] = 1.0
    weight[16] = weight[15]
    weight[15, -1] = weight[16, -1] = 100.0
    drafts = hidden.view(bs, block, -1)[:, 1:, :].reshape(-1, hidden_dim)
    want = torch.argmax(drafts @ weight.T, dim=-1)
    shard = vocab // tp
    for rank in range(tp):
        sampler = _DflashDraftSampler(
            weight=weight[rank * shard:(rank + 1) * shard], block_size=block, num_org=shard,
            org_vocab_start=rank * shard, max_bs=bs,
            tp_group=_StandInTpGroup(drafts, weight, tp),
        )
        sampler(hidden)
        got = sampler.out[: drafts.shape[0]]
        if not torch.equal(got, want):
            return f"contract broken: vocab-parallel draft sampler on rank {rank} differs from the full-vocab argmax"
    return None


def _eager_sampler_field():
    from sglang.srt.environ import Envs

    return vars(Envs).get("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER")


def eager_sampler_warning(env: Mapping[str, str]) -> str | None:
    from ..switches import env_value

    if _eager_sampler_field() is not None and env_value("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER", env):
        return (
            "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 re-adds the eager DFlash draft sampler "
            "between the draft and verify graphs (a per-step host launch cluster)"
        )
    return None


@_guard
def check_filter_batch_host_keep_list() -> str | None:
    """filter_batch indexes the host lens with the scheduler's host keep list
    (no D2H of the device index tensor), and ScheduleBatch passes that list."""
    import torch

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    if "new_indices_cpu" not in inspect.signature(DFlashDraftInputV2.filter_batch).parameters:
        return "contract broken: DFlashDraftInputV2.filter_batch takes no host keep list"
    if "new_indices_cpu=" not in inspect.getsource(ScheduleBatch.filter_batch):
        return "contract broken: ScheduleBatch.filter_batch does not pass its host keep list"
    lens = torch.tensor([7, 3, 11, 5, 2], dtype=torch.int64)
    keep = [4, 0, 2]
    info = object.__new__(DFlashDraftInputV2)
    info.nxt_kv_lens_cpu = lens.clone()
    info.future_indices = torch.arange(5)
    info.filter_batch(new_indices=_no_d2h(torch.tensor(keep)), new_indices_cpu=keep)
    if not torch.equal(info.nxt_kv_lens_cpu, lens[keep]) or info.nxt_kv_lens_sum != int(lens[keep].sum()):
        return "contract broken: filter_batch kept the wrong host lens"
    return None


@_guard
def check_trtllm_mla_host_max() -> str | None:
    """TRT-LLM MLA decode/verify metadata takes max_seq from the host mirror or the
    static context bound, never from a device ``.max().item()``."""
    import torch

    from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_context

    backend = object.__new__(TRTLLMMLABackend)
    backend._kv_shard_pool = None
    backend.max_context_len, backend.num_draft_tokens = 4096, 4
    backend._calc_padded_blocks = lambda max_seq: max_seq
    backend._create_block_kv_indices = lambda *args: None
    host = torch.tensor([5, 9, 3])
    with get_context().override_server_args():
        for mode, extra in ((ForwardMode.DECODE, 0), (ForwardMode.TARGET_VERIFY, 4)):
            for seq_lens_cpu, want in ((None, 4096), (host, 9)):
                batch = types.SimpleNamespace(
                    forward_mode=mode, batch_size=3, seq_lens=_no_d2h(host.clone()),
                    seq_lens_cpu=seq_lens_cpu, kv_loc_plan=None, req_pool_indices=None,
                )
                backend.init_forward_metadata(batch)
                got = backend.forward_decode_metadata.max_seq_len_k
                if got != want + extra:
                    return f"contract broken: {mode.name} max_seq_len_k={got}, expected {want + extra}"
    return None


def _builtin(name, summary, check, env_warning=None) -> Slot:
    return Slot(
        name=name, kind=SlotKind.UPSTREAM_BUILTIN, origin=ORIGIN, summary=summary,
        default=True, precheck=check, env_warning=env_warning,
    )


SLOTS = (
    _builtin("fused_compact_rebuild", "DFlash compact draft-cache rebuild in one Triton kernel",
             check_fused_compact_rebuild),
    _builtin("host_envelope_bound", "host seq_lens planning bound min(len, window+page), no D2H",
             check_host_envelope_bound),
    _builtin("hybrid_needs_cpu_seq_lens", "HybridAttnBackend ORs needs_cpu_seq_lens over its sub-backends",
             check_hybrid_needs_cpu_seq_lens),
    _builtin("draft_sampler_in_graph", "vocab-parallel DFlash draft sampler inside the draft graph",
             check_draft_sampler_in_graph, env_warning=eager_sampler_warning),
    _builtin("filter_batch_host_keep_list", "filter_batch uses the host keep list, no index D2H",
             check_filter_batch_host_keep_list),
    _builtin("trtllm_mla_host_max", "trtllm-MLA metadata without a device .max().item()",
             check_trtllm_mla_host_max),
)
