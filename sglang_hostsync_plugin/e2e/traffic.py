"""A real-traffic pass for the e2e: a mixed request set, sent to every server of a
configuration (stock first), compared token for token with stock's; then the same mix
under concurrency with streamed requests whose clients hang up; then a drain check.

    mix = request_mix(vocab=128256, seed=1)
    stock = sequential(stock_base, mix)
    plugin = sequential(plugin_base, mix)
    report = compare(stock, plugin)            # report["identical"], report["mismatches"]
    load = concurrent(plugin_base, mix)        # load["errors"], load["aborted"], load["health"]
    held = wait_drained(plugin_base)           # 0: every KV token came back
    again = after_aborts(plugin_base, mix)     # compare([stock_again], [again])
    problems = log_problems(open(log).read())

The servers run with ``--skip-tokenizer-init`` (requests carry ``input_ids``, responses
``output_ids``; logprob entries are ``[logprob, token_id, None]``), the radix cache on,
a fixed ``--random-seed`` and speculative decoding. What SGLang 0.5.23 does, read from
its source:

- ``sampling_seed`` (``SamplingParams``) is read only under ``--enable-deterministic-inference``
  (``SamplingBatchInfo.from_schedule_batch`` builds the seed tensor only then); without it a
  seeded request samples from the global generator like an unseeded one. So seeded
  requests are compared only when ``request_mix(deterministic=True)`` says the servers
  run that way; otherwise they are checked for errors and empty output only.
- A streaming client that disconnects: Starlette's ``StreamingResponse`` (ASGI spec 2.3
  under uvicorn) sees ``http.disconnect``, cancels the stream, then runs the response's
  background task, ``TokenizerManager.create_abort_task``: after ``asyncio.sleep(2)`` it
  calls ``abort_request(rid)`` if the request is still in ``rid_to_state``, and the
  scheduler finishes it with ``FINISH_ABORT`` (logged at debug level only). A request
  that finishes within those 2 s is never aborted, so the cut streams here ask for
  ``abort_tokens`` tokens with ``ignore_eos``: they still run when the abort comes.
- ``GET /v1/loads?include=core``: per DP rank ``num_used_tokens`` = ``max_total_num_tokens
  - (available + evictable)``. Radix-cached tokens of finished requests are evictable, so
  they do not count: the floor after a drain is 0 with the radix cache on, no
  ``/flush_cache`` needed. The scheduler checks the same identity on every idle loop and
  logs ``pool memory leak detected!`` when it fails. ``num_total_tokens`` adds the waiting
  queue's tokens; the snapshot is republished on every idle loop.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .client import ClientError, _post, health

# Ids that are frequent in real tokenizers' output (Llama-3 and Qwen2's BPE: "," "." "\n"
# " " " a" "\n\n" " the" " to" " of" " and"; Llama-2's "." "," "\n" and " "). Which ids a
# greedy pass produces is not known in advance (dummy weights make it arbitrary), so the
# stop-id requests also stop on a seeded share of the whole vocabulary: it is the server's
# output that decides whether a request stops early; ``compare`` lists the ones that did.
COMMON_IDS = (11, 13, 198, 220, 264, 271, 279, 311, 315, 323, 29871, 29889, 29892)
STOP_SHARES = (0, 8, 2)  # stop-ids-k: the common ids, plus 1/8 and 1/2 of the vocabulary
TOP_LOGPROBS = 5
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 40}
ABORT_TOKENS = 2048  # a cut stream's length: it must outlive SGLang's 2 s abort delay
CUT_AFTER = 3  # streamed chunks read before the client hangs up


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the mix: ``payload`` is the ``/generate`` body; ``compared``: its
    output must equal stock's token for token (greedy, and seeded sampling where the
    servers honour seeds), else it is checked for errors and empty output only."""

    name: str
    payload: dict
    compared: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request got back. ``logprobs``: per output position ``((logprob, id),
    ((logprob, id), ...top-k))`` as JSON gave them; ``error``: the HTTP or transport
    failure, with everything else empty."""

    name: str
    output_ids: tuple[int, ...]
    finish_reason: dict | None
    logprobs: tuple | None
    error: str | None
    compared: bool = True
    cached_tokens: int | None = None  # radix-cache hit length, as meta_info says


def _greedy(ids, max_new_tokens: int, **sampling) -> dict:
    return {"input_ids": list(ids), "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, **sampling}}


def _with_logprobs(payload: dict) -> dict:
    return {**payload, "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS, "logprob_start_len": -1}


def request_mix(vocab: int, seed: int, prefix_len: int = 600, prompt_len: int = 64, max_new_tokens: int = 48,
                deterministic: bool = False) -> list[Request]:
    """The mix (29 requests), the same for the same arguments; kinds interleaved, so the
    radix tree holds several branches at once.

    Args:
        vocab: the target's vocabulary size (prompt ids stay 1000 clear of both ends).
        seed: picks prompts, stop-id sets, biased ids and sampling seeds.
        prefix_len: the shared prefix of each prefix group (radix-cache hits).
        deterministic: the servers run with ``--enable-deterministic-inference``, so
            ``sampling_seed`` is honoured and seeded sampling is compared.

    Raises:
        ValueError: a vocabulary too small for the id ranges.
    """
    if vocab < 4096:
        raise ValueError(f"vocab {vocab}: at least 4096 ids are needed")
    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(1000, vocab - 1000) for _ in range(n)]

    def stop_set(share):
        common = {t for t in COMMON_IDS if t < vocab}
        extra = set(rng.sample(range(vocab), vocab // share)) if share else set()
        return sorted(common | extra)

    n = max_new_tokens
    kinds: list[list[Request]] = []
    greedy_prompts = [ids(prompt_len) for _ in range(4)]
    kinds.append([Request(f"greedy-{i}", _greedy(p, n), True) for i, p in enumerate(greedy_prompts)])
    kinds.append([Request("logprobs-0", _with_logprobs(_greedy(ids(prompt_len), n)), True),
                  Request("logprobs-1", _with_logprobs(_greedy(ids(prompt_len // 2 + 1), n)), True),
                  # logprobs cut at a stop: the last entry is the matched id's
                  Request("logprobs-2", _with_logprobs(_greedy(ids(prompt_len), n, stop_token_ids=stop_set(2))), True)])
    # The greedy prompts again: whole-prompt radix hits, and greedy-k's output up to a stop.
    kinds.append([Request(f"stop-ids-{k}", _greedy(greedy_prompts[k], n, stop_token_ids=stop_set(share)), True)
                  for k, share in enumerate(STOP_SHARES)])
    kinds.append([Request(f"short-{k}", _greedy(ids(prompt_len), k + 1), True) for k in range(3)])
    for group, count in (("a", 4), ("b", 3)):
        prefix = ids(prefix_len)
        tails = [ids(prompt_len), ids(prompt_len), ids(1)]
        prompts = [prefix + tails[0], prefix + tails[1], prefix + tails[0][:17], prefix + tails[0]][:count]
        if group == "b":
            prompts[2] = prefix + tails[2]  # a one-token extend after the cached prefix
        reqs = [Request(f"prefix-{group}-{i}", _greedy(p, n), True) for i, p in enumerate(prompts)]
        if group == "b":
            reqs[1] = Request(reqs[1].name, _with_logprobs(reqs[1].payload), True)
        kinds.append(reqs)
    kinds.append([Request("penalty-0", _greedy(ids(prompt_len), n, frequency_penalty=0.5), True),
                  Request("penalty-1", _greedy(ids(prompt_len), n, presence_penalty=0.5), True),
                  Request("penalty-2", _greedy(ids(prompt_len), n, repetition_penalty=1.3, frequency_penalty=0.3), True)])
    biased = rng.sample(range(1000, vocab - 1000), 4)
    kinds.append([Request("logit-bias-0", _greedy(ids(prompt_len), n, logit_bias={str(biased[0]): 5.0, str(biased[1]): 5.0,
                                                                                  str(biased[2]): -5.0}), True),
                  Request("logit-bias-1", _greedy(ids(prompt_len), n, logit_bias={str(biased[3]): 100.0}), True)])
    kinds.append([Request(f"sampled-seeded-{i}", {"input_ids": ids(prompt_len), "sampling_params": {
        "max_new_tokens": n, **SAMPLED, "sampling_seed": rng.randrange(1 << 31)}}, deterministic) for i in range(2)])
    kinds.append([Request(f"sampled-unseeded-{i}", {"input_ids": ids(prompt_len), "sampling_params": {
        "max_new_tokens": n, **SAMPLED}}, False) for i in range(2)])
    # Interleaved, sampled requests last: an unseeded sample differs between servers, and an NGRAM server's
    # trie would then draft the compared requests after it differently.
    sampled, compared = kinds[-2:], kinds[:-2]
    mix: list[Request] = []
    for group in (compared, sampled):
        for i in range(max(len(k) for k in group)):
            mix += [k[i] for k in group if i < len(k)]
    return mix


def _outcome(req: Request, data) -> Outcome:
    if isinstance(data, list):
        data = data[0]
    meta = data.get("meta_info") or {}
    lp = None
    if req.payload.get("return_logprob"):
        tokens = meta.get("output_token_logprobs") or []
        tops = list(meta.get("output_top_logprobs") or [])
        tops += [None] * (len(tokens) - len(tops))
        lp = tuple((tuple(tok[:2]), tuple(tuple(t[:2]) for t in (top or ()))) for tok, top in zip(tokens, tops))
    cached = meta.get("cached_tokens")
    return Outcome(req.name, tuple(int(t) for t in data.get("output_ids") or ()), meta.get("finish_reason"), lp, None,
                   req.compared, cached if isinstance(cached, int) else None)


def _send(base: str, req: Request, timeout: float) -> Outcome:
    try:
        return _outcome(req, _post(f"{base}/generate", req.payload, timeout))
    except Exception as exc:  # noqa: BLE001 (a broken reply, a dropped connection: this request's error, never the run's)
        return Outcome(req.name, (), None, None, str(exc) or repr(exc), req.compared)


def sequential(base: str, mix: list[Request], timeout: float = 300.0) -> list[Outcome]:
    """Send the mix one request at a time, in order; an HTTP error is an ``Outcome``
    with ``error`` set, never raised."""
    return [_send(base, req, timeout) for req in mix]


def _first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _at(seq, i, n=4):
    return list(seq[i:i + n]) if seq is not None else None


def compare(stock: list[Outcome], other: list[Outcome]) -> dict:
    """Another server's outcomes against stock's, request by request.

    Compared requests must match in output ids, finish reason and logprobs (floats bit for
    bit, as JSON gave them); a mismatch gives the first differing position (``at``) and
    a few values from there. Requests with ``compared`` False are checked only for errors,
    empty output and aborts. Any error on either side makes the result non-identical.
    ``stopped`` and ``cached`` say what the mix exercised on stock: the requests that
    ended on a matched stop (or EOS) id, and those that hit the radix cache.

    Raises:
        ValueError: the two lists are not outcomes of the same mix.
    """
    if [o.name for o in stock] != [o.name for o in other]:
        raise ValueError("stock and other are not outcomes of the same requests in the same order")
    errors, mismatches, unchecked = [], [], []
    same = compared = 0
    for s, o in zip(stock, other):
        bad = False
        for side, out in (("stock", s), ("other", o)):
            if out.error is not None:
                errors.append(f"{side} {out.name}: {out.error}")
            elif not out.output_ids:
                errors.append(f"{side} {out.name}: empty output")
            elif (out.finish_reason or {}).get("type") == "abort":
                errors.append(f"{side} {out.name}: aborted: {out.finish_reason}")
        if s.error is not None or o.error is not None:
            if s.error != o.error:
                mismatches.append({"name": s.name, "what": "error", "at": None, "stock": s.error, "other": o.error})
            bad = True
        if not s.compared:
            unchecked.append(s.name)
            continue
        compared += 1
        if bad:
            continue
        at = _first_difference(s.output_ids, o.output_ids)
        if at is not None:
            mismatches.append({"name": s.name, "what": "ids", "at": at,
                               "stock": _at(s.output_ids, at), "other": _at(o.output_ids, at)})
            bad = True
        if s.finish_reason != o.finish_reason:
            mismatches.append({"name": s.name, "what": "finish_reason", "at": None,
                               "stock": s.finish_reason, "other": o.finish_reason})
            bad = True
        at = _first_difference(s.logprobs or (), o.logprobs or ())
        if at is not None or (s.logprobs is None) != (o.logprobs is None):
            mismatches.append({"name": s.name, "what": "logprobs", "at": at,
                               "stock": _at(s.logprobs, at or 0, 1), "other": _at(o.logprobs, at or 0, 1)})
            bad = True
        same += not bad
    return {
        "identical": not errors and not mismatches,
        "compared": compared,
        "same": same,
        "unchecked": unchecked,
        "errors": errors,
        "mismatches": mismatches,
        "stopped": [s.name for s in stock if (s.finish_reason or {}).get("type") == "stop"],
        "cached": [s.name for s in stock if s.cached_tokens],
    }


def _stream_and_cut(base: str, payload: dict, cut_after: int, timeout: float) -> str:
    """Stream one request and hang up after ``cut_after`` data chunks: "cut", or "done"
    where the stream ended first. Raises ``ClientError`` on an HTTP or stream error."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body=json.dumps(payload).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ClientError(f"{base}/generate (stream): HTTP {resp.status}: {resp.read(300)!r}")
        chunks = 0
        while chunks < cut_after:
            line = resp.readline()
            if not line:
                raise ClientError(f"{base}/generate (stream): closed after {chunks} chunks without [DONE]")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                return "done"
            chunk = json.loads(data)
            if "error" in chunk:
                raise ClientError(f"{base}/generate (stream): {chunk['error']}")
            if ((chunk.get("meta_info") or {}).get("finish_reason") or {}).get("type") == "abort":
                raise ClientError(f"{base}/generate (stream): aborted by the server: {chunk['meta_info']['finish_reason']}")
            chunks += 1
        return "cut"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ClientError(f"{base}/generate (stream): {exc!r}") from None
    finally:
        conn.close()  # unread data in the socket: the kernel resets the connection


def concurrent(base: str, mix: list[Request], clients: int = 16, requests: int = 96, aborted: int = 12, seed: int = 0,
               timeout: float = 300.0, abort_tokens: int = ABORT_TOKENS, cut_after: int = CUT_AFTER) -> dict:
    """``requests`` requests drawn (seeded) from the mix, sent by ``clients`` threads in a
    closed loop; ``aborted`` of them go with ``"stream": true`` for ``abort_tokens`` tokens
    (``ignore_eos``) and the client hangs up after ``cut_after`` chunks, so SGLang aborts
    them. Outputs are not compared (batching changes the numerics); a request counts as
    an error on an HTTP failure, an empty output or an abort it did not ask for.

    A cut request runs on in the server until its abort (2 s later): KV for up to
    ``clients + aborted`` requests can be held at once.

    Returns ``{"errors": [...], "completed": n, "aborted": n (streams really cut),
    "health": bool (after the load)}``.
    """
    rng = random.Random(seed)
    drawn = [rng.choice(mix) for _ in range(requests)]
    cut = set(rng.sample(range(requests), min(aborted, requests)))
    errors: list[str] = []
    counts = {"completed": 0, "aborted": 0}
    lock = threading.Lock()
    next_index = [0]

    def one(i: int) -> tuple[str | None, str | None]:  # (what it counts as, error)
        req = drawn[i]
        if i in cut:
            sampling = {**req.payload["sampling_params"], "max_new_tokens": abort_tokens, "ignore_eos": True}
            payload = {**req.payload, "sampling_params": sampling, "stream": True}
            try:
                ended = _stream_and_cut(base, payload, cut_after, timeout)
            except ClientError as exc:
                return None, f"{req.name} (stream #{i}): {exc}"
            return ("aborted" if ended == "cut" else "completed"), None
        out = _send(base, req, timeout)
        if out.error is not None:
            return None, f"{req.name} #{i}: {out.error}"
        if not out.output_ids:
            return None, f"{req.name} #{i}: empty output"
        if (out.finish_reason or {}).get("type") == "abort":
            return None, f"{req.name} #{i}: aborted: {out.finish_reason}"
        return "completed", None

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= requests:
                return
            try:
                kind, error = one(i)
            except Exception as exc:  # a reply of an odd shape: every request still gets its answer
                kind, error = None, f"{drawn[i].name} #{i}: {exc!r}"
            with lock:
                if error:
                    errors.append(error)
                else:
                    counts[kind] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"errors": errors, **counts, "health": health(base, timeout=10.0)}


def token_usage(base: str, timeout: float = 5.0) -> int | None:
    """KV tokens the server holds for requests, summed over DP ranks: ``/v1/loads``'s
    ``num_total_tokens`` (``num_used_tokens`` plus the waiting queue's), 0 once drained,
    radix-cached tokens excluded (evictable). None where the server does not say."""
    try:
        with urllib.request.urlopen(f"{base}/v1/loads?include=core", timeout=timeout) as resp:
            loads = json.loads(resp.read()).get("loads")
    except (urllib.error.URLError, OSError, ValueError, AttributeError, http.client.HTTPException):
        return None
    if not isinstance(loads, list) or not loads:
        return None
    total = 0
    for load in loads:
        value = load.get("num_total_tokens", load.get("num_used_tokens")) if isinstance(load, dict) else None
        if not isinstance(value, int):
            return None
        total += value
    return total


def wait_drained(base: str, timeout: float = 60.0, floor: int = 0, poll_s: float = 0.2) -> int | None:
    """Poll ``token_usage`` until it is at most ``floor`` (0 with SGLang's radix cache on)
    or ``timeout`` passes: the last reading (above ``floor``: tokens never given back),
    or None where the server never said."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        value = token_usage(base)
        last = value if value is not None else last
        if value is not None and value <= floor:
            return value
        if time.monotonic() > deadline:
            return last
        time.sleep(poll_s)


# A failure, whichever process logged it (SGLang's lines carry no level name:
# "[time TP0] message"; uvicorn's do: "ERROR:    Exception in ASGI application").
_PROBLEM = re.compile("|".join((
    r"Traceback \(most recent call last\)", r"\bERROR\b", r"\bException\b", r"hit an exception",
    r"\[http_server\] Error", r"CUDA error", r"CUDA out of memory", r"OutOfMemoryError", r"illegal memory access",
    r"device-side assert", r"CUBLAS_STATUS_", r"cudaError", r"NCCL error", r"memory leak detected",
    r"watchdog timeout", r"SIGQUIT", r"Segmentation fault", r"core dumped", r"Fatal Python error",
    r"terminate called", r"crashed with exit code", r"\bAbort", r"retract_decode: aborted",
    r'"[A-Z]+ /(?!health)\S* HTTP/1\.[01]" 5\d\d ',  # uvicorn's access line; /health says 503 until ready
)))
# SGLang's normal lines about a client that hung up (tokenizer_manager, http_server; the
# scheduler's "Abort running request" is a debug line).
_NORMAL = re.compile("|".join((
    r"\[http_server\] Client disconnected: ", r"Abort request for rid=\S* not found in rid_to_state",
    r"Abort (running|queued|chunked prefill) request", r"is disconnected from the client side",
)))
# Once SGLang logs "SIGTERM received" (the e2e's stop), its shutdown follows: "Subprocess
# scheduler_0 ... crashed with exit code -15. Triggering SIGQUIT", "SIGQUIT received": no failure.
_SHUTDOWN = "SIGTERM received"


def log_problems(log_text: str, ignore: tuple[str, ...] = ()) -> list[str]:
    """The lines of a server log that mean a failure: tracebacks (with their exception
    line), errors, CUDA errors, KV leaks, watchdog timeouts, crashes, aborts other than
    a hung-up client's, HTTP 5xx; none after SGLang's "SIGTERM received" (its shutdown).
    ``ignore``: regexes of further lines to pass over."""
    skip = re.compile("|".join(ignore)) if ignore else None
    found: list[str] = []
    in_traceback = False
    for line in log_text.splitlines():
        if _SHUTDOWN in line:
            break
        if in_traceback:
            if line[:1].isspace() or not line.strip():
                continue
            in_traceback = False
            if not _PROBLEM.search(line):
                found.append(line)  # the exception the traceback ended in
                continue
        if not _PROBLEM.search(line) or _NORMAL.search(line) or (skip and skip.search(line)):
            continue
        found.append(line)
        in_traceback = "Traceback (most recent call last)" in line
    return found


def after_aborts(base: str, mix: list[Request], timeout: float = 300.0) -> Outcome:
    """The mix's first greedy request once more, after the concurrent phase, as
    "after-aborts": compare it with stock's (``compare([stock], [other])``)."""
    req = next((r for r in mix if r.name.startswith("greedy-")), None) or next(r for r in mix if r.compared)
    return _send(base, Request("after-aborts", req.payload, True), timeout)
