"""The benchmark's HTTP client for SGLang's native ``/generate`` with ``input_ids``
(the servers run with ``--skip-tokenizer-init``). Standard library only."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


class ClientError(RuntimeError):
    pass


@dataclass(frozen=True)
class Result:
    """One request: what came back and how long it took (seconds, host clock)."""

    output_ids: tuple[int, ...]
    latency: float
    completion_tokens: int
    accept_length: float | None
    logprobs: tuple | None = None  # per position: ((logprob, id), ((logprob, id), ...top-k))

    @property
    def tok_per_s(self) -> float:
        return self.completion_tokens / self.latency if self.latency > 0 else 0.0


def _post(url: str, payload: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise ClientError(f"{url}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:  # HTTPException: a cut reply
        raise ClientError(f"{url}: {exc!r}" if isinstance(exc, http.client.HTTPException) else f"{url}: {exc}") from None


def flush_cache(base: str, wait_s: float = 10.0) -> None:
    """SGLang's ``/flush_cache``: once the server is idle (it waits up to ``wait_s`` for that), the radix
    cache, the request pools and the speculative draft worker's cache pool (NGRAM: its trie) are reset.
    Raises ClientError where it did not flush."""
    req = urllib.request.Request(f"{base}/flush_cache?timeout={wait_s:g}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=wait_s + 30) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise ClientError(f"{base}/flush_cache: HTTP {exc.code}: {exc.read()[:200]!r}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise ClientError(f"{base}/flush_cache: {exc}") from None


def health(base: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def server_info(base: str, timeout: float = 5.0) -> dict:
    """SGLang's ``/server_info`` (its server arguments and scheduler facts), or {} where the server
    does not answer it."""
    try:
        with urllib.request.urlopen(f"{base}/server_info", timeout=timeout) as resp:
            info = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def kv_tokens(base: str, timeout: float = 5.0) -> int | None:
    """The KV pool's size in tokens (SGLang's ``/server_info`` field ``max_total_num_tokens``),
    or None where the server does not say."""
    value = server_info(base, timeout).get("max_total_num_tokens")
    return value if isinstance(value, int) else None


def wait_ready(base: str, deadline_s: float, alive=lambda: True, poll_s: float = 0.5) -> float:
    """Seconds until ``/health`` first answers 200; raises when ``alive()`` turns
    False (the server exited) or the deadline passes."""
    t0 = time.perf_counter()
    while True:
        if health(base):
            return time.perf_counter() - t0
        if not alive():
            raise ClientError(f"{base}: the server exited before it was ready")
        if time.perf_counter() - t0 > deadline_s:
            raise ClientError(f"{base}: not ready after {deadline_s:.0f} s")
        time.sleep(poll_s)


def wait_ready_all(servers: dict, deadline_s: float, poll_s: float = 0.5) -> dict:
    """``wait_ready`` for servers started together, each polled by its own thread: name ->
    seconds from ``t0`` until its ``/health`` first answered, or the ``ClientError``. Polled
    one after another, a later server's time would include the earlier ones' waits.
    ``servers``: name -> (base, t0 on ``time.perf_counter``, alive)."""
    out: dict = {}

    def poll(name, base, t0, alive):
        try:
            wait_ready(base, deadline_s - (time.perf_counter() - t0), alive, poll_s)
            out[name] = time.perf_counter() - t0
        except Exception as exc:  # e.g. http.client's own errors: every server still gets its answer
            out[name] = exc if isinstance(exc, ClientError) else ClientError(f"{base}: {exc!r}")

    threads = [threading.Thread(target=poll, args=(name, *spec), daemon=True) for name, spec in servers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def generate(base: str, input_ids: list[int], max_new_tokens: int, logprobs: int = 0,
             timeout: float = 300.0) -> Result:
    """One greedy request (temperature 0, EOS ignored so every request runs its length)."""
    payload = {
        "input_ids": list(input_ids),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    if logprobs:
        payload.update(return_logprob=True, top_logprobs_num=logprobs, logprob_start_len=-1)
    t0 = time.perf_counter()
    data = _post(f"{base}/generate", payload, timeout)
    latency = time.perf_counter() - t0
    if isinstance(data, list):
        data = data[0]
    meta = data.get("meta_info", {})
    ids = tuple(int(t) for t in data.get("output_ids", ()))
    lp = None
    if logprobs:
        tokens = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        # SGLang's entries are [logprob, token_id, text]; text is None without a tokenizer.
        lp = tuple(
            (tuple(tok[:2]), tuple(tuple(t[:2]) for t in (top or ())))
            for tok, top in zip(tokens, list(tops) + [None] * (len(tokens) - len(tops)))
        )
    return Result(ids, latency, int(meta.get("completion_tokens", len(ids))), meta.get("spec_accept_length"), lp)


@dataclass(frozen=True)
class Load:
    """A measurement window: every request's result and the window's host times."""

    results: tuple[Result, ...]
    t_start: float
    t_end: float
    errors: tuple[str, ...] = ()

    @property
    def wall(self) -> float:
        return self.t_end - self.t_start


def run_load(base: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int,
             timeout: float = 300.0) -> Load:
    """Send ``prompts`` with ``concurrency`` requests in flight (closed loop: each
    worker sends its next request when the previous one returns)."""
    results: list[Result | None] = [None] * len(prompts)
    errors: list[str] = []
    lock = threading.Lock()
    next_index = [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(prompts):
                return
            try:
                results[i] = generate(base, prompts[i], max_new_tokens, timeout=timeout)
            except ClientError as exc:
                with lock:
                    errors.append(str(exc))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Load(tuple(r for r in results if r is not None), t0, time.perf_counter(), tuple(errors))
