"""The e2e's real-traffic pass (``sglang_hostsync_plugin.e2e.traffic``) on the CPU: the
mix against SGLang 0.5.23's own request checks, and every phase against fake servers
(tests/fake_sglang_server.py), each check shown to fail where it should."""

import math
import os
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO, free_port_base
from sglang_hostsync_plugin.e2e import client, traffic
from sglang_hostsync_plugin.e2e.traffic import Outcome

TESTS = os.path.join(REPO, "tests")
VOCAB = 50000  # the fake server's ids are below this
KINDS = {"greedy", "logprobs", "stop-ids", "short", "prefix-a", "prefix-b", "penalty", "logit-bias",
         "sampled-seeded", "sampled-unseeded"}
DEAD = "http://127.0.0.1:9"  # discard port: nothing listens


def kind(name):
    return name.rsplit("-", 1)[0]


@pytest.fixture
def fake(tmp_path):
    """start(*slot_tokens) -> (base, log path) of a fake server with those behaviour switches."""
    procs = []

    def start(*slots):
        port = free_port_base(1)
        log = tmp_path / f"fake-{port}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
                   SGLANG_HOSTSYNC_SLOTS=",".join(slots))
        argv = [sys.executable, "-m", "fake_sglang_server", "--port", str(port)]
        with open(log, "w") as f:
            proc = subprocess.Popen(argv + (["--enable-hostsync-plugin"] if slots else []), env=env,
                                    stdout=f, stderr=subprocess.STDOUT)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        client.wait_ready(base, 60, lambda: proc.poll() is None, poll_s=0.1)
        return base, log

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def mix():
    return traffic.request_mix(VOCAB, seed=1)


# --- the mix ----------------------------------------------------------------------

def test_the_mix_is_deterministic_and_has_every_kind(mix):
    assert traffic.request_mix(VOCAB, seed=1) == mix
    assert traffic.request_mix(VOCAB, seed=2) != mix  # the seed picks it: the equality above can fail
    names = [r.name for r in mix]
    assert len(set(names)) == len(names) == 29 and {kind(n) for n in names} == KINDS
    by = {r.name: r for r in mix}
    sp = {r.name: r.payload["sampling_params"] for r in mix}
    assert not any(s.get("ignore_eos") for s in sp.values())
    assert [sp[f"short-{k}"]["max_new_tokens"] for k in range(3)] == [1, 2, 3]
    assert all(s["max_new_tokens"] == 48 for n, s in sp.items() if not n.startswith("short"))
    for n in ("logprobs-0", "logprobs-1", "logprobs-2", "prefix-b-1"):
        assert (by[n].payload["return_logprob"], by[n].payload["top_logprobs_num"], by[n].payload["logprob_start_len"]) == (True, 5, -1)
    # Stop ids: the common ones everywhere, growing shares of the vocabulary; greedy-k's prompts again.
    stops = [sp[f"stop-ids-{k}"]["stop_token_ids"] for k in range(3)]
    assert {11, 13, 198} <= set(stops[0]) and len(stops[0]) < 20 < len(stops[1]) < len(stops[2]) <= VOCAB // 2 + 20
    assert all(by[f"stop-ids-{k}"].payload["input_ids"] == by[f"greedy-{k}"].payload["input_ids"] for k in range(3))
    # Prefix groups: one 600-token prefix each, then different tails (a-3 repeats a-0 whole).
    for group, count in (("a", 4), ("b", 3)):
        prompts = [by[f"prefix-{group}-{i}"].payload["input_ids"] for i in range(count)]
        assert all(p[:600] == prompts[0][:600] for p in prompts) and len({tuple(p) for p in prompts[:3]}) == 3
    assert by["prefix-a-3"].payload["input_ids"] == by["prefix-a-0"].payload["input_ids"]
    assert len(by["prefix-b-2"].payload["input_ids"]) == 601
    assert sp["penalty-0"]["frequency_penalty"] and sp["penalty-1"]["presence_penalty"] and sp["penalty-2"]["repetition_penalty"] > 1
    assert all(k.isdigit() for n in ("logit-bias-0", "logit-bias-1") for k in sp[n]["logit_bias"])
    for n in ("sampled-seeded-0", "sampled-seeded-1", "sampled-unseeded-0", "sampled-unseeded-1"):
        assert (sp[n]["temperature"], sp[n]["top_p"], sp[n]["top_k"]) == (0.8, 0.9, 40)
        assert ("sampling_seed" in sp[n]) == ("unseeded" not in n)
    assert all(s["temperature"] == 0.0 for n, s in sp.items() if not n.startswith("sampled"))
    # Compared: all but sampling; seeded sampling only where the servers honour seeds.
    assert [r.name for r in mix if not r.compared] == [n for n in names if n.startswith("sampled")]
    det = traffic.request_mix(VOCAB, seed=1, deterministic=True)
    assert [r.name for r in det if not r.compared] == [n for n in names if n.startswith("sampled-unseeded")]
    with pytest.raises(ValueError, match="4096"):
        traffic.request_mix(1000, seed=1)


def test_every_request_passes_sglangs_own_request_checks(mix):
    """The /generate contract gate and ``SamplingParams`` validation of the pinned SGLang:
    a request the real server would refuse with HTTP 400 would only test error handling."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams

    def refused(payload, vocab=VOCAB):
        error = generate_contract_error(payload)
        if error:
            return error
        try:
            params = SamplingParams(**payload["sampling_params"])
            params.verify(vocab)
            params.normalize(None)  # --skip-tokenizer-init: no tokenizer
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None

    streamed = {**mix[0].payload, "stream": True}
    assert [(r.name, refused(r.payload)) for r in mix if refused(r.payload)] == [] and refused(streamed) is None
    # The checks can fail: the OpenAI name of the seed, a bias outside the vocabulary.
    seeded = next(r for r in mix if r.name == "sampled-seeded-0").payload
    wrong = {**seeded, "sampling_params": {**seeded["sampling_params"], "seed": 3}}
    wrong["sampling_params"].pop("sampling_seed")
    assert "unknown field `seed`" in refused(wrong)
    biased = next(r for r in mix if r.name == "logit-bias-0").payload
    assert "logit_bias" in refused(biased, vocab=1000)


# --- sequential and compare --------------------------------------------------------

def test_two_clean_servers_are_identical_and_a_perturbed_one_differs_where_it_should(fake, mix):
    (a, _), (b, _), (c, _) = fake(), fake(), fake("perturb_traffic")
    stock, other, perturbed = (traffic.sequential(base, mix) for base in (a, b, c))
    assert [o.name for o in stock] == [r.name for r in mix] and not any(o.error for o in stock)
    report = traffic.compare(stock, other)
    assert report["identical"] and report["errors"] == [] and report["mismatches"] == []
    assert report["compared"] == report["same"] == 25
    assert report["unchecked"] == [r.name for r in mix if r.name.startswith("sampled")]
    # The unseeded sampled outputs did differ (unchecked); the seeded ones did not.
    by = {o.name: (o, p) for o, p in zip(stock, other)}
    assert by["sampled-unseeded-0"][0].output_ids != by["sampled-unseeded-0"][1].output_ids
    assert by["sampled-seeded-0"][0].output_ids == by["sampled-seeded-0"][1].output_ids
    # Stop ids really stopped (the fake's ids are spread over the vocabulary), and say where.
    stopped = [o for o in stock if o.name in report["stopped"]]
    assert {"stop-ids-2", "logprobs-2"} <= set(report["stopped"])
    assert all(o.finish_reason["matched"] == o.output_ids[-1] and len(o.output_ids) < 48 for o in stopped)
    assert len(by["logprobs-2"][0].logprobs) == len(by["logprobs-2"][0].output_ids)
    assert [len(by[f"short-{k}"][0].output_ids) for k in range(3)] == [1, 2, 3]

    bad = traffic.compare(stock, perturbed)
    assert not bad["identical"] and bad["same"] == 23 and bad["errors"] == []
    assert [(m["name"], m["what"], m["at"]) for m in bad["mismatches"]] == [("logit-bias-0", "ids", 47), ("logit-bias-1", "ids", 47)]
    m = bad["mismatches"][0]
    assert m["stock"] == [by["logit-bias-0"][0].output_ids[47]] and m["other"] == [(m["stock"][0] + 1) % 50000]


def test_an_http_error_is_an_outcome_and_makes_the_comparison_fail(fake, mix):
    (clean, _), (failing, _) = fake(), fake("fail_first")
    stock, other = traffic.sequential(clean, mix), traffic.sequential(failing, mix)
    assert "HTTP 500" in other[0].error and other[0].output_ids == () and not any(o.error for o in other[1:])
    report = traffic.compare(stock, other)
    assert not report["identical"] and report["same"] == report["compared"] - 1
    assert report["errors"] == [f"other greedy-0: {other[0].error}"]
    assert [(m["name"], m["what"]) for m in report["mismatches"]] == [("greedy-0", "error")]
    dead = traffic.sequential(DEAD, mix[:3], timeout=2)  # nothing listens: outcomes, not an exception
    assert all(o.error and "127.0.0.1:9" in o.error for o in dead)
    with pytest.raises(ValueError, match="same requests"):
        traffic.compare(stock, other[1:])


def outcome(name, ids=(1, 2, 3, 4, 5), lps=None, finish=None, compared=True, error=None):
    finish = finish or {"type": "length", "length": len(ids)}
    return Outcome(name, tuple(ids), None if error else finish, lps, error, compared)


def test_compare_flags_logprob_ids_and_finish_differences_bit_for_bit():
    lps = tuple(((-1.5 - k / 7, 10 + k), ((-1.5 - k / 7, 10 + k), (-2.25, 99))) for k in range(5))
    one_ulp = list(lps)
    one_ulp[3] = ((math.nextafter(lps[3][0][0], 0), lps[3][0][1]), lps[3][1])
    top_ulp = list(lps)
    top_ulp[1] = (lps[1][0], (lps[1][1][0], (math.nextafter(-2.25, 0), 99)))
    assert traffic.compare([outcome("logprobs-0", lps=lps)], [outcome("logprobs-0", lps=tuple(lps))])["identical"]
    for changed, at in ((tuple(one_ulp), 3), (tuple(top_ulp), 1), (lps[:4], 4), (None, 0)):
        report = traffic.compare([outcome("logprobs-0", lps=lps)], [outcome("logprobs-0", lps=changed)])
        assert [(m["what"], m["at"]) for m in report["mismatches"]] == [("logprobs", at)] and report["same"] == 0
    report = traffic.compare([outcome("g-0"), outcome("g-1"), outcome("g-2", finish={"type": "stop", "matched": 5})],
                             [outcome("g-0", ids=(1, 2, 9, 4, 5)), outcome("g-1", ids=(1, 2, 3)),
                              outcome("g-2", finish={"type": "length", "length": 5})])
    assert [(m["name"], m["what"], m["at"]) for m in report["mismatches"]] == [
        ("g-0", "ids", 2), ("g-1", "ids", 3), ("g-1", "finish_reason", None), ("g-2", "finish_reason", None)]
    assert report["mismatches"][0]["stock"] == [3, 4, 5] and report["mismatches"][0]["other"] == [9, 4, 5]
    # Unchecked requests: only errors, empty outputs and aborts count.
    report = traffic.compare([outcome("s-0", compared=False)], [outcome("s-0", ids=(7,), compared=False)])
    assert report["identical"] and report["unchecked"] == ["s-0"] and report["compared"] == 0
    for other in (outcome("s-0", ids=(), compared=False),
                  outcome("s-0", finish={"type": "abort", "message": "x"}, compared=False)):
        assert not traffic.compare([outcome("s-0", compared=False)], [other])["identical"]


def test_a_real_logprob_difference_is_flagged(fake, mix):
    (clean, _), (perturbed, _) = fake(), fake("perturb")  # perturb: the last position's logprob moves 1e-7
    report = traffic.compare(traffic.sequential(clean, mix), traffic.sequential(perturbed, mix))
    flagged = {m["name"]: (m["what"], m["at"]) for m in report["mismatches"]}
    assert not report["identical"] and set(flagged) == {"logprobs-0", "logprobs-1", "logprobs-2", "prefix-b-1"}
    assert flagged["logprobs-0"] == ("logprobs", 47) and all(w == "logprobs" for w, _ in flagged.values())


# --- concurrency, aborts, drain ------------------------------------------------------

def test_concurrent_load_with_cut_streams_has_no_errors_and_the_server_saw_the_cuts(fake, mix):
    base, log = fake()
    load = traffic.concurrent(base, mix, clients=8, requests=40, aborted=6, seed=3, abort_tokens=300)
    assert load == {"errors": [], "completed": 34, "aborted": 6, "health": True}
    assert traffic.wait_drained(base, timeout=10) == 0
    assert log.read_text().count("stream cut by the client") == 6
    # Can fail: a client that reads past the stream's end cuts nothing, and it shows.
    load = traffic.concurrent(base, mix, clients=8, requests=12, aborted=4, seed=3, abort_tokens=5, cut_after=10)
    assert load == {"errors": [], "completed": 12, "aborted": 0, "health": True}
    assert log.read_text().count("stream cut by the client") == 6
    dead = traffic.concurrent(DEAD, mix, clients=4, requests=8, aborted=2, timeout=2)
    assert len(dead["errors"]) == 8 and dead["completed"] == dead["aborted"] == 0 and not dead["health"]


def test_a_failing_request_under_load_is_an_error(fake, mix):
    base, _ = fake("fail_first")
    load = traffic.concurrent(base, mix, clients=4, requests=10, aborted=0, seed=1)
    assert len(load["errors"]) == 1 and "HTTP 500" in load["errors"][0] and load["completed"] == 9


def test_token_usage_drains_to_zero_and_a_leak_does_not(fake, mix):
    (clean, _), (leaking, _) = fake(), fake("leak")
    assert traffic.token_usage(clean) == 0
    seen = []
    payload = {"input_ids": [1] * 10, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 400}}
    streaming = threading.Thread(target=lambda: seen.append(traffic._stream_and_cut(clean, payload, 10**6, 30)))
    streaming.start()
    during = []
    while streaming.is_alive():
        during.append(traffic.token_usage(clean))
        time.sleep(0.02)
    assert seen == ["done"] and 410 in during  # held while it ran ...
    assert traffic.token_usage(clean) == 0  # ... and given back
    for base in (clean, leaking):
        assert traffic.concurrent(base, mix, clients=4, requests=12, aborted=3, seed=5, abort_tokens=300)["aborted"] == 3
    assert traffic.wait_drained(clean, timeout=10) == 0
    assert traffic.wait_drained(leaking, timeout=0.5) > 0  # the cut streams' tokens stay held
    assert traffic.token_usage(DEAD) is None and traffic.wait_drained(DEAD, timeout=0.3) is None


def test_the_request_after_the_aborts_is_the_first_greedy_one_again(fake, mix):
    (clean, _), (perturbed, _) = fake(), fake("perturb_traffic")
    again = traffic.after_aborts(clean, mix)
    first = traffic.sequential(clean, mix[:1])[0]
    assert again.name == "after-aborts" and again.output_ids == first.output_ids and again.finish_reason == first.finish_reason
    assert traffic.compare([again], [traffic.after_aborts(perturbed, mix)])["identical"]
    assert not traffic.compare([again], [Outcome("after-aborts", again.output_ids[:-1], again.finish_reason, None, None)])["identical"]


# --- server logs -------------------------------------------------------------------

NORMAL_LOG = """\
[2026-01-02 10:00:00] server_args=ServerArgs(model_path='/m', skip_tokenizer_init=True, disable_radix_cache=False)
[2026-01-02 10:00:05 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB
[2026-01-02 10:00:09] INFO:     Started server process [1234]
[2026-01-02 10:00:09] INFO:     Uvicorn running on http://127.0.0.1:31000 (Press CTRL+C to quit)
[2026-01-02 10:00:09] INFO:     127.0.0.1:57714 - "GET /health HTTP/1.1" 503 Service Unavailable
hostsync: sglang 0.5.23, SGLANG_HOSTSYNC_SLOTS='default', strict=True
[2026-01-02 10:00:10 TP0] hostsync: draft_extend_glue_graph check: 10 checks, 0 mismatches
[2026-01-02 10:00:11 TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 600, token usage: 0.01, #running-req: 0, #queue-req: 0
[2026-01-02 10:00:11 TP0] Decode batch, #running-req: 16, #token: 9000, token usage: 0.14, accept len: 3.00, cuda graph: True, gen throughput (token/s): 1200.00, #queue-req: 0
[2026-01-02 10:00:12] INFO:     127.0.0.1:40000 - "POST /generate HTTP/1.1" 200 OK
[2026-01-02 10:00:12] INFO:     127.0.0.1:40002 - "GET /v1/loads?include=core HTTP/1.1" 200 OK
[2026-01-02 10:00:13] [http_server] Client disconnected: Request is disconnected from the client side (type 3). Abort request obj.rid='a1'
[2026-01-02 10:00:14] Abort request for rid=5d1c not found in rid_to_state; likely already finished/removed.
[2026-01-02 10:00:14 TP0] Abort running request. req.rid='5d1c'
"""

# As the e2e's SIGTERM ends a server (a real 0.5.23 log's last lines).
SHUTDOWN = """\
[2026-12-01 10:13:14] SIGTERM received. signum=None frame=None. Draining requests and shutting down...
[2026-12-01 10:13:15] Subprocess scheduler_0 (pid=4762) crashed with exit code -15. Triggering SIGQUIT for cleanup...
[2026-12-01 10:13:15] SIGQUIT received. signum=None, frame=None. It usually means one child failed.
[2026-12-01 10:13:20] kill_process_tree called: parent_pid=4583, include_parent=True, pid=4583
"""

PROBLEMS = [
    "[2026-12-01 10:13:15] Subprocess scheduler_0 (pid=4762) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
    "[2026-01-02 10:01:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "[2026-01-02 10:01:00 TP0] pool memory leak detected! [full] total=65536, available=65000, evictable=0, protected=0, session_held=0, uncached=0",
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    '[2026-01-02 10:01:01] INFO:     127.0.0.1:40004 - "POST /generate HTTP/1.1" 500 Internal Server Error',
    "[2026-01-02 10:01:01] ERROR:    Exception in ASGI application",
    "[2026-01-02 10:01:02] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
    "Fatal Python error: Aborted",
    "[2026-01-02 10:01:03] [http_server] Error: min_new_tokens requires a tokenizer",
]


def test_log_problems_finds_failures_and_passes_normal_lines():
    assert traffic.log_problems(NORMAL_LOG) == [] and traffic.log_problems(NORMAL_LOG + SHUTDOWN) == []
    assert traffic.log_problems(SHUTDOWN.split("\n", 1)[1]) == SHUTDOWN.splitlines()[1:3]  # the same without the stop
    traceback = ("Traceback (most recent call last):\n  File \"scheduler.py\", line 1, in run\n    step()\n"
                 "ValueError: boom\n[2026-01-02 10:02:00 TP0] Decode batch, #running-req: 1\n")
    assert traffic.log_problems(NORMAL_LOG + traceback) == ["Traceback (most recent call last):", "ValueError: boom"]
    for line in PROBLEMS:
        assert traffic.log_problems(NORMAL_LOG + line + "\n") == [line], line
    error_500 = next(line for line in PROBLEMS if "\" 500 " in line)
    assert traffic.log_problems(error_500, ignore=(r'"POST /generate HTTP/1.1" 500',)) == []
