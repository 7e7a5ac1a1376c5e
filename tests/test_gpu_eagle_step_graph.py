"""eagle_step_graph on a CUDA device, over a stand-in step shaped like EAGLE v2's decode branch:
eager glue around three kept "runner" graphs replayed through ``replay_hook``, as SGLang's
``FullCudaGraphBackend`` does. The joined graph is bit-identical to the eager step over random
steps and batch sizes (fresh input tensors each step), makes no host sync, hands out fresh
result tensors, publishes each step's lengths, rejoins after a runner re-captures, drops its
graphs (and the old runner) when a runner is replaced with new weights, leaves the stream usable
after a capture that fails (a host sync in the step) and runs that step eagerly, and its eager
self-check counts no mismatch. The real-server proof is the e2e with the slot
(greedy outputs identical to stock, the check on); see docs/host-work.md.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh."""

import gc
import random
import time
import weakref
from types import SimpleNamespace as NS

import pytest
import torch

from sglang_hostsync_plugin.slots import eagle_step_graph as sg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HIDDEN, VOCAB, MAX_BS, STEPS = 64, 512, 4, 4


class Runner:
    """A FullCudaGraphBackend stand-in: one kept graph per batch size over static buffers."""

    def __init__(self, weight, pool, capture=True):
        self.weight, self.pool = weight, pool
        self.static_in = torch.zeros(MAX_BS, HIDDEN, device="cuda")
        self._graphs, self._outputs = {}, {}
        for bs in range(1, MAX_BS + 1) if capture else ():
            self.capture(bs)

    def capture(self, bs):
        torch.tanh(self.static_in[:bs] @ self.weight)  # warm-up (cuBLAS handle), as SGLang's capture does
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, pool=self.pool):
            out = torch.tanh(self.static_in[:bs] @ self.weight)
        graph.instantiate()
        self._graphs[bs], self._outputs[bs] = graph, out

    @staticmethod
    def replay(self, shape_key, static_forward_batch, **kwargs):  # FullCudaGraphBackend.replay's shape
        self._graphs[shape_key].replay()
        return self._outputs[shape_key]


class Worker:
    topk, speculative_num_steps = 1, STEPS - 1
    draft_worker = NS(seed_dsa_topk_from_draft_extend=False)
    sync_at = None  # a batch size whose step makes a host sync (which no capture can hold)

    def __init__(self):
        gen = torch.Generator(device="cuda").manual_seed(0)
        pool = torch.cuda.graph_pool_handle()
        self.draft, self.verify, self.extend = (
            Runner(torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen) / 8, pool) for _ in range(3))
        self.lm_head = torch.randn(HIDDEN, VOCAB, device="cuda", generator=gen)
        self.activated = []

    def activate_step_by_batch(self, bs):
        self.activated.append(bs)


def replay(runner):
    return sg.replay_hook(Runner.replay, runner, runner.current_bs, None)


def stand_in_step(worker, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
    """EAGLE v2's decode branch in miniature: glue, draft graph, glue, verify graph, greedy accept,
    publish, draft-extend graph, next draft input; every op a function of the step's inputs."""
    bs = len(batch.seq_lens)
    worker.activate_step_by_batch(bs)
    spec = batch.spec_info
    for r in (worker.draft, worker.verify, worker.extend):
        r.current_bs = bs
    worker.draft.static_in[:bs].copy_(spec.hidden_states + batch.seq_lens[:, None].float() / 64)
    drafted = replay(worker.draft)
    if bs == worker.sync_at:
        int(drafted.sum())  # a host sync between the runners: raises under capture
    draft_tokens = torch.argmax(drafted @ worker.lm_head, dim=-1).to(torch.int32)
    worker.verify.static_in[:bs].copy_(drafted + spec.topk_p)
    verified = replay(worker.verify)
    predict = torch.argmax(verified @ worker.lm_head, dim=-1).to(torch.int32)
    accept_lens = 1 + (predict == draft_tokens).to(torch.int32) + (batch.out_cache_loc[:, 0] % 2).to(torch.int32)
    new_seq_lens = batch.seq_lens + accept_lens
    batch.spec_info = "verify input"  # the branch rebinds batch fields; the scheduler's isolation restores them
    if on_publish is not None:
        on_publish(new_seq_lens)
    worker.extend.static_in[:bs].copy_(verified * accept_lens[:, None].float())
    extended = replay(worker.extend)
    topk_index = torch.argmax(extended @ worker.lm_head, dim=-1, keepdim=True)
    return NS(next_token_ids=predict, accept_lens=accept_lens, new_seq_lens=new_seq_lens,
              next_draft_input=NS(topk_index=topk_index, topk_p=torch.ones_like(topk_index, dtype=torch.float32),
                                  hidden_states=extended, bonus_tokens=predict[:, None].clone()),
              extra_keep_alive_refs=[drafted])


class Mode:
    def is_extend(self):
        return False

    def is_idle(self):
        return False

    def is_decode(self):
        return True


def make_batch(bs, gen):
    seq_lens = torch.randint(16, 4000, (bs,), device="cuda", generator=gen)
    return NS(
        forward_mode=Mode(), is_extend_in_batch=False, return_logprob=False, return_hidden_states=False,
        has_grammar=False, hisparse_coordinator=None, mamba_track_indices=None, input_ids=None,
        seq_lens_cpu=None, multimodal_inputs=[None] * bs, seq_lens=seq_lens, req_pool_indices=torch.randperm(64, device="cuda", generator=gen)[:bs],
        orig_seq_lens=seq_lens.clone(), out_cache_loc=torch.randint(0, 10**6, (bs, STEPS), device="cuda", generator=gen),
        spec_info=NS(hidden_states=torch.randn(bs, HIDDEN, device="cuda", generator=gen),
                     topk_p=torch.rand(bs, 1, device="cuda", generator=gen),
                     topk_index=torch.randint(0, VOCAB, (bs, 1), device="cuda", generator=gen),
                     is_verify_input=lambda: False),
        sampling_info=NS(is_all_greedy=True, acc_additive_penalties=None, acc_scaling_penalties=None,
                         logit_bias=None, has_watermark_candidates=False,
                         temperatures=torch.ones(bs, 1, device="cuda")),
    )


def clone_batch(batch):
    return NS(**{**vars(batch), "spec_info": NS(**vars(batch.spec_info)),
                 "sampling_info": NS(**vars(batch.sampling_info))})


def outputs(result):
    nd = result.next_draft_input
    return [result.next_token_ids, result.accept_lens, result.new_seq_lens, nd.topk_index, nd.topk_p,
            nd.hidden_states, nd.bonus_tokens]


@pytest.fixture
def route(monkeypatch):
    r = sg.Route()
    monkeypatch.setattr(sg, "_route", r)
    monkeypatch.setattr(sg, "unsupported", lambda worker: None)  # SGLang's parallel / spec state: not set up here
    yield r
    for graph in r.graphs.values():
        r.driver.destroy(graph.parent, graph.exe)


def run_steps(worker, steps, rng, gen, route):
    published = []
    for _ in range(steps):
        bs = rng.randint(1, MAX_BS)
        batch = make_batch(bs, gen)
        reference = clone_batch(batch)
        got = sg.step_hook(stand_in_step, worker, batch, on_publish=published.append)
        got_out = [t.clone() for t in outputs(got)]  # hidden_states is the runner's buffer, as in SGLang
        want = outputs(stand_in_step(worker, reference))
        torch.cuda.synchronize()
        for g, w in zip(got_out, want):
            assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w), bs
        assert torch.equal(published[-1], want[2])
    return published


def test_joined_step_is_bit_identical_to_the_eager_step(route):
    worker = Worker()
    rng, gen = random.Random(3), torch.Generator(device="cuda").manual_seed(3)
    published = run_steps(worker, 60, rng, gen, route)
    assert not route.disabled and sorted(bs for bs, _ in route.graphs) == list(range(1, MAX_BS + 1))
    assert route.replays >= 60 - MAX_BS * (sg.WARMUPS + 1) and len(published) == 60


def test_replays_make_no_host_sync_and_hand_out_fresh_tensors(route):
    worker = Worker()
    gen = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(stand_in_step, worker, make_batch(2, gen))
    batches = [make_batch(2, gen) for _ in range(5)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [sg.step_hook(stand_in_step, worker, b) for b in batches]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert route.replays == 6  # the captured step launched once too
    assert len({o.next_token_ids.data_ptr() for o in outs}) == 5 and len({o.accept_lens.data_ptr() for o in outs}) == 5


def test_a_runner_that_recaptures_is_joined_again(route):
    worker = Worker()
    rng, gen = random.Random(11), torch.Generator(device="cuda").manual_seed(11)
    for _ in range(sg.WARMUPS + 2):
        sg.step_hook(stand_in_step, worker, make_batch(3, gen))
    (key,) = route.graphs
    first = route.graphs[key]
    worker.verify.capture(3)  # SGLang re-captured this shape: the joined graph holds the old one
    for _ in range(sg.WARMUPS + 1):
        run_steps(worker, 1, NS(randint=lambda a, b: 3), gen, route)  # still identical meanwhile
    assert route.graphs[key] is not first and route.graphs[key].current()


def fixed(bs):
    return NS(randint=lambda a, b: bs)


def test_a_replaced_runner_drops_the_step_graphs(route):
    """A weight update with recapture_cuda_graph: SGLang builds a new runner (new weights, new static
    buffers) and captures its graphs through capture_one (keep_hook). The step graphs joined from the
    old runner go, with it; the next steps are the new runner's, bit-identical to eager."""
    worker = Worker()
    gen = torch.Generator(device="cuda").manual_seed(23)
    run_steps(worker, sg.WARMUPS + 2, fixed(3), gen, route)
    assert route.replays == 2 and len(route.graphs) == 1
    old = weakref.ref(worker.verify)
    __import__(sg.BACKEND_MODULE, fromlist=["x"])  # (keep_hook swaps its module's torch for the call)
    weight = torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen) / 8
    worker.verify = Runner(weight, worker.verify.pool, capture=False)
    for bs in range(1, MAX_BS + 1):
        sg.keep_hook(lambda self, key, fn, ci=None, ph=None: self.capture(key), worker.verify, bs, None)
    assert not route.graphs and not route.warm
    gc.collect()
    assert old() is None  # the old runner, its graphs and its static buffers are freed
    junk = torch.full((MAX_BS * 64, HIDDEN), float("nan"), device="cuda")  # (reuses what was freed)
    run_steps(worker, sg.WARMUPS + 3, fixed(3), gen, route)  # eager, then a new capture: all identical
    assert route.replays == 5 and len(route.graphs) == 1 and next(iter(route.graphs.values())).current()
    del junk


def test_a_capture_that_fails_leaves_the_stream_usable_and_its_step_eager(route):
    """A host sync inside the step (between two runner replays) fails its capture: the capture stream
    leaves capture mode, that step and its batch size run SGLang's step (bit-identical), another batch
    size is still captured and replayed, and the failed one is retried at most MAX_FAILURES times."""
    worker = Worker()
    worker.sync_at = 2
    gen = torch.Generator(device="cuda").manual_seed(29)
    run_steps(worker, sg.WARMUPS + 1, fixed(2), gen, route)  # the third step's capture fails
    (key,) = route.failures
    assert route.failures[key] == 1 and route.failed == 1 and not route.disabled and route.replays == 0
    with torch.cuda.stream(route.stream):
        assert not torch.cuda.is_current_stream_capturing()
        x = torch.arange(8, device="cuda") * 2
    route.stream.synchronize()
    assert int(x.sum()) == 56
    torch.cuda.synchronize()
    run_steps(worker, sg.WARMUPS + 3, fixed(3), gen, route)  # another batch size: captured and replayed
    assert route.replays == 3 and len(route.graphs) == 1 and route.pool_bytes > 0
    run_steps(worker, sg.WARMUPS + 3, fixed(2), gen, route)  # retried once more, then SGLang's for good
    assert route.failures[key] == sg.MAX_FAILURES and route.replays == 3 and not route.disabled
    assert route.eager == {f"bs 2: its capture failed {sg.MAX_FAILURES} times": 2}
    run_steps(worker, 2, fixed(3), gen, route)
    assert route.replays == 5
    print(f"eagle_step_graph: pool grown by {route.pool_bytes / 2**20:.1f} MiB for {len(route.graphs)} graph(s) "
          f"and {route.failed} failed captures")


def test_an_input_of_another_shape_gets_its_own_graph(route):
    worker = Worker()
    gen = torch.Generator(device="cuda").manual_seed(13)
    for _ in range(sg.WARMUPS + 1):
        sg.step_hook(stand_in_step, worker, make_batch(2, gen))
    batch = make_batch(2, gen)
    batch.out_cache_loc = batch.out_cache_loc[:, :2].contiguous()
    replays = route.replays
    sg.step_hook(stand_in_step, worker, batch)  # another layout: eager warm-up of its own
    assert route.replays == replays and len(route.warm) == 2


def test_the_eager_self_check_counts_no_mismatch(route):
    worker = Worker()
    route.check = 1
    rng, gen = random.Random(17), torch.Generator(device="cuda").manual_seed(17)
    run_steps(worker, 30, rng, gen, route)
    route.tally.settle(route.checks)
    assert route.checks >= 30 - MAX_BS * (sg.WARMUPS + 1) and route.tally.mismatches == 0


def test_host_time_per_step(route):
    """Not an assertion: the stand-in step's host µs eager and as one launch (printed)."""
    worker = Worker()
    gen = torch.Generator(device="cuda").manual_seed(19)
    batches = [make_batch(4, gen) for _ in range(200)]
    for b in batches[:sg.WARMUPS + 1]:
        sg.step_hook(stand_in_step, worker, clone_batch(b))
    for name, fn in (("eager", lambda b: stand_in_step(worker, b)),
                     ("joined", lambda b: sg.step_hook(stand_in_step, worker, b))):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in batches:
            fn(clone_batch(b))
        per = (time.perf_counter() - t) / len(batches) * 1e6
        torch.cuda.synchronize()
        print(f"eagle_step_graph stand-in step: {name} {per:.1f} host µs per step")
