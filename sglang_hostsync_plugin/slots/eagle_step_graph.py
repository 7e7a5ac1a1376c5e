"""Slot ``eagle_step_graph``: an EAGLE v2 topk-1 decode step replayed as one CUDA graph launch
(design notes in docs/host-work.md).

SGLang 0.5.23's ``EAGLEWorkerV2.forward_batch_generation`` runs three CUDA graphs per decode step
(draft, target verify, draft extend) and, between them, a few milliseconds of Python that stages
their inputs and launches the eager glue (verify input, greedy verify, commit, draft-extend
layout, next draft input). At topk 1 that glue is most of a step's host work. This slot runs
the whole decode branch once per batch size under CUDA graph capture, in segments cut at the
three runners' replays, and joins the segments and SGLang's own runner graphs (as child nodes,
the same graphs, unchanged) into one graph per batch size. Each later step of that batch size:

- copies this step's input tensors (``ScheduleBatch``, its draft input and sampling info; the
  ``*_INPUTS`` names below) into the tensors the capture read, in one ``_foreach_copy_``;
- launches the joined graph on the current stream (one driver call);
- returns the captured ``GenerationBatchResult`` with its host-read tensors cloned (the scheduler
  reads them on its copy stream while the next step runs) and calls ``on_publish`` after it.

The step stays on SGLang's eager path (counted by reason) unless every Python-visible decision
of the branch is fixed by the batch size: decode (not idle, not extend), topk 1, drafting on,
no PP, greedy sampling, no logprobs / hidden states / grammar / penalties / logit bias /
watermark / hisparse / mamba tracking / multimodal inputs (an mrope model's text-only position
path is the one captured), no host copy of the sequence lengths (``seq_lens_cpu``, kept without
overlap scheduling: the draft extend would stage the capture step's lengths), and no CUDA tensor
on those three objects besides the named inputs, each with the shape it had at capture (checked
on every step: one pass over the three objects' attributes, a few µs). Server-wide, checked once
in the scheduler before the first capture (their facts are not among the startup facts the slot's
``inert`` sees): PP, rejection sampling, DSA top-k seeding, no overlap scheduling,
``--speculative-adaptive`` (it changes the step count at run time), a decode CUDA-graph backend
other than ``full`` or runner graphs in the memory saver's memory, ``--enable-unified-memory`` (the
scheduler reads the ``out_cache_loc`` a replay leaves unset), and what a replay would hand
out stale (``--enable-return-routed-experts``, ``--enable-return-indexer-topk``, expert
distribution recording / EPLB). A captured step whose result carries any other output the
scheduler reads (``GenerationBatchResult.copy_to_cpu``) besides the three cloned ones turns the
slot off. SGLang's simulated acceptance (``SGLANG_SIMULATE_ACC_LEN``, benchmarks only) draws its
length on the host: the slot is inert unless that draw is constant (an integral length with the
default ``match-expected``).

Each batch size's first two eligible steps run eagerly (Triton compiles, allocations), the
third is captured (torch's capture on a side stream; the runners' graphs are kept at startup,
``keep_graph=True``, so they can be children), then replayed. A capture that raises is ended on
its own stream (inside the stream block; if torch raised before ending it, the driver ends it) and
torch's pool routing for it is undone; that batch size and layout is tried again after as many
eager steps, at most ``MAX_FAILURES`` times, and ``MAX_FAILED`` failures in all turn capturing off.
Any runner capture after startup (SGLang re-capturing or replacing a runner: a weight update with
``recapture_cuda_graph``, whose new runner re-allocates the attention backend's graph buffers)
drops every step graph and the runner graphs they hold; a runner that re-captures one shape in
place drops the graphs joined from it.

Memory: the step graphs' tensors live in a private pool outside SGLang's ``--mem-fraction-static``
budget: each graph keeps the inputs it reads and the outputs it writes (tensors of batch-size x
hidden-size order), and the pool keeps the largest step's temporaries (graphs replay one at a time
on one stream, so their temporaries share blocks); a failed capture's temporaries stay in the pool
it used and the next capture goes into a fresh pool, as does any capture once no held graph was
captured into the current pool (torch refuses a capture into a pool whose graphs are all gone). At
most ``SGLANG_HOSTSYNC_STEP_GRAPH_MAX`` graphs (default 16) are captured per process;
the capture and replay log lines give the graph count and the pool's growth (reserved bytes over
the captures). Budget that figure as GPU memory outside SGLang's: lower ``--mem-fraction-static``
by it where the GPU is full, or lower the graph limit.

``SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=N`` (default 0, off): after every Nth replay SGLang's eager step
runs on the same batch and its outputs (next tokens, accept lengths, new sequence lengths, the next
draft input) are compared with the replay's on the device (the glue slots' ``run_check``); serving
gets SGLang's result on those steps; the mismatch count comes back without waiting for the GPU and
is logged. Opt-in, not in any preset.
``SGLANG_HOSTSYNC_STEP_GRAPH_MAX=N`` (default 16): the most step graphs held; batch sizes and layouts
past it stay eager.
Hook targets: ``EAGLEWorkerV2.forward_batch_generation``, ``FullCudaGraphBackend.capture_one``
and ``FullCudaGraphBackend.replay`` (AROUND).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import logging
import sys
from dataclasses import dataclass, field

import torch

from ..slot import HookTarget, ServingFacts, Slot, SlotKind, TargetKind, config_precheck
from . import audit_phases
from .draft_extend_glue_graph import CheckTally, glue_inert, run_check

logger = logging.getLogger("sglang.srt.plugins.hostsync")

NAME = "eagle_step_graph"
WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
BACKEND_MODULE = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
BACKEND = f"{BACKEND_MODULE}.FullCudaGraphBackend"
ENV_CHECK = "SGLANG_HOSTSYNC_STEP_GRAPH_CHECK"
ENV_MAX = "SGLANG_HOSTSYNC_STEP_GRAPH_MAX"
WARMUPS = 2
MAX_GRAPHS = 16  # default of ENV_MAX, per process: batch sizes x input layouts
MAX_FAILURES = 2  # failed captures of one batch size and layout before it stays SGLang's
MAX_FAILED = 8  # failed captures in all before capturing stops

# The tensors a topk-1 decode step reads from the scheduler's objects (batch, draft input,
# sampling info); any other CUDA tensor there keeps the step eager.
BATCH_INPUTS = ("input_ids", "req_pool_indices", "seq_lens", "orig_seq_lens", "out_cache_loc")
DRAFT_INPUTS = ("topk_p", "topk_index", "hidden_states", "bonus_tokens", "future_indices", "kv_indptr",
                "kv_indices")
SAMPLING_INPUTS = ("temperatures", "top_ps", "top_ks", "min_ps", "sampling_seed", "rids_int")
INPUTS = (BATCH_INPUTS, DRAFT_INPUTS, SAMPLING_INPUTS)
# Read on the host or on the copy stream after the next step was launched: cloned per step.
CLONED = ("next_token_ids", "accept_lens", "new_seq_lens")
# The rest of what the scheduler reads of a result (``GenerationBatchResult.copy_to_cpu``, where
# logprobs and hidden states are per-step rules above); a captured result carrying any of them
# turns the slot off: a replay would hand out the capture step's objects.
SIDE_OUTPUTS = ("block_accept_lens", "cap_lens", "routed_experts_output", "indexer_topk_output",
                "expert_distribution_metrics", "auxiliary_host_output")
LOGITS_SIDE_OUTPUTS = ("sampling_mask_output", "auxiliary_device_output")


def check_every(env=None) -> int:
    from ..config import env_count

    return env_count(ENV_CHECK, 0, env, minimum=0, hint="use 0 (off) or a positive number of replayed steps")


def max_graphs(env=None) -> int:
    from ..config import env_count

    return env_count(ENV_MAX, MAX_GRAPHS, env, minimum=1, hint="use a positive number of step graphs")


def settings(env=None) -> tuple[int, int]:
    return check_every(env), max_graphs(env)


# --- the driver calls that join graphs (torch has no API for child graph nodes) ---


class Driver:
    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        for name in ("cuGraphCreate", "cuGraphAddChildGraphNode", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
                     "cuGraphExecDestroy", "cuGraphDestroy", "cuGraphGetNodes", "cuStreamEndCapture"):
            getattr(lib, name).restype = ctypes.c_int
        self.lib = lib

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed (CUresult {rc})")

    def nodes(self, graph: int) -> int:
        n = ctypes.c_size_t(0)
        self._ok(self.lib.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
        return n.value

    def chain(self, graphs: list[int]) -> tuple[int, int]:
        """One graph running ``graphs`` in order as child nodes, and its executable."""
        parent = ctypes.c_void_p()
        self._ok(self.lib.cuGraphCreate(ctypes.byref(parent), 0), "cuGraphCreate")
        try:
            prev = None
            for graph in graphs:
                node = ctypes.c_void_p()
                deps, n = (None, 0) if prev is None else (ctypes.byref(prev), 1)
                self._ok(self.lib.cuGraphAddChildGraphNode(ctypes.byref(node), parent, deps, n,
                                                           ctypes.c_void_p(graph)), "cuGraphAddChildGraphNode")
                prev = node
            exe = ctypes.c_void_p()
            self._ok(self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), parent, 0), "cuGraphInstantiate")
        except Exception:
            self.lib.cuGraphDestroy(parent)
            raise
        return parent.value, exe.value

    def launch(self, exe: int, stream: int) -> None:
        self._ok(self.lib.cuGraphLaunch(ctypes.c_void_p(exe), ctypes.c_void_p(stream)), "cuGraphLaunch")

    def destroy(self, parent: int, exe: int) -> None:
        self.lib.cuGraphExecDestroy(ctypes.c_void_p(exe))
        self.lib.cuGraphDestroy(ctypes.c_void_p(parent))

    def end_capture(self, stream: int) -> None:
        """End ``stream``'s capture whatever its state, and drop the (partial) graph."""
        graph = ctypes.c_void_p()
        self.lib.cuStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph))
        if graph.value:
            self.lib.cuGraphDestroy(graph)


# --- segmented capture (torch's CUDA calls behind small functions, replaced by fakes in CPU tests) ---


def new_graph():
    return torch.cuda.CUDAGraph(keep_graph=True)


def stream_handle() -> int:
    return torch.cuda.current_stream().cuda_stream


def side_stream(stream):
    """The capture's stream as the current one, after the work queued so far (the input copies)."""
    stream.wait_stream(torch.cuda.current_stream())
    return torch.cuda.stream(stream)


def capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def reserved() -> int:
    return torch.cuda.memory_reserved()


def capture_pool(r) -> object:
    """The private pool the next capture goes into: a fresh one unless a held step graph was captured
    into the current one. A pool lives while a graph captured into it does; torch refuses a capture into
    one whose graphs are all gone (an INTERNAL ASSERT, ``use_count > 0``: DFlash on an H100, 2026-12-07,
    after every graph went stale). ``pool_bytes`` counts on while other pools' graphs are held."""
    if not r.graphs:
        r.pool, r.pool_bytes = torch.cuda.graph_pool_handle(), 0
    elif r.pool is None or all(sg.pool != r.pool for sg in r.graphs.values()):
        r.pool = torch.cuda.graph_pool_handle()
    return r.pool


def release_pool(pool) -> None:
    """Undo what torch's ``capture_begin`` set up for ``pool`` where its ``capture_end`` raised before
    undoing it: the allocator routing the stream's allocations to the pool (a second capture into it
    would be refused) and the graph's share of the pool (its ``reset`` releases it only after a capture
    that ended). Nothing where ``capture_end`` got that far."""
    device = torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(device, pool)
    except Exception:  # noqa: BLE001 (not routing to the pool: capture_end undid it itself)
        return
    torch._C._cuda_releasePool(device, pool)


class Capture:
    """Segments of one captured step, cut where a runner would replay its graph: the parts in
    order, ("segment", graph) or ("child", backend, shape key, the runner's graph)."""

    def __init__(self, pool, new_graph=None):
        self.pool = pool
        self.new_graph = new_graph or globals()["new_graph"]
        self.parts: list[tuple] = []
        self.current = None

    def open(self) -> None:
        graph = self.new_graph()
        # thread_local: the scheduler's other threads (D2H worker) may use CUDA meanwhile.
        graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
        self.current = graph

    def close(self) -> None:
        self.current.capture_end()  # (if it raises, the segment stays open for abort)
        graph, self.current = self.current, None
        self.parts.append(("segment", graph))

    def cut(self, backend, key) -> None:
        graph = backend._graphs[key]
        graph.raw_cuda_graph()  # raises unless the runner kept its graph (keep_hook)
        self.close()
        self.parts.append(("child", backend, key, graph))
        self.open()

    def abort(self, driver) -> None:
        """End the open segment's capture after a failure. Called on the capture's stream (torch ends a
        capture only on the stream it began on); afterwards the stream is out of capture mode even
        where torch raised before ending it, and torch's pool routing for it is undone."""
        graph, self.current = self.current, None
        ended = True
        if graph is not None:
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 (the capture already failed; its error is reported)
                ended = False
        if capturing():
            driver.end_capture(stream_handle())
        if not ended:
            release_pool(self.pool)


def owners(batch) -> tuple:
    return batch, batch.spec_info, batch.sampling_info


def on_device(value) -> bool:
    return torch.is_tensor(value) and value.is_cuda


_INPUT_SETS = tuple(map(frozenset, INPUTS))


def stray_input(objs, sets=_INPUT_SETS, is_device=None) -> str | None:
    """A CUDA tensor on ``objs`` that is not one of the named inputs (``sets``: the names allowed per
    object) (the step might read it), or None. Every step: ``type(v) is Tensor`` first (``isinstance``
    goes through torch's metaclass, 3x slower)."""
    is_device = is_device or on_device  # (the module's, read per call: tests replace it)
    tensor = torch.Tensor
    for obj, names in zip(objs, sets):
        state = vars(obj)
        for key in [k for k, v in state.items() if type(v) is tensor]:
            if key not in names and is_device(state[key]):
                return f"{type(obj).__name__}.{key}"
    return None


def named(objs, inputs=INPUTS):
    """(object, name, value or None) for every named input, in ``inputs`` order."""
    for obj, names in zip(objs, inputs):
        for name in names:
            yield obj, name, getattr(obj, name, None)


def gather(objs, inputs=INPUTS) -> tuple[tuple, list]:
    """This step's named inputs: their layout (None or (shape, dtype) per name, part of a graph's
    key: a branch may test an input's presence) and the tensors present, in name order."""
    layout, tensors = [], []
    for _, _, value in named(objs, inputs):
        if value is None:
            layout.append(None)
        else:
            layout.append((value.shape, value.dtype))
            tensors.append(value)
    return tuple(layout), tensors


def present(objs, inputs=INPUTS) -> list[str]:
    """The named inputs present on ``objs``, with their shapes (for the log)."""
    return [f"{name}{list(value.shape)}" for _, name, value in named(objs, inputs) if value is not None]


def install(objs, tensors, inputs=INPUTS) -> None:
    """Put ``tensors`` (in ``gather``'s order) in place of the inputs present on ``objs``."""
    it = iter(tensors)
    for obj, name, value in list(named(objs, inputs)):
        if value is not None:
            setattr(obj, name, next(it))


@dataclass
class StepGraph:
    bs: int
    slots: list[torch.Tensor]  # what the graph reads, in ``gather``'s order
    result: object  # the captured GenerationBatchResult; its tensors are the graph's outputs
    parts: list[tuple]  # kept alive: the segments' memory is the graph's
    parent: int
    exe: int
    pool: object = None  # the private pool it was captured into (``capture_pool``)

    def current(self) -> bool:
        """The runners still hold the graphs this one was joined from."""
        return all(p[1]._graphs.get(p[2]) is p[3] for p in self.parts if p[0] == "child")

    def output(self):
        """A result for the scheduler: the captured one, host-read tensors cloned."""
        out = copy.copy(self.result)
        for name in CLONED:
            setattr(out, name, getattr(self.result, name).clone())
        out.next_draft_input = copy.copy(self.result.next_draft_input)
        out.extra_keep_alive_refs = list(self.result.extra_keep_alive_refs or ())
        return out


def side_output(result) -> str | None:
    """An output of the captured step, besides the cloned ones, that the scheduler reads, or None."""
    for name in SIDE_OUTPUTS:
        if getattr(result, name, None) is not None:
            return name
    logits = getattr(result, "logits_output", None)
    for name in LOGITS_SIDE_OUTPUTS:
        if getattr(logits, name, None) is not None:
            return f"logits_output.{name}"
    return None


def fingerprint(result) -> list[torch.Tensor]:
    """The step outputs the check compares, as raw bits (NaNs compare equal)."""
    nd = result.next_draft_input
    out = [getattr(result, name) for name in CLONED] + [nd.topk_index, nd.topk_p, nd.hidden_states, nd.bonus_tokens]
    bits = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return [t.clone() if not t.is_floating_point() else t.contiguous().view(bits[t.element_size()]).clone()
            for t in out if t is not None]


@dataclass
class Route:
    name: str = NAME  # the slot the log lines name (dflash_step_graph / dspark_step_graph reuse this class)
    check: int = 0
    max_graphs: int = MAX_GRAPHS
    graphs: dict = field(default_factory=dict)  # (batch size, input layout) -> StepGraph
    warm: dict = field(default_factory=dict)  # (batch size, input layout) -> eager eligible steps before capture
    failures: dict = field(default_factory=dict)  # (batch size, input layout) -> failed captures
    failed: int = 0  # failed captures in all
    capture: Capture | None = None  # set while a step is being captured
    disabled: str = ""  # why capture is off for good
    skip: set = field(default_factory=set)  # batch sizes left to SGLang (a runner cannot take them)
    pool: object = None
    pool_bytes: int = 0  # reserved memory grown over the captures into the current pool(s)
    stream: object = None
    driver: Driver | None = None
    replays: int = 0
    eager: dict = field(default_factory=dict)  # reason -> steps left to SGLang
    checks: int = 0
    tally: CheckTally = field(default_factory=CheckTally)

    @property
    def mismatches(self) -> int:
        return self.tally.mismatches

    def count_eager(self, reason: str) -> None:
        n = self.eager.get(reason, 0) + 1
        self.eager[reason] = n
        if n in (1, 100) or n % 10000 == 0:
            logger.info("hostsync: %s: %d steps stayed eager: %s (%d replayed so far)", self.name, n, reason,
                        self.replays)

    def held(self, new: int = 0) -> str:
        return f"{len(self.graphs) + new} graphs, pool {self.pool_bytes / 2**20:.1f} MiB"

    def drop(self, why: str) -> None:
        """Destroy every step graph, with the runner graphs and runners they hold, and start over
        (warm-up, batch sizes left to SGLang, a fresh pool: the old one is freed with its graphs)."""
        if not self.graphs and not self.warm:
            return
        logger.info("hostsync: %s: %s: dropping %s", self.name, why, self.held())
        for sg in self.graphs.values():
            self.driver.destroy(sg.parent, sg.exe)
        self.graphs.clear()
        self.warm.clear()
        self.skip.clear()
        self.pool, self.pool_bytes = None, 0


_route = Route()


def ineligible(worker, batch, pp_proxy_tensors) -> str | None:
    """Why this step must run SGLang's eager branch, or None."""
    mode = batch.forward_mode
    if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or not mode.is_decode():
        return "not a decode step"
    if worker.topk != 1 or worker.speculative_num_steps < 1:
        return "topk is not 1 or drafting is off"
    spec = batch.spec_info
    if spec is None or spec.is_verify_input() or pp_proxy_tensors is not None:
        return "no draft input (or a PP verify input)"
    info = batch.sampling_info
    if batch.return_logprob or batch.return_hidden_states:
        return "logprobs or hidden states requested"
    if batch.has_grammar:  # (the scheduler hands every EAGLE step a grammar barrier; only a grammar uses it)
        return "a grammar"
    if not info.is_all_greedy:
        return "non-greedy sampling"
    if (info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None
            or info.logit_bias is not None or info.has_watermark_candidates):
        return "penalties, logit bias or watermark"
    if batch.hisparse_coordinator is not None or batch.mamba_track_indices is not None:
        return "hisparse or mamba state"
    if batch.seq_lens_cpu is not None:  # (no overlap scheduling: the draft extend stages these host lengths)
        return "host sequence lengths (seq_lens_cpu)"
    if any(mm is not None for mm in batch.multimodal_inputs or ()):  # (mrope positions from per-request deltas)
        return "multimodal inputs"
    return None


def _snapshot(objs) -> list[tuple[object, dict]]:
    return [(obj, dict(vars(obj))) for obj in objs]


def _restore(saved) -> None:
    for obj, attrs in saved:
        state = vars(obj)
        state.clear()
        state.update(attrs)


def runner_graphs_unsupported() -> str | None:
    """Why the runners' decode graphs cannot be joined into a step graph, or None: they must be
    ``FullCudaGraphBackend``'s (the replays a capture cuts at) in torch's own graph memory."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec
    from sglang.srt.utils import get_bool_env_var

    graph = get_exec().graph.cuda_graph_config
    backend = graph.decode.backend if graph is not None else Backend.FULL  # (resolve_decode_backend's default)
    if backend != Backend.FULL:
        return (f"the decode CUDA-graph backend is {backend!r}, not 'full' (the runners' replays a step graph cuts "
                "at are FullCudaGraphBackend's)")
    if get_exec().features.enable_memory_saver and get_bool_env_var("SGLANG_MEMORY_SAVER_CUDA_GRAPH"):
        return ("--enable-memory-saver with SGLANG_MEMORY_SAVER_CUDA_GRAPH (the runner graphs are captured into "
                "the saver's pausable memory; a joined graph's own pool is not)")
    return None


def unified_memory_unsupported() -> str | None:
    """Under unified memory the scheduler hands its allocator the ``batch.out_cache_loc`` the step's
    branch set (its write set); a replay does not set it."""
    from sglang.srt.runtime_context import get_memory

    if get_memory().enable_unified_memory:
        return ("--enable-unified-memory (the scheduler hands its allocator the step's batch.out_cache_loc, which "
                "the branch sets and a replay does not)")
    return None


def unsupported(worker) -> str | None:
    """Server-wide settings under which the branch decides per step on values a graph would freeze,
    or returns outputs a replay would hand out stale."""
    from sglang.srt.runtime_context import get_exec, get_parallel, get_schedule, get_spec

    if get_parallel().pp_size > 1:
        return "pipeline parallelism"
    if get_spec().speculative_use_rejection_sampling:
        return "rejection sampling (the draft extend samples)"
    if worker.draft_worker.seed_dsa_topk_from_draft_extend:
        return "DSA top-k seeding (the draft picks its path on the seed's presence)"
    if get_schedule().disable_overlap_schedule:
        return "--disable-overlap-schedule (the draft extend stages the host sequence lengths)"
    if get_spec().speculative_adaptive:
        return "--speculative-adaptive (the step count changes at run time)"
    features = get_exec().features
    if features.enable_return_routed_experts or features.enable_return_indexer_topk:
        return "--enable-return-routed-experts / --enable-return-indexer-topk (per-step capture outputs)"
    if get_exec().moe.expert_distribution_recorder_mode is not None:
        return "expert distribution recording or EPLB (per-forward host bookkeeping)"
    return unified_memory_unsupported() or runner_graphs_unsupported()


def begin(r, name: str, why: str | None) -> bool:
    """Before a capture (this slot's and the block step graphs'): off for good when ``why`` (the server
    rules' answer) or when the driver's graph API is not reachable; the pool. False: SGLang's step."""
    r.disabled = why or ""
    if r.disabled:
        logger.info("hostsync: %s: no step graph: %s", name, r.disabled)
        return False
    if r.driver is None:
        try:
            r.driver, r.stream = Driver(), torch.cuda.Stream()
        except Exception as exc:  # noqa: BLE001 (no driver graph API: SGLang's step, never a failed server)
            r.driver, r.disabled = None, f"the CUDA driver's graph API is not reachable: {type(exc).__name__}: {exc}"
            logger.warning("hostsync: %s: %s; SGLang's eager step from now on", name, r.disabled)
            return False
    capture_pool(r)
    return True


def run_captured(r, cap, call, *contexts):
    """``call()`` as one captured step in ``cap`` (its segments), inside ``contexts`` (the capture's side
    stream first); a failure ends the open segment's capture on that stream and propagates."""
    with contextlib.ExitStack() as stack:
        for ctx in contexts:
            stack.enter_context(ctx)
        try:
            cap.open()
            result = call()
            cap.close()
        except BaseException:
            cap.abort(r.driver)  # on the capture's stream: torch ends a capture only there
            raise
    return result


def join(r, name: str, cap, result, bs: int, children: int, side_output):
    """The captured segments and runner graphs joined: (parent, exe), or None where a runner ran
    eagerly (this batch size is left to SGLang) or the step returns a side output (capture off)."""
    got = sum(p[0] == "child" for p in cap.parts)
    if got != children:
        # A runner ran eagerly (its graph cannot take this batch): leave this batch size to SGLang.
        r.skip.add(bs)
        r.count_eager(f"bs {bs}: {got} of the {children} runner graphs replayed")
        return None
    side = side_output(result)
    if side:
        r.disabled = f"the step returns {side}, which a replay would hand out as the capture step's"
        logger.warning("hostsync: %s: %s; SGLang's eager step from now on", name, r.disabled)
        return None
    handles = [p[-1].raw_cuda_graph() for p in cap.parts]
    return r.driver.chain([h for h in handles if r.driver.nodes(h)])


def failed(r, name: str, key, bs: int, exc: BaseException) -> None:
    """A capture that raised: counted for its key and in all (capturing off after ``MAX_FAILED``)."""
    r.failures[key] = n = r.failures.get(key, 0) + 1
    r.failed += 1
    r.pool = None  # the next capture takes a fresh pool, whatever torch left routed to this one
    if r.failed >= MAX_FAILED:
        r.disabled = f"{r.failed} captures failed, the last: {type(exc).__name__}: {exc}"
    logger.warning("hostsync: %s: capturing the bs %d step failed (%d of %d for its layout, %d in all); %s",
                   name, bs, n, MAX_FAILURES, r.failed,
                   "capturing is off" if r.disabled else "SGLang's eager step for it", exc_info=True)


def captured(r, name: str, bs: int, cap, children: int, present: list[str]) -> None:
    logger.info("hostsync: %s: bs %d step captured: %d segments around the %d runner graphs; inputs %s; %s", name,
                bs, len(cap.parts) - children, children, ", ".join(present), r.held(new=1))


def replayed(r, name: str) -> None:
    r.replays += 1
    if r.replays in (1, 100) or r.replays % 10000 == 0:
        logger.info("hostsync: %s: %d steps replayed (%s); eager: %s", name, r.replays, r.held(), r.eager or "none")


def capture(original, worker, batch, tensors, key) -> StepGraph | None:
    """Capture this step (nothing runs on the GPU); None where it cannot be, after which the
    caller runs SGLang's step."""
    r = _route
    bs = len(batch.seq_lens)
    if not begin(r, NAME, unsupported(worker)):
        return None
    objs = owners(batch)
    slots = [t.clone() for t in tensors]
    saved = _snapshot(objs)
    install(objs, slots)
    cap = Capture(r.pool)
    before = reserved()
    r.capture = cap
    try:
        result = run_captured(r, cap, lambda: original(worker, batch, None, None, None), side_stream(r.stream))
        joined = join(r, NAME, cap, result, bs, 3, side_output)
        if joined is None:
            return None
        parent, exe = joined
    except Exception as exc:  # noqa: BLE001 (any failure leaves this step, and this key for a while, to SGLang)
        failed(r, NAME, key, bs, exc)
        return None
    finally:
        r.capture = None
        _restore(saved)
        r.pool_bytes += max(0, reserved() - before)
    captured(r, NAME, bs, cap, 3, present(objs))
    return StepGraph(bs, slots, result, cap.parts, parent, exe, pool=cap.pool)


def launch_graph(r: Route, exe, stream) -> None:
    """A step graph's launch (all three step graphs'); the audit times it as its own phase."""
    audit_phases.run_as(audit_phases.STEP_GRAPH_LAUNCH, r.driver.launch, exe, stream)


def launch(worker, sg: StepGraph, copies, on_publish):
    torch._foreach_copy_(*copies)
    worker.activate_step_by_batch(sg.bs)
    launch_graph(_route, sg.exe, stream_handle())
    replayed(_route, NAME)
    out = sg.output()
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


def checked(original, worker, batch, sg: StepGraph, copies, on_publish):
    """The replay, then SGLang's eager step over the same (untouched) batch; their outputs compared
    on the device (the glue slots' check). Serving gets SGLang's result while the check is on."""
    results = [launch(worker, sg, copies, None)]
    run_check(_route, NAME, "step outputs", sg.bs, lambda: fingerprint(results[-1]),
              lambda: results.append(original(worker, batch, None, None, None)))
    out = results[-1]
    if on_publish is not None:
        on_publish(out.new_seq_lens)
    return out


def step_hook(original, self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
    r = _route
    if r.capture is not None:
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    reason = ineligible(self, batch, pp_proxy_tensors) or (r.disabled and "capture off")
    if not reason:
        stray = stray_input(owners(batch))
        reason = stray and f"the step reads {stray}"
    if reason:
        r.count_eager(reason)
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    bs = len(batch.seq_lens)
    if bs in r.skip:
        r.count_eager(f"bs {bs} has no step graph")
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    layout, tensors = gather(owners(batch))
    key = (bs, layout)
    if r.failures.get(key, 0) >= MAX_FAILURES:
        r.count_eager(f"bs {bs}: its capture failed {MAX_FAILURES} times")
        return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
    sg = r.graphs.get(key)
    if sg is not None and not sg.current():  # a runner re-captured: join its new graphs
        del r.graphs[key]
        r.driver.destroy(sg.parent, sg.exe)
        sg, r.warm[key] = None, 0
    if sg is None:
        if len(r.graphs) >= r.max_graphs:
            r.count_eager(f"{r.max_graphs} step graphs held already ({ENV_MAX})")
            return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
        r.warm[key] = r.warm.get(key, 0) + 1
        if r.warm[key] > WARMUPS:
            sg = capture(original, self, batch, tensors, key)
            if sg is None:
                r.warm[key] = 0  # (a failed capture: try again after as many eager steps, not on every one)
        if sg is None:
            return original(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
        r.graphs[key] = sg
    copies = (sg.slots, tensors)
    if r.check and (r.replays + 1) % r.check == 0:
        return checked(original, self, batch, sg, copies, on_publish)
    return launch(self, sg, copies, on_publish)


def replay_hook(original, self, shape_key, static_forward_batch, **kwargs):
    cap = _route.capture
    if cap is None:
        return original(self, shape_key, static_forward_batch, **kwargs)
    cap.cut(self, shape_key)
    return self._outputs[shape_key]


class _Namespace:
    """``target`` with some attributes replaced."""

    def __init__(self, target, **replaced):
        self._target = target
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._target, name)


def keep_hook(original, self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
    # A runner captures after startup only where SGLang re-captures or replaces it (a weight update
    # with recapture_cuda_graph builds a new runner, whose constructor re-allocates the attention
    # backend's graph buffers the old runner graphs read): every step graph goes, with what it holds.
    _route.drop("a runner is capturing its graphs")
    # capture_one makes its graph with torch.cuda.CUDAGraph(): for this call its module sees a
    # torch whose CUDAGraph keeps the cudaGraph_t, which a joined step graph adds as a child.
    module = sys.modules[BACKEND_MODULE]
    real = module.torch
    module.torch = _Namespace(real, cuda=_Namespace(real.cuda, CUDAGraph=functools.partial(
        real.cuda.CUDAGraph, keep_graph=True)))
    try:
        out = original(self, shape_key, forward_fn, capture_inputs, post_warmup_hook)
    finally:
        module.torch = real
    graph = self._graphs.get(shape_key)
    if graph is not None:
        graph.instantiate()  # as capture_end does without keep_graph: the first replay stays as fast
    return out


def inert(f: ServingFacts) -> str | None:
    reason = glue_inert(f, "the EAGLE-family v2 worker")
    if reason:
        return reason
    if f.topk is not None and f.topk != 1:
        return f"inert because --speculative-eagle-topk is {f.topk}; the step graph is built for topk 1"
    if f.dp_attention or f.tp_size > 1:
        return "inert because attention DP or tensor parallelism is on (not built for collectives in the step)"
    # The same rules as ``unsupported``, which the scheduler applies again to SGLang's resolved settings.
    for on, why in ((f.disable_overlap_schedule, "--disable-overlap-schedule (the draft extend stages the host "
                     "sequence lengths)"),
                    (f.speculative_adaptive, "--speculative-adaptive (the step count changes at run time)"),
                    (f.returns_capture_outputs, "--enable-return-routed-experts / --enable-return-indexer-topk "
                     "(per-step capture outputs)"),
                    (f.expert_distribution, "expert distribution recording or EPLB (per-forward host bookkeeping)")):
        if on:
            return f"inert because of {why}"
    return simulated_draw(f.env)


def simulated_draw(env) -> str | None:
    """SGLang's simulated acceptance draws its length on the host each step: a graph would freeze
    it. Constant only for an integral length under ``match-expected`` (its weights are then 1 and 0)."""
    from ..switches import env_value

    length = env_value("SGLANG_SIMULATE_ACC_LEN", env)
    if length <= 0:
        return None
    method = env_value("SGLANG_SIMULATE_ACC_METHOD", env)
    if method == "match-expected" and float(length).is_integer():
        return None
    return (f"inert because SGLANG_SIMULATE_ACC_LEN={length:g} with method {method} draws a new length on the "
            "host each step")


def prepare(facts) -> str:
    _route.check, _route.max_graphs = settings()
    notes = [f"at most {_route.max_graphs} step graphs"]
    if _route.check:
        notes.append(f"eager check every {_route.check} replayed steps")
    return "; ".join(notes)


UNSAFE = "replays its own graph inside the step, which a step capture cannot hold"

SLOT = Slot(
    name=NAME,
    kind=SlotKind.OWNED,
    origin="hostsync (EAGLE v2 topk-1 step as one CUDA graph), after sglang#45450's one-graph DSpark step",
    summary="EAGLE v2 topk-1 decode step as one CUDA graph launch (SGLang's runner graphs joined with the glue)",
    default=False,
    precheck=config_precheck(settings),
    inert=inert,
    prepare=prepare,
    unsafe_with=(("metadata_glue_graph", UNSAFE), ("draft_extend_glue_graph", UNSAFE),
                 ("draft_decode_glue_graph", UNSAFE), ("draft_extend_topk_graph", UNSAFE)),
    targets=(
        HookTarget(f"{WORKER}.forward_batch_generation", TargetKind.FUNCTION, hook=step_hook,
                   params=("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"),
                   source_sha="e41ad8d8053cf2c0"),
        HookTarget(f"{BACKEND}.capture_one", TargetKind.FUNCTION, hook=keep_hook,
                   params=("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
                   source_sha="b11da397ea881b30"),
        HookTarget(f"{BACKEND}.replay", TargetKind.FUNCTION, hook=replay_hook,
                   params=("self", "shape_key", "static_forward_batch", "kwargs"), source_sha="cf7508aca9e2b4ae"),
    ),
)
