"""Slot ``spec_kernel_replay``: SGLang's own small Triton wrappers of the EAGLE v2 step relaunch
their recorded kernels per operand signature instead of going through Triton's JIT dispatch.

After the plugin's other host slots, Triton's per-call JIT dispatch of SGLang's small
speculative kernels was the largest remaining item of host work outside graphs that is not
model code: in a real STANDALONE topk 1 server (H200, py-spy, 2026-12-04) about 3% of the
scheduler thread's time, most of it in the wrappers below, each called once or twice a step.
SGLang 0.5.23 ships the remedy for its own diffusion kernels (``fast_launch.replay_launches``,
see ``triton_replay_launch``): record a wrapper's Triton launches on the first call of an
operand signature, then relaunch the compiled kernels on the new tensors (same kernels, grids
and arguments: bit-identical). Its contract (Triton launches over the inputs and over outputs
allocated with ``torch.empty*``; choices fixed by shapes, strides, dtypes, devices, alignment
and scalars) holds for each wrapper hooked here (read from the pinned sources), and its
recording refuses what it can see breaking it (other aten ops, reads of tensor values,
launches on temporaries): such a signature keeps SGLang's path.

``replay_launches`` accepts a tensor or a flat tuple of tensors as the result; these wrappers
return nested tuples with ``None`` holes (``prepare_draft_extend_layout``, ``gather_spec_extras``
without hidden states). ``Replay`` is SGLang's wrapper with the result flattened for the
recording and rebuilt after each replay; the recording, the plan and the relaunch are SGLang's
(``_signature``, ``_record``, ``_Plan``).
``prepare_verify_commit_outputs`` is replayed from a copy with one line edited: SGLang's recording
guard counts its ``torch.promote_types`` (which dispatches ``aten.promote_types``) as an op other
than an allocation, so each of its signatures kept the JIT (H200, 2026-12-04); the copy reads the
same dtype from a table made at import.
``SGLANG_DIFFUSION_TRITON_FAST_LAUNCH=0`` (SGLang's kill switch) turns it off, as for
``triton_replay_launch``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from sglang.kernels.ops.diffusion.common import fast_launch

from ..slot import HookTarget, Slot, SlotKind, TargetKind, config_precheck, not_speculative
from ..source_edit import PinnedEdit
from . import triton_replay_launch
from .upstream_switches import HOST_PRESET

NAME = "spec_kernel_replay"
MAX_PLANS = 256  # operand signatures kept per wrapper; later new ones run SGLang's wrapper as is
_RAW = object()  # a result this module does not flatten: the signature keeps SGLang's path


def _flatten(out, leaves: list):
    """A template of ``out`` (tensor -> its index in ``leaves``, None, tuple), or _RAW."""
    if isinstance(out, torch.Tensor):
        leaves.append(out)
        return len(leaves) - 1
    if out is None:
        return None
    if type(out) is tuple:
        parts = tuple(_flatten(x, leaves) for x in out)
        return _RAW if _RAW in parts else parts
    return _RAW


def _build(template, flat):
    if type(template) is int:
        return flat[template]
    if template is None:
        return None
    return tuple(_build(t, flat) for t in template)


@dataclass
class Replay:
    """One wrapper's plans: signature key -> (SGLang's plan or _NORMAL, the result's template)."""

    fn: Callable
    plans: dict = field(default_factory=dict)

    def __call__(self, *args, **kwargs):
        fl = fast_launch
        # is_compiling first, as SGLang's wrapper: Dynamo traces fn without guarding on _ENABLED.
        if torch.compiler.is_compiling() or not fl._ENABLED or fl._recording.active:
            return self.fn(*args, **kwargs)
        key, inputs = fl._signature(args, kwargs)
        if key is None:
            return self.fn(*args, **kwargs)
        entry = self.plans.get(key)
        if entry is None:
            return self._record(key, inputs, args, kwargs)
        plan, template = entry
        if plan is fl._NORMAL or torch.accelerator.current_device_index() != plan.device:
            return self.fn(*args, **kwargs)
        return _build(template, plan.replay(inputs))

    def _record(self, key, inputs, args, kwargs):
        if len(self.plans) >= MAX_PLANS:
            return self.fn(*args, **kwargs)
        box = []

        def flat(*a, **kw):
            out = self.fn(*a, **kw)
            leaves = []
            template = _flatten(out, leaves)
            box.append((out, template))
            # A non-tensor in the result makes SGLang's _plan keep the normal path.
            return (out,) if template is _RAW else tuple(leaves)

        try:
            _, plan = fast_launch._record(flat, args, kwargs, inputs)
        except Exception:
            if not box:  # SGLang's wrapper itself raised: as in stock
                raise
            plan = fast_launch._NORMAL  # the recording broke after the wrapper ran: keep SGLang's path
        out, template = box[0]
        if plan is not None:  # None: another thread was recording; record this key next time
            self.plans[key] = (fast_launch._NORMAL if template is _RAW else plan, template)
        return out


_replays: dict = {}


def replay_of(fn: Callable) -> Replay:
    """The one ``Replay`` of an upstream wrapper (per process)."""
    r = _replays.get(fn)
    if r is None:
        r = _replays[fn] = Replay(fn)
    return r


def replay_hook(original, *args, **kwargs):
    return replay_of(original)(*args, **kwargs)


VERIFY_COMMIT = "sglang.kernels.ops.speculative.eagle.prepare_verify_commit_outputs"
VERIFY_COMMIT_PARAMS = ("predict", "accept_index", "accept_lens", "seq_lens", "num_draft_tokens",
                        "mamba_track_interval")
PROMOTE_EDIT = ("dtype=torch.promote_types(seq_lens.dtype, accept_lens.dtype)",
                "dtype=_hostsync_promote(seq_lens.dtype, accept_lens.dtype)")
VERIFY_COMMIT_EDIT = PinnedEdit(NAME, VERIFY_COMMIT, (PROMOTE_EDIT,),
                                lambda: {"_hostsync_promote": triton_replay_launch.promote},
                                "85acedeb2fe6d5cf")


def verify_commit_hook(original, *args, **kwargs):
    return replay_of(VERIFY_COMMIT_EDIT(original))(*args, **kwargs)


# (path, parameters, source sha of SGLang 0.5.23): the EAGLE v2 step's small Triton wrappers
# that keep to replay_launches' contract. Callers: FutureMap._resolve_spec_extras,
# eagle_worker_common (draft cache locs, draft extend layout), eagle_utils (verify cache locs),
# eagle_worker_v2 (draft extend inputs, imported at call time); and VERIFY_COMMIT (run_eagle_verify).
WRAPPERS = (
    ("sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras",
     ("indices", "topk_p_buf", "topk_index_buf", "output_tokens_buf", "hidden_states_buf"), "d2e35aaf6abd7a83"),
    ("sglang.kernels.ops.speculative.cache_locs.assign_draft_cache_locs_contiguous_func",
     ("req_pool_indices", "req_to_token", "seq_lens", "out_cache_loc", "topk", "num_cols", "positions", "mrope"),
     "fffc7b57bab54d17"),
    ("sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func",
     ("req_pool_indices", "req_to_token", "start_offset", "batch_size", "draft_token_num", "device", "full_v2p",
      "swa_v2p", "full_out", "swa_out", "page_size", "positions_out", "anchor_src", "anchor_out"), "f436af338700e77b"),
    ("sglang.kernels.ops.speculative.eagle.prepare_draft_extend_layout",
     ("seq_lens", "num_draft_tokens", "with_mrope"), "9cb0fc4666411998"),
    ("sglang.kernels.ops.speculative.eagle.prepare_draft_extend_inputs",
     ("accept_lens", "predict", "num_draft_tokens"), "6a7478d54a5f38e9"),
)


def inert(f) -> str | None:
    return not_speculative(f, "SGLang's wrappers it replays run only in EAGLE-family steps",
                           bool(f.speculative_algorithm) and f.is_eagle_family())


def prepare(facts) -> str:
    return f"{len(WRAPPERS) + 1} SGLang Triton wrappers replay their launches per operand signature"


SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="sglang 0.5.23 replay_launches (fast_launch), applied to SGLang's EAGLE v2 step wrappers",
    summary="SGLang's small speculative Triton wrappers relaunch recorded kernels per operand signature (no JIT dispatch)",
    default=False,
    presets=(HOST_PRESET,),
    precheck=config_precheck(None, lambda: triton_replay_launch.pinned_sources() or VERIFY_COMMIT_EDIT.check()),
    inert=inert,
    env_warning=triton_replay_launch.env_warning,
    prepare=prepare,
    targets=tuple(
        HookTarget(path, TargetKind.FUNCTION, hook=replay_hook, params=params, source_sha=sha)
        for path, params, sha in WRAPPERS
    ) + (HookTarget(VERIFY_COMMIT, TargetKind.FUNCTION, hook=verify_commit_hook, params=VERIFY_COMMIT_PARAMS,
                    source_sha=VERIFY_COMMIT_EDIT.sha, needs_upstream_original=True),),
)
