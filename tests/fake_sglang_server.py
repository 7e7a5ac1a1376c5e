"""A stand-in for ``python -m sglang.launch_server`` that the e2e benchmark's CPU
tests launch (``--server-module fake_sglang_server``): ``/health`` and ``/generate``
on 127.0.0.1 with SGLang's response shape, and, when the audit trace is asked for,
trace lines in the audit slot's own format (one "step" per 4 tokens).

Behaviour switches for the tests come from the arm's slot list: a slot token
``perturb`` changes the logprob of the last output position, ``crash`` exits before
ready, ``die`` exits while serving (on its 7th 16-token request: the first one, the four
warm-ups of a ``--concurrency 1 2`` run, then inside the first timed round).
``small_kv_once`` (with ``FAKE_SMALL_KV_ONCE``, a marker file) says a 64-token KV pool in
``/server_info`` on its first start, as SGLang's sizing did when servers started together;
``small_kv`` on every start.
``fail_first`` answers its first ``/generate`` with HTTP 500. A SIGTERM is logged with its time.
``FAKE_SGLANG_FIRST_GENERATE_S`` delays the first ``/generate`` by that many seconds.
Greedy outputs (``temperature`` 0 or ``top_k`` 1) depend only on the prompt; sampled ones
on ``sampling_seed`` and the prompt, or are random without a seed. ``stop_token_ids`` end
an output at the first listed id (finish_reason ``{"type": "stop", "matched": id}``, else
``{"type": "length", "length": n}``; ``ignore_eos`` turns them off). ``"stream": true``
sends SGLang's SSE chunks (``data: {json}``, cumulative ``output_ids``, then ``data: [DONE]``)
2 ms apart; a client that hangs up mid-stream is logged ("stream cut by the client") and
counted. ``GET /v1/loads`` says, as SGLang's does, the KV tokens held (``num_used_tokens``,
``num_total_tokens``: each request's prompt and ``max_new_tokens`` while it runs).
``foreign`` says another model path in ``/server_info`` (a server of an earlier run on the port).
``perturb_traffic`` changes the last output id of requests with a ``logit_bias``; ``leak``
keeps the tokens of a stream the client cut held for good."""

import argparse
import gzip
import json
import math
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang_hostsync_plugin.slots.audit import ENV_TRACE, TRACE_HEADER, TraceStep, format_trace_line

STEP_S = 0.0005  # host time per fake decode step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--enable-hostsync-plugin", action="store_true")
    ap.add_argument("--speculative-algorithm", default=None)
    ap.add_argument("--model-path", default=None)
    args, _ = ap.parse_known_args()
    # NGRAM's trie, as far as the e2e can see it: once three requests ran at once it holds outputs that
    # differ between servers, so this server's greedy outputs move (by its port) until /flush_cache.
    trie = args.speculative_algorithm == "NGRAM"
    slots = os.environ.get("SGLANG_HOSTSYNC_SLOTS", "") if args.enable_hostsync_plugin else ""
    tokens = {t.strip() for t in slots.split(",")}
    if "crash" in tokens:
        print("fake server: crashing before ready", flush=True)
        sys.exit(3)
    marker = os.environ.get("FAKE_CRASH_ONCE")
    if "crash_once" in tokens and marker and not os.path.exists(marker):  # the first start only
        open(marker, "w").close()
        print("fake server: crashing before ready, once", flush=True)
        sys.exit(4)
    def on_term(*_):
        print(f"fake server: SIGTERM at {time.perf_counter():.6f}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    kv_tokens = 1 << 20
    model_path = "/elsewhere/model" if "foreign" in tokens else args.model_path
    small = os.environ.get("FAKE_SMALL_KV_ONCE")
    if "small_kv" in tokens or ("small_kv_once" in tokens and small and not os.path.exists(small)):
        if small:
            open(small, "w").close()
        kv_tokens = 64
        print("fake server: a KV pool of 64 tokens", flush=True)
    if args.enable_hostsync_plugin:
        print("hostsync: sglang 0.5.23, SGLANG_HOSTSYNC_SLOTS=%r, strict=True" % slots, flush=True)
        print("  audit                        applied", flush=True)
        if os.environ.get("SGLANG_HOSTSYNC_GLUE_CHECK"):  # what a slot's self-check logs
            for n in (1, 10):
                print(f"[x] INFO hostsync: draft_extend_glue_graph check: {n} checks, 0 mismatches", flush=True)
    trace_path = os.environ.get(ENV_TRACE)
    lock = threading.Lock()
    state = {"step": 0, "served16": 0, "streams": {}, "held": 0, "cut": 0}  # streams: request thread -> tokens streamed
    stock_like = tokens <= {"audit", "audit_block", "audit_ngram", ""}  # the audit tool slots time stock code
    if trace_path:
        with open(trace_path, "w") as f:
            f.write(TRACE_HEADER)

    def record_steps(n):
        if not trace_path:
            return
        lines = []
        with lock:
            for _ in range(n):
                t = time.perf_counter()
                # Stock-like arms: one sync per step and a negative lead; the plugin: none, positive.
                # A step's GPU finish is set from the next launch, so the lead does not depend
                # on how late sleep() or the next request wakes up on a loaded host.
                sites = ("sglang/srt/speculative/eagle_worker_common.py:102 (duplicate_prefix_tail_to_draft_branches)",) if stock_like else ()
                lead = -0.0002 if stock_like else 0.002
                previous = state.get("pending")
                if previous is not None:
                    step, launched, its_sites = previous
                    lines.append(format_trace_line(TraceStep(step, launched, t + lead, True, 300.0, its_sites)))
                state["pending"] = (state["step"], t, sites)
                state["step"] += 1
                time.sleep(STEP_S)
        with open(trace_path, "a") as f:
            f.write("".join(lines))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/server_info":
                return self._send(200, {"max_total_num_tokens": kv_tokens, "model_path": model_path})
            if self.path.split("?")[0] == "/v1/loads":  # SGLang's per-DP-rank load snapshot, its token fields
                with lock:
                    load = {"dp_rank": 0, "num_running_reqs": state.get("inflight", 0), "num_waiting_reqs": 0,
                            "num_used_tokens": state["held"], "num_total_tokens": state["held"]}
                return self._send(200, {"loads": [load]})
            self._send(200 if self.path == "/health" else 404, {})

        def do_POST(self):
            if self.path.split("?")[0] == "/flush_cache":
                ok = "noflush" not in tokens
                with lock:
                    state["flushes"] = state.get("flushes", 0) + ok
                    state["trie_dirty"] = state.get("trie_dirty", False) and not ok
                print(f"fake server: flush_cache {'done' if ok else 'refused'}", flush=True)
                data = b"Cache flushed.\n" if ok else b"Cache not flushed.\n"
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            if self.path == "/start_profile":  # a Kineto-shaped trace: per step one graph kernel, one eager
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    at = ",".join(str(v) for v in sorted(state["streams"].values()))
                print(f"fake server: profile started at streamed tokens {at or None}", flush=True)
                events = []
                for k in range(req["num_steps"]):
                    t = 100.0 * k
                    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5,
                                "args": {"correlation": 2 * k}},
                               {"ph": "X", "cat": "kernel", "name": "gemm", "ts": t, "dur": 50,
                                "args": {"correlation": 2 * k, "graph id": 1}},
                               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 50, "dur": 5,
                                "args": {"correlation": 2 * k + 1}},
                               {"ph": "X", "cat": "kernel", "name": "eager_add", "ts": t + 60, "dur": 20,
                                "args": {"correlation": 2 * k + 1}}]
                os.makedirs(req["output_dir"], exist_ok=True)
                with gzip.open(os.path.join(req["output_dir"], f"{req['profile_id']}-TP-0.trace.json.gz"), "wt") as f:
                    json.dump({"traceEvents": events}, f)
                data = b"Start profiling.\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            if self.path != "/generate":
                return self._send(404, {})
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids, n = req["input_ids"], req["sampling_params"].get("max_new_tokens", 128)
            held = len(ids) + n
            with lock:  # when this server first serves two requests at once (the e2e's warm-up at c2)
                state["inflight"] = state.get("inflight", 0) + 1
                state["held"] += held
                # Three at once: the concurrent phase (a stream cut in the one-at-a-time phase still runs
                # for a while beside the next request, as SGLang's do, without making it concurrent).
                if state["inflight"] >= 3 and trie:
                    state["trie_dirty"] = True
                if state["inflight"] >= 2 and "pair_at" not in state:
                    state["pair_at"] = time.perf_counter()
                    print(f"fake server: 2 requests in flight at {state['pair_at']:.6f}", flush=True)
            ended = None
            try:
                ended = self._generate(req, ids, n)
                return ended
            finally:
                with lock:
                    state["inflight"] -= 1
                    if not (ended == "cut" and "leak" in tokens):
                        state["held"] -= held

        def _outputs(self, ids, n, sp):
            """The output ids and finish reason of one request."""
            temperature = sp.get("temperature")
            if (1.0 if temperature is None else temperature) > 0 and sp.get("top_k") != 1:  # sampled, as SGLang's default
                rng = random.Random(f"{sp['sampling_seed']}:{ids}") if sp.get("sampling_seed") is not None else random.Random()
                out = [rng.randrange(50000) for _ in range(n)]
            else:
                out = [(sum(ids) * 31 + 7 * k) % 50000 for k in range(n)]
                if state.get("trie_dirty"):  # drafts from other outputs: a server-specific difference
                    out[-1] = (out[-1] + 1 + args.port % 7) % 50000
            if sp.get("logit_bias") and "perturb_traffic" in tokens:
                out[-1] = (out[-1] + 1) % 50000
            stop = set(sp.get("stop_token_ids") or ()) if not sp.get("ignore_eos") else set()
            for i, t in enumerate(out):
                if t in stop:
                    return out[:i + 1], {"type": "stop", "matched": t}
            return out, {"type": "length", "length": n}

        def _generate(self, req, ids, n):
            with lock:
                first, state["generated"] = "generated" not in state, True
            if first and "fail_first" in tokens:
                return self._send(500, {"error": "fake server: failing the first request"})
            if first:  # a first request that pays startup costs (stock's took 1.4 s on the H200)
                time.sleep(float(os.environ.get("FAKE_SGLANG_FIRST_GENERATE_S", "0")))
            if n == 16:
                time.sleep(0.02)  # long enough that a closed loop's requests overlap on a loaded host
            if n == 16 and "die" in tokens:
                with lock:
                    state["served16"] += 1
                    if state["served16"] == 7:
                        print("fake server: dying while serving", flush=True)
                        os._exit(5)
            out, finish = self._outputs(ids, n, req["sampling_params"])
            record_steps(max(1, n // 4))
            meta = {"completion_tokens": len(out), "spec_accept_length": 3.0 if stock_like else 3.0,
                    "finish_reason": finish, "cached_tokens": 0}
            if req.get("return_logprob"):
                k = req.get("top_logprobs_num", 0)
                lp = [-math.log(50000) - 1e-6 * t for t in out]
                if "perturb" in tokens:
                    lp[-1] += 1e-7
                meta["output_token_logprobs"] = [[v, t, None] for v, t in zip(lp, out)]
                meta["output_top_logprobs"] = [[[v, t, None]] * k for v, t in zip(lp, out)]
            if req.get("stream"):  # SSE chunks as SGLang sends them; a profile asked for meanwhile is logged
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                me = threading.get_ident()
                with lock:
                    state["streams"][me] = 0
                    later = len(state["streams"]) - 1
                time.sleep(0.1 * later)  # streams started together begin 0.1 s apart
                done = 0
                try:
                    for done in range(1, len(out) + 1):
                        with lock:
                            state["streams"][me] = done
                        last = done == len(out)
                        chunk = {"output_ids": out[:done], "meta_info": {**meta, "completion_tokens": done,
                                                                          "finish_reason": finish if last else None}}
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                        time.sleep(0.002)
                    self.wfile.write(b"data: [DONE]\n\n")
                    return "done"
                except (BrokenPipeError, ConnectionResetError):
                    with lock:
                        state["cut"] += 1
                        cut = state["cut"]
                    print(f"fake server: stream cut by the client after {done} of {len(out)} tokens ({cut} cut)", flush=True)
                    return "cut"
                finally:
                    with lock:
                        del state["streams"][me]
            self._send(200, {"output_ids": out, "meta_info": meta})

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # the stdlib's 5 resets connections under 16 clients; uvicorn's backlog is 2048

    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
