"""``python -m sglang_hostsync_plugin.e2e``: stock SGLang vs the plugin in real servers.

For each configuration, every arm's ``sglang.launch_server`` starts at once on the
one GPU (own port, own ``--mem-fraction-static``); then the client drives them one
at a time, so only one server is busy: a warm-up at each concurrency, a greedy identity pass (token
ids and top-k logprobs, against stock), then for each concurrency ``--rounds``
rounds with the arm order reversed every other round (ABBA). Audited arms write the
audit slot's per-step trace; each measurement window is cut from it by host time (in a
multi-process server, e.g. ``--server-arg=--tp-size --server-arg=2``, from each rank's own
trace: rank 0 in the main table, the others in a table of their own).
Output under ``--out``: ``e2e.json`` (every round, raw), ``e2e.md`` (the table),
``e2e.png`` (tok/s/user per arm over stock) and each server's log.
Exit status: 0 when every server started and every arm's greedy outputs equal
stock's; 1 otherwise; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

from ..slots.audit import parse_trace, rank_path
from . import checkpoints, client, matrix, procs, stats, traffic
from .png import bar_chart

HOSTSYNC_ENV_PREFIXES = ("SGLANG_HOSTSYNC_", "SGLANG_ENABLE_HOSTSYNC_PLUGIN")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_hostsync_plugin.e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(matrix.CONFIGS), help=f"comma list of {', '.join(matrix.CONFIGS)}")
    ap.add_argument("--arms", default=",".join(matrix.DEFAULT_ARMS), help=f"comma list of {', '.join(matrix.ARMS)}")
    ap.add_argument("--slots", action="append", default=[], metavar="LIST",
                    help="an extra arm with this SGLANG_HOSTSYNC_SLOTS (audit is added); repeatable")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6,
                    help="requests per window (at least --requests-per-user per concurrent user)")
    ap.add_argument("--requests-per-user", type=int, default=2, metavar="N",
                    help="a window's least requests per concurrent user (a c8 window of 2 each lasted 0.6 s)")
    ap.add_argument("--passes", type=int, default=1, metavar="K",
                    help="split each round's window into K passes over the arms (order reversed pass by pass; "
                         "each at least one request per concurrent user), so that host drift within a round "
                         "reaches every arm alike; a round's figure pools its passes' requests")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--prompt-kind", choices=PROMPT_KINDS, default="random",
                    help="the timed rounds' and identity pass's prompts: 'random' ids, or 'repeated' (one random "
                         f"passage of {PASSAGE} ids repeated to --prompt-len: text an n-gram drafter can copy from)")
    ap.add_argument("--identity-prompts", type=int, default=4)
    ap.add_argument("--identity-tokens", type=int, default=64)
    ap.add_argument("--top-logprobs", type=int, default=5, help="0: compare token ids only")
    ap.add_argument("--model-path", help="a target checkpoint of your own (default: the benchmark writes its own, --weights)")
    ap.add_argument("--draft-model-path", help="a real draft checkpoint for the draft-model configurations run (STANDALONE or EAGLE3)")
    ap.add_argument("--weights", choices=("checkpoint", "dummy"), default="checkpoint",
                    help="without --model-path: 'checkpoint' writes random-weight safetensors (a target and drafts "
                         "that partly agree with it: real acceptance); 'dummy' runs SGLang's --load-format dummy "
                         "(outputs collapse: speed runs only)")
    ap.add_argument("--checkpoint-shape", choices=sorted(checkpoints.CHECKPOINT_SHAPES), default="small",
                    help="the written checkpoints' shape (--weights checkpoint)")
    ap.add_argument("--dummy-shape", choices=sorted(matrix.DUMMY_SHAPES), default="llama-8b",
                    help="the dummy-weight target's shape (--weights dummy); llama-1b: a GPU step short "
                         "enough that host time per step sets tok/s")
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--mem-fraction-static", type=float, default=matrix.Options.mem_fraction_static,
                    help="per server, of the GPU memory free when it starts")
    ap.add_argument("--max-total-tokens", type=int, default=matrix.Options.max_total_tokens,
                    help="per server: the KV pool size, which makes servers that start together fit")
    ap.add_argument("--simulate-acc-len", type=float, default=0.0,
                    help="SGLANG_SIMULATE_ACC_LEN (default 0: real acceptance); > 0 replaces the target's accept "
                         "decision: speed runs only, the report says so")
    ap.add_argument("--no-radix-cache", action="store_true", help="pass --disable-radix-cache to every server")
    ap.add_argument("--no-sleep-on-idle", action="store_true",
                    help="do not pass --sleep-on-idle to every server (then each idle arm's scheduler spins a CPU "
                         "while another arm is timed)")
    ap.add_argument("--traffic", choices=("full", "sequential", "off"), default="full",
                    help="the real-traffic pass before the timed rounds: the request mix one at a time against "
                         "stock ('sequential'), then concurrent clients with aborted streams ('full')")
    ap.add_argument("--traffic-clients", type=int, default=16)
    ap.add_argument("--traffic-requests", type=int, default=96)
    ap.add_argument("--traffic-aborts", type=int, default=12)
    ap.add_argument("--random-seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=31000, help="first port; one per arm")
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="stop starting new work after S seconds (results so far are reported)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="appended to every launch command; repeatable (--server-arg=--foo)")
    ap.add_argument("--plugin-env", action="append", default=[], metavar="KEY=VALUE",
                    help="added to every plugin arm's environment; repeatable (e.g. SGLANG_HOSTSYNC_GLUE_CHECK=50)")
    ap.add_argument("--server-module", default="sglang.launch_server", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="output directory (default hostsync-e2e-<UTC time>)")
    ap.add_argument("--dry-run", action="store_true", help="print the matrix and launch commands, start nothing")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="start nothing: one report (in --out) from the e2e.json of earlier runs")
    return ap


def options(args) -> matrix.Options:
    return matrix.Options(
        model_path=args.model_path, draft_model_path=args.draft_model_path, dummy_shape=args.dummy_shape,
        weights=args.weights, checkpoint_shape=args.checkpoint_shape, radix_cache=not args.no_radix_cache,
        sleep_on_idle=not args.no_sleep_on_idle,
        attention_backend=args.attention_backend,
        mem_fraction_static=args.mem_fraction_static, max_total_tokens=args.max_total_tokens,
        random_seed=args.random_seed, simulate_acc_len=args.simulate_acc_len,
        cuda_graph_max_bs=max(args.concurrency), extra_server_args=tuple(args.server_arg),
        plugin_env=matrix.parse_plugin_env(args.plugin_env), server_module=args.server_module,
    )


def model_paths(opts: matrix.Options, out_dir: str) -> dict[str, str]:
    """Where the benchmark's own models are (or will be) written, by ``matrix.dummy_models`` key."""
    root = os.path.join(out_dir, "models")
    if opts.dummy:
        return {name: os.path.join(root, f"dummy-{name}") for name in matrix.dummy_models()}
    return checkpoints.checkpoint_paths(root, opts.checkpoint_shape, opts.random_seed)


def write_models(opts: matrix.Options, out_dir: str) -> dict[str, str]:
    """The benchmark's own models written under ``out_dir`` (kept where already complete), or the user's."""
    root = os.path.join(out_dir, "models")
    if opts.dummy:
        return matrix.write_models(root, opts.dummy_shape)
    if opts.model_path is not None:
        return {"target": opts.model_path, **({"draft": opts.draft_model_path} if opts.draft_model_path else {})}
    t = time.perf_counter()
    say(f"writing the {opts.checkpoint_shape} random-weight checkpoints under {root}")
    models = checkpoints.write_checkpoints(root, opts.checkpoint_shape, opts.random_seed)
    say(f"checkpoints ready in {time.perf_counter() - t:.1f} s")
    return models


def model_vocab(opts: matrix.Options) -> int:
    """The target's vocabulary the prompts draw from (a checkpoint of the user's: Llama-2's 32000)."""
    if opts.dummy:
        return matrix.DUMMY_SHAPES[opts.dummy_shape]["vocab_size"]
    if opts.model_path is None:
        return checkpoints.CHECKPOINT_SHAPES[opts.checkpoint_shape]["vocab_size"]
    try:
        with open(os.path.join(opts.model_path, "config.json")) as f:
            return int(json.load(f)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 32000


def tokens_needed(args) -> int:
    """KV tokens the run's largest load holds at once: the highest concurrency's requests, each with its
    prompt and output, or one identity request (they run one at a time) where that is more."""
    return max(max(args.concurrency) * (args.prompt_len + args.max_new_tokens), args.prompt_len + args.identity_tokens)


def plan(args) -> tuple[list[matrix.Config], list[matrix.Arm], matrix.Options]:
    configs = matrix.parse_configs(args.configs)
    arms = matrix.parse_arms(args.arms, args.slots)
    if min(args.rounds, *args.concurrency, args.requests, args.requests_per_user, args.passes) < 1:
        raise ValueError("--rounds, --concurrency, --requests, --requests-per-user and --passes must be positive")
    if args.max_total_tokens < tokens_needed(args):
        raise ValueError(f"--max-total-tokens {args.max_total_tokens} is fewer than the {tokens_needed(args)} "
                         "KV tokens the run's largest load holds (the highest --concurrency x (--prompt-len + "
                         "--max-new-tokens), or one identity request): a request that does not fit waits in SGLang's queue")
    if args.model_path is None and any(c.uses_draft_model for c in configs) and args.draft_model_path:
        raise ValueError("--draft-model-path needs --model-path (the dummy target has its own draft)")
    if args.draft_model_path and len({c.draft for c in configs if c.uses_draft_model}) > 1:
        raise ValueError("--draft-model-path is one draft model: run the STANDALONE and the EAGLE3 "
                         "configurations in separate runs")
    if args.dummy_shape != "llama-8b" and (args.model_path is not None or args.weights != "dummy"):
        raise ValueError("--dummy-shape shapes the dummy-weight target (--weights dummy, no --model-path)")
    if args.checkpoint_shape != "small" and (args.model_path is not None or args.weights != "checkpoint"):
        raise ValueError("--checkpoint-shape shapes the written checkpoints (--weights checkpoint, no --model-path)")
    if min(args.traffic_clients, args.traffic_requests) < 1 or not 0 <= args.traffic_aborts <= args.traffic_requests:
        raise ValueError("--traffic-clients and --traffic-requests must be positive, --traffic-aborts within the requests")
    return configs, arms, options(args)


def launches(configs, arms, opts, out_dir: str, models: dict[str, str], port: int) -> list[matrix.Launch]:
    return [matrix.launch(c, a, port + i, opts, models, out_dir) for c in configs for i, a in enumerate(arms)]


PROMPT_KINDS = ("random", "repeated")
PASSAGE = 24  # ids in a repeated prompt's passage


def prompts(n: int, length: int, vocab: int, seed: int, kind: str = "random") -> list[list[int]]:
    rng = random.Random(seed)
    if kind == "random":
        return [[rng.randrange(1000, vocab - 1000) for _ in range(length)] for _ in range(n)]
    passages = [[rng.randrange(1000, vocab - 1000) for _ in range(PASSAGE)] for _ in range(n)]
    return [(p * (length // PASSAGE + 1))[:length] for p in passages]


def _server_env(launch: matrix.Launch | None = None) -> dict[str, str]:
    """What a server's process gets: this environment less the plugin's settings, plus the
    launch's own (None: what every server shares)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(HOSTSYNC_ENV_PREFIXES)}
    env.update(launch.env if launch is not None else {})
    env["PYTHONUNBUFFERED"] = "1"
    return env


_FIND = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"


def preflight(needs: dict[str, list[str]], opts: matrix.Options) -> str | None:
    """Why the servers cannot start, checked in their own interpreter and environment before any
    starts (None: nothing missing). A missing ``needs`` module fails every arm, stock's too."""
    if not needs:
        return None
    env = _server_env()
    try:
        proc = subprocess.run([opts.python, "-c", _FIND, *needs], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the servers' interpreter {opts.python} did not run: {exc}"
    if proc.returncode != 0:
        return f"the servers' interpreter {opts.python} failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}"
    missing = proc.stdout.split()
    if not missing:
        return None
    return "; ".join(f"the servers' interpreter {opts.python} cannot import {m!r} (pip: "
                     f"{matrix.SERVER_PACKAGES.get(m, m)}), which {', '.join(needs[m])} need(s) at server start"
                     for m in missing) + "; install it or leave those out"


def ports_answering(first: int, count: int) -> list[int]:
    """The ports of ``first .. first+count-1`` where something already accepts on 127.0.0.1: a
    server there (one an earlier run left, say) would answer the e2e's polls in place of its own."""
    busy = []
    for port in range(first, first + count):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                busy.append(port)
        except OSError:
            pass
    return busy


PORT_WAIT_S = 15.0  # between configurations: how long a stopped server's port may take to close


def ports_problem(first: int, count: int, wait_s: float = 0.0) -> str | None:
    deadline = time.monotonic() + wait_s
    busy = ports_answering(first, count)
    while busy and time.monotonic() < deadline:
        time.sleep(0.5)
        busy = ports_answering(first, count)
    if not busy:
        return None
    return (f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 already answer (a server of an earlier run?): "
            f"the e2e would poll and measure that instead of its own server; stop it or pass another --port "
            f"(it uses {first}-{first + count - 1})")


class Server:
    def __init__(self, launch: matrix.Launch):
        self.launch = launch
        self.base = f"http://127.0.0.1:{launch.port}"
        self.log = open(launch.log, "w")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(list(launch.argv), stdout=self.log, stderr=subprocess.STDOUT,
                                     env=_server_env(launch), start_new_session=True)
        self.info: dict = {"command": launch.shell(), "log": os.path.basename(launch.log)}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exited_within(self, seconds: float) -> bool:
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self.log.close()

    def _flush(self) -> None:
        if not self.log.closed:  # a server stopped after it failed: its log is complete
            self.log.flush()

    def log_text(self) -> str:
        self._flush()
        with open(self.launch.log, errors="replace") as f:
            return f.read()

    def log_tail(self, n: int = 30) -> str:
        self._flush()
        with open(self.launch.log, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def slot_checks(self) -> list[str]:
        """Each slot's last self-check line in this server's log ("hostsync: <slot> check: ...")."""
        self._flush()
        last: dict[str, str] = {}
        with open(self.launch.log, errors="replace") as f:
            for line in f:
                at = line.find("hostsync: ")
                if at >= 0 and " check: " in line:
                    text = line[at + len("hostsync: "):].strip()
                    last[text.split(" ", 1)[0]] = text
        return list(last.values())

    def status_block(self) -> list[str]:
        """The plugin's startup status lines from this server's log."""
        self._flush()
        with open(self.launch.log, errors="replace") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if "hostsync: sglang " in line and "SGLANG_HOSTSYNC_SLOTS=" in line:
                block = [line]
                for more in lines[i + 1:]:
                    if not more.startswith("  "):
                        break
                    block.append(more)
                return block
        return []


LOW_FREE_GIB = 8.0  # c8 rounds grow every server's allocator after the warm-up


def gpu_free_gib() -> float | None:
    """The least free memory of the visible GPUs (nvidia-smi; None without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return min(float(v) for v in out) / 1024 if out else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def say(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def save(result: dict, out_dir: str) -> None:
    """e2e.json as it stands (written whole, then renamed: a kill mid-write leaves the last one)."""
    path = os.path.join(out_dir, "e2e.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def stop_all(servers) -> None:
    """Stop every server at once: one after another, their shutdowns (up to 40 s each) added up
    past a caller's time limit before the report was written."""
    threads = [threading.Thread(target=srv.stop) for srv in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def window_requests(args, conc: int) -> int:
    """Requests in one arm's timed window at concurrency ``conc``."""
    return max(args.requests, args.requests_per_user * conc)


def round_passes(args, conc: int, rnd: int, order: list) -> list[tuple[int, list, range]]:
    """A round as (pass, arm order, the window's request indices): ``--passes`` slices of the window, each
    at least ``conc`` requests (a pass fewer where the window has too few), arms reversed pass by pass."""
    n = window_requests(args, conc)
    k = min(args.passes, n // conc)  # n >= conc: at least one pass
    cuts = [n * p // k for p in range(k + 1)]
    return [(p, order if (rnd * k + p) % 2 == 0 else order[::-1], range(cuts[p], cuts[p + 1])) for p in range(k)]


def passes_by_concurrency(args) -> dict[int, int]:
    """The passes each concurrency's rounds get (``--passes``, fewer where a window is too short)."""
    return {conc: len(round_passes(args, conc, 0, [])) for conc in args.concurrency}


class Budget:
    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.perf_counter() + seconds

    def spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline


def run_config(config, arms, opts, args, out_dir, models, port, prompt_pool, result, budget: Budget) -> None:
    busy = ports_problem(port, len(arms), PORT_WAIT_S)  # the previous configuration's servers are stopped, not always gone
    if busy:
        say(f"{config.name}: not started: {busy}")
        for arm in arms:
            result["servers"][f"{config.name}/{arm.name}"] = {"ready_s": None, "error": busy}
        return
    servers = {}
    try:  # a failure while launching stops the servers already started (one left up took the next run's ports)
        for i, arm in enumerate(arms):
            ln = matrix.launch(config, arm, port + i, opts, models, out_dir)
            say(f"{config.name}/{arm.name}: {ln.shell()}")
            servers[arm.name] = Server(ln)
        live = {}
        ready = client.wait_ready_all({name: (srv.base, srv.t0, srv.alive) for name, srv in servers.items()},
                                      args.ready_timeout)
        need = tokens_needed(args)
        restart_alone(servers, ready, args.ready_timeout, need)
        for name, srv in servers.items():
            key = f"{config.name}/{name}"
            try:
                if isinstance(ready[name], client.ClientError):
                    raise ready[name]
                srv.info["ready_s"] = ready[name]  # from its own launch, polled beside the others
                alien = not_its_own(srv)
                if alien:
                    raise client.ClientError(f"{srv.base}: {alien}")
                short = kv_short(srv, need)
                if short:  # its first request would wait until the client's timeout
                    raise client.ClientError(f"{srv.base}: {short}")
                t = time.perf_counter()
                client.generate(srv.base, prompt_pool[0], args.max_new_tokens)
                srv.info["first_request_s"] = time.perf_counter() - t
                srv.info["status_block"] = srv.status_block()
                live[name] = srv
                say(f"{key}: ready in {srv.info['ready_s']:.1f} s, first request {srv.info['first_request_s']:.2f} s")
            except client.ClientError as exc:
                srv.info.update(ready_s=None, error=str(exc), log_tail=srv.log_tail())
                say(f"{key}: FAILED: {exc}\n{srv.info['log_tail']}")
                srv.stop()  # left up, one ran beside the others' rounds (their run-ahead 0.000, H100 2026-12-06)
            result["servers"][key] = srv.info
        if "stock" not in live:
            say(f"{config.name}: the stock server did not start; nothing to compare")
            return
        if args.traffic != "off":
            traffic_pass(config, live, args, result, out_dir)
            if "stock" not in live:
                say(f"{config.name}: the stock server died in the real-traffic pass; nothing to compare")
                return
        identity_prompts = prompt_pool[: args.identity_prompts]
        outputs, fresh = {}, {}
        for name, srv in list(live.items()):
            # Warm-up at every measured concurrency: a batch size's first-use costs (Triton JIT, shared
            # through the on-disk cache by whichever server comes first) must not land in a round.
            for conc in args.concurrency:
                client.run_load(srv.base, prompt_pool[1:1 + max(2, conc)], conc, args.max_new_tokens)
            fresh[name] = fresh_trie(config, srv, f"{config.name}/{name}")
            try:
                outputs[name] = _identity_outputs(srv, identity_prompts, args)
            except client.ClientError as exc:
                _died(live.pop(name), f"{config.name}/{name}", f"the identity requests ({exc})")
                continue
            result["servers"][f"{config.name}/{name}"]["distinct_tokens"] = stats.distinct_tokens(outputs[name])
        if "stock" not in live:
            say(f"{config.name}: the stock server died; nothing to compare")
            return
        for name in live:
            if name != "stock":
                verdict = stats.compare_outputs(outputs["stock"], outputs[name])
                verdict["evidence"] = fresh["stock"] and fresh[name]
                result["identity"][f"{config.name}/{name}"] = verdict
                say(f"{config.name}/{name}: greedy identical to stock: {verdict['identical']}"
                    + ("" if verdict["identical"] else f" ({verdict['first_mismatch']})")
                    + ("" if verdict["evidence"] else " (no evidence: its trie could not be emptied)"))
        save(result, out_dir)
        free = gpu_free_gib()
        result["gpu_free_gib_after_warmup"][config.name] = free
        if free is not None and free < LOW_FREE_GIB:
            say(f"{config.name}: only {free:.1f} GiB of GPU memory free with {len(live)} servers up: a Triton kernel "
                "first loaded while serving can fail with CUDA OOM (SGLang warns 'device-loaded after serving "
                "started'); run fewer arms at a time or lower --max-total-tokens")
        order = [a for a in arms if a.name in live]
        passes = passes_by_concurrency(args)
        for conc in args.concurrency:
            n = window_requests(args, conc)
            for rnd in range(args.rounds):
                if budget.spent():
                    result["meta"]["stopped"] = "time budget spent"
                    say(f"{config.name}: time budget spent, stopping before c{conc} round {rnd}")
                    break
                for pss, arms_order, idx in round_passes(args, conc, rnd, order):
                    batch = [prompt_pool[(rnd * n + k) % len(prompt_pool)] for k in idx]
                    for arm in arms_order:
                        if arm.name not in live:
                            continue
                        # each arm's window (each pass) from an empty trie
                        fresh_trie(config, live[arm.name], f"{config.name}/{arm.name}")
                        pgids = [srv.proc.pid for srv in live.values()]
                        t0, before = time.perf_counter(), procs.groups(pgids)  # outside the timed window
                        load = client.run_load(live[arm.name].base, batch, conc, args.max_new_tokens)
                        after = procs.groups(pgids)
                        cpu = procs.arm_window(before, after, live[arm.name].proc.pid, load.wall,
                                               time.perf_counter() - t0)
                        result["rows"].append({
                            "config": config.name, "concurrency": conc, "arm": arm.name, "round": rnd, "pass": pss,
                            "t_start": load.t_start, "t_end": load.t_end, "errors": list(load.errors),
                            "load": stats.load_figures(load.results, load.wall), "cpu": cpu,
                        })
                        f = result["rows"][-1]["load"]
                        at = f"c{conc} round {rnd}" + (f" pass {pss}" if passes[conc] > 1 else "")
                        say(f"{config.name} c{conc} r{rnd}{f'.{pss}' if passes[conc] > 1 else ''} {arm.name}: "
                            f"{stats.fmt(f['tok_s_user_median'], '.1f')} tok/s/user"
                            + (f", {len(load.errors)} errors" if load.errors else ""))
                        if load.errors and live[arm.name].exited_within(5.0):
                            _died(live.pop(arm.name), f"{config.name}/{arm.name}", at)
                save(result, out_dir)  # every finished round survives a kill
        for name, srv in list(live.items()):  # the trace is written in batches: a last request flushes it
            try:
                client.generate(srv.base, prompt_pool[0], 32)
            except client.ClientError as exc:
                _died(srv, f"{config.name}/{name}", f"the final request ({exc})")
            srv.info["slot_checks"] = srv.slot_checks()
    finally:
        stop_all(servers.values())


# NGRAM drafts from a trie that holds every earlier request's output, which differ between any two
# servers after concurrent requests (batching changes the numerics): its next request can draft, and
# verify, differently (an H100, 2026-12-06: the identity pass after the concurrent phase differed at a
# token, the accept length at c1 read 4.18 against stock's 3.51). So every server's trie is emptied
# (``/flush_cache``) before each compared request set and each timed round; where that fails, the
# comparison is no evidence.
TRIE_ALGORITHMS = ("NGRAM",)


def fresh_trie(config, srv, key: str) -> bool:
    """Empties the server's trie where the algorithm drafts from one; False where it could not."""
    if config.algorithm not in TRIE_ALGORITHMS:
        return True
    try:
        client.flush_cache(srv.base)
    except client.ClientError as exc:
        say(f"{key}: the trie was not emptied ({exc})")
        return False
    return True


def traffic_pass(config, live: dict, args, result: dict, out_dir: str) -> None:
    """The real-traffic pass (``traffic``): the request mix one at a time on each server, compared with
    stock's token for token; then, with ``--traffic full``, concurrent clients with aborted streams on
    each server in turn, checked for request errors, ``/health``, the server log, the KV tokens back to
    their floor after the drain, and one request after the aborts compared with stock's. A server that
    dies is dropped from ``live`` (its rounds are skipped, the run fails)."""
    mix = traffic.request_mix(result["meta"]["vocab"], args.random_seed)
    seq = {}
    for name, srv in list(live.items()):
        seq[name] = traffic.sequential(srv.base, mix)
        if not srv.alive():
            _died(live.pop(name), f"{config.name}/{name}", "the real-traffic pass (one at a time)")
    for name, outcomes in seq.items():
        entry = result["traffic"].setdefault(f"{config.name}/{name}", {})
        entry["errors"] = [f"{o.name}: {o.error}" for o in outcomes if o.error]
        if name != "stock" and "stock" in seq:
            entry["sequential"] = traffic.compare(seq["stock"], outcomes)
            v = entry["sequential"]
            say(f"{config.name}/{name}: real traffic one at a time: {v['same']}/{v['compared']} identical to stock"
                + ("" if v["identical"] else f" (first: {v['mismatches'][:1]})"))
    if args.traffic == "full":
        after, fresh = {}, {}
        for name, srv in list(live.items()):
            entry = result["traffic"][f"{config.name}/{name}"]
            load = traffic.concurrent(srv.base, mix, clients=args.traffic_clients, requests=args.traffic_requests,
                                      aborted=args.traffic_aborts, seed=args.random_seed)
            entry["concurrent"] = load
            entry["tokens_after_drain"] = traffic.wait_drained(srv.base)
            fresh[name] = fresh_trie(config, srv, f"{config.name}/{name}")
            after[name] = traffic.after_aborts(srv.base, mix)
            if after[name].error or not after[name].output_ids:  # the aborts' damage shows here, trie or not
                entry["after_aborts_error"] = after[name].error or "an empty output"
            entry["log_problems"] = traffic.log_problems(srv.log_text())[:20]
            say(f"{config.name}/{name}: real traffic, {args.traffic_clients} clients: {load['completed']} completed, "
                f"{load['aborted']} aborted, {len(load['errors'])} errors, health {load['health']}, "
                f"tokens after the drain {entry['tokens_after_drain']}, log problems {len(entry['log_problems'])}")
            if not srv.alive():
                _died(live.pop(name), f"{config.name}/{name}", "the real-traffic pass (concurrent)")
        for name, outcome in after.items():
            if name != "stock" and "stock" in after:
                entry = result["traffic"][f"{config.name}/{name}"]
                entry["after_aborts"] = traffic.compare([after["stock"]], [outcome])
                entry["after_aborts"]["evidence"] = fresh["stock"] and fresh[name]
    save(result, out_dir)


def traffic_failures(result: dict) -> list[str]:
    """Each real-traffic check that failed, as ``config/arm: what``."""
    bad = []
    for key, t in result.get("traffic", {}).items():
        if t.get("errors"):
            bad.append(f"{key}: {len(t['errors'])} request errors one at a time")
        if t.get("sequential") and not t["sequential"]["identical"]:
            bad.append(f"{key}: outputs differ from stock one at a time")
        c = t.get("concurrent")
        if c and (c["errors"] or not c["health"]):
            bad.append(f"{key}: {len(c['errors'])} errors, health {c['health']} with concurrent clients")
        if t.get("log_problems"):
            bad.append(f"{key}: {len(t['log_problems'])} problem lines in the server log")
        if "tokens_after_drain" in t and t["tokens_after_drain"] != 0:
            bad.append(f"{key}: {t['tokens_after_drain']} KV tokens still held after the drain" if
                       t["tokens_after_drain"] is not None else f"{key}: no KV token count after the drain")
        if t.get("after_aborts_error"):
            bad.append(f"{key}: the request after the aborts failed: {t['after_aborts_error']}")
        a = t.get("after_aborts")
        if a and a.get("evidence") and not a["identical"] and not a.get("errors"):
            bad.append(f"{key}: the request after the aborts differs from stock's")
    return bad


def not_its_own(srv: Server) -> str | None:
    """Why the server answering on this arm's port is another one, or None: ``/server_info``'s model path is
    not the one launched, nor is it in the server's own launch command (SGLang rewrites a path it downloads).
    A server left on the port by an earlier run answered for three arms whose own could not bind (H100
    2026-12-07), and was compared as theirs. One launched with the very same model path is not told apart."""
    argv = list(srv.launch.argv)
    launched = argv[argv.index("--model-path") + 1] if "--model-path" in argv else None
    info = client.server_info(srv.base)
    answered, command = info.get("model_path"), info.get("launch_command")
    if launched is None or not isinstance(answered, str) or os.path.normpath(answered) == os.path.normpath(launched):
        return None
    if isinstance(command, str) and launched in command.split():
        return None
    return f"another server answers on this port (model {answered}, this arm launched {launched})"


def kv_short(srv: Server, need_tokens: int) -> str | None:
    """Why the server's KV pool (``/server_info``, kept as ``kv_tokens``) cannot hold the run's largest
    load, or None (it can, or the server does not say)."""
    kv = srv.info["kv_tokens"] = client.kv_tokens(srv.base)
    if kv is None or kv >= need_tokens:
        return None
    return f"KV pool of {kv} tokens, fewer than the {need_tokens} the run's largest load holds"


def restart_alone(servers: dict, ready: dict, ready_timeout: float, need_tokens: int = 0) -> None:
    """Each server that lost SGLang's KV sizing to a start shared with others, once more on its own:
    it exited during the start (another server's weights loading while SGLang profiled its memory,
    H200 2026-12-05), or it became ready with a KV pool smaller than ``need_tokens`` (``tokens_needed``;
    192 tokens on the H100 of 2026-12-06, whose first 256-token request then waited until the client's
    timeout). Its first log is kept beside (``.first-start.log``) and the restart named in ``e2e.json``
    and ``e2e.md``; a server that fails alone too is reported failed, as before. Only where another
    server of the start became ready."""
    if not any(not isinstance(r, client.ClientError) for r in ready.values()):
        return  # none started: nothing any other server did (a bad model path, a missing package)
    for name, srv in list(servers.items()):
        if isinstance(ready[name], client.ClientError):
            if srv.alive():
                continue  # still starting at the deadline: not a start-time exit
            first = srv.log_tail(5).strip().splitlines()
            why = first[-1] if first else ""
        else:
            why = kv_short(srv, need_tokens)
            if not why:
                continue
        srv.stop()
        os.replace(srv.launch.log, srv.launch.log[:-len(".log")] + ".first-start.log")
        say(f"{srv.launch.config}/{name}: lost the shared start ({why or 'no log'}); starting it again alone")
        again = Server(srv.launch)
        again.info["restarted_alone"] = why
        servers[name] = again
        ready[name] = client.wait_ready_all({name: (again.base, again.t0, again.alive)}, ready_timeout)[name]


def _died(srv: Server, key: str, when: str) -> None:
    """A server that exits (or stops answering) while serving: its later rounds are skipped, it is
    stopped at once (not left up beside the others' rounds) and the run fails."""
    rc = srv.proc.poll()
    what = "stopped answering" if rc is None else f"exited (rc {rc})"
    srv.info.update(died=f"{what} during {when}", log_tail=srv.log_tail())
    say(f"{key}: DIED during {when}; its later rounds are skipped\n{srv.info['log_tail']}")
    srv.stop()


def _identity_outputs(srv: Server, identity_prompts, args) -> list[client.Result]:
    results = []
    for p in identity_prompts:
        try:
            results.append(client.generate(srv.base, p, args.identity_tokens, logprobs=args.top_logprobs))
        except client.ClientError:
            if not args.top_logprobs:
                raise
            results.append(client.generate(srv.base, p, args.identity_tokens))
    return results


def _rank_traces(path: str) -> dict[int, list]:
    """Rank -> parsed trace: ``path`` (rank 0) and each further scheduler's file of a multi-process
    server (``audit.rank_path``), up to the first rank without one."""
    traces, rank = {}, 0
    while True:
        try:
            with open(rank_path(path, rank)) as f:
                traces[rank] = parse_trace(f.read())
        except OSError:
            if rank == 0:
                traces[0] = []
            return traces
        rank += 1


def attach_audit(result: dict, launch_by_cell: dict[tuple, str]) -> dict[tuple, list]:
    """Cut every audited row's window out of its server's trace; returns the windows per cell
    (rank 0's under (config, concurrency, arm), each further rank's under (..., arm, rank)) and
    stores rank 0's per-round figures in the rows."""
    traces: dict[str, dict[int, list]] = {}
    windows: dict[tuple, list] = {}
    for row in result["rows"]:
        path = launch_by_cell.get((row["config"], row["arm"]))
        if not path:
            continue
        if path not in traces:
            traces[path] = _rank_traces(path)
        cell = (row["config"], row["concurrency"], row["arm"])
        for rank, steps in traces[path].items():
            w = stats.window(steps, row["t_start"], row["t_end"])
            windows.setdefault(cell if rank == 0 else (*cell, rank), []).append(w)
            if rank == 0:
                fig = stats.audit_figures(w)
                fig.pop("leads_ms")
                row["audit"] = fig
    return windows


def _header(metas: list[dict]) -> str:
    runs = "\n".join(f"- {m['date']}: `{m['command']}`" + (f" ({m['stopped']}: the rounds that finished)" if m.get("stopped") else "")
                     for m in metas)
    only = sorted({why for m in metas for why in m.get("benchmark_only", [])})
    caveat = ("**Benchmark-only run**: " + "; ".join(only) + ". Its outputs and their identity prove nothing about "
              "the verify path.\n\n") if only else ""
    # .get: runs from before 2026-12-08 have one pass; JSON keys are strings
    counts = {(c, k) for m in metas for c, k in (m.get("passes") or {}).items()}
    split = ", ".join(f"c{c} {k}" for c, k in sorted(counts, key=lambda ck: int(ck[0])) if k > 1)
    one = "; one at the other concurrencies" if any(k == 1 for _, k in counts) else ""
    order = (f"each round in passes ({split}{one}), the arm order reversed pass by pass, a round's figure pooling "
             "its passes" if split else "arm order reversed every other round")
    return (f"# hostsync e2e\n\n{runs}\n\n{caveat}"
            f"Rounds {', '.join(str(m['rounds']) for m in metas)}; {metas[0]['max_new_tokens']} new tokens per request; "
            "the arms of a configuration start together on one GPU (ready times include that contention) and "
            f"are driven one at a time, {order}.\n\n" + _named_arm_slots(metas))


def _named_arm_slots(metas: list[dict]) -> str:
    """The named arms whose slots the run changed (``matrix.same_timers``), so a reader of the
    tables knows which timers stock code's arm ran with."""
    lines = []
    for i, m in enumerate(metas):  # per run: a merged report may join runs from before same_timers
        changed = [f"{name} `{slots}`" for name, slots in (m.get("arm_slots") or {}).items()  # .get: older e2e.json
                   if name in matrix.ARMS and slots != matrix.ARMS[name].slots]
        if changed:
            lines.append((f"run {i + 1}: " if len(metas) > 1 else "") + "; ".join(changed))
    if not lines:
        return ""
    return ("Named arms with the timers another audited arm selects (host work compares under the same timers): "
            + "; ".join(lines) + ".\n\n")


def write_report(out_dir: str, metas: list[dict], cell_rows: list[dict], servers: dict, identity: dict,
                 real_traffic: dict | None = None) -> str:
    """e2e.md, and e2e.png: one group per (configuration, concurrency) in sorted order,
    one bar per non-stock arm (colors in arm order), tok/s/user over stock, line at 1."""
    arm_slots = {a: sl for m in metas for a, sl in (m.get("arm_slots") or {}).items()}
    md = stats.traffic_markdown(real_traffic or {}) + stats.markdown(cell_rows, servers, identity, arm_slots,
                                                                     real_traffic)
    with open(os.path.join(out_dir, "e2e.md"), "w") as f:
        f.write(_header(metas) + md)
    arms = []
    for m in metas:
        arms += [a for a in m["arms"] if a != "stock" and a not in arms]
    groups, keys = [], sorted({(c["config"], c["concurrency"]) for c in cell_rows})
    by = {(c["config"], c["concurrency"], c["arm"]): c for c in cell_rows}
    for key in keys:
        groups.append([(by.get((*key, a)) or {}).get("ratio_tok_s_user") for a in arms])
    if groups:
        bar_chart(os.path.join(out_dir, "e2e.png"), groups)
    return md


def report(result: dict, out_dir: str, windows: dict) -> str:
    cell_rows = stats.cells(result["rows"], windows)
    for c in cell_rows:
        c.pop("tok_s_user_all", None)
    result["cells"] = cell_rows
    return write_report(out_dir, [result["meta"]], cell_rows, result["servers"], result["identity"],
                        result.get("traffic"))  # .get: e2e.json from before the real-traffic pass


def merge(dirs: list[str], out_dir: str) -> dict:
    """One report from several runs (a matrix split over device calls)."""
    merged = {"meta": [], "servers": {}, "identity": {}, "traffic": {}, "cells": []}
    for d in dirs:
        with open(os.path.join(d, "e2e.json")) as f:
            r = json.load(f)
        merged["meta"].append(r["meta"])
        merged["servers"].update(r["servers"])
        merged["identity"].update(r["identity"])
        merged["traffic"].update(r.get("traffic", {}))  # .get: e2e.json from before the real-traffic pass
        merged["cells"] += r.get("cells", [])
    os.makedirs(out_dir, exist_ok=True)
    merged["markdown"] = write_report(out_dir, merged["meta"], merged["cells"], merged["servers"], merged["identity"],
                                      merged["traffic"])
    return merged


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configs, arms, opts = plan(args)
    except ValueError as exc:
        print(f"e2e: {exc}", file=sys.stderr)
        return 2
    out_dir = os.path.abspath(args.out or datetime.datetime.now(datetime.timezone.utc).strftime("hostsync-e2e-%Y%m%d-%H%M%S"))
    if args.merge:
        print(merge(args.merge, out_dir)["markdown"])
        return 0
    models = model_paths(opts, out_dir)
    if args.dry_run:
        print(f"matrix: {len(configs)} configurations x {len(arms)} arms x concurrency {args.concurrency} "
              f"x {args.rounds} rounds; servers of one configuration run at once")
        for ln in launches(configs, arms, opts, out_dir, models, args.port):
            print(f"{ln.config} / {ln.arm}:\n  {ln.shell()}\n  log: {ln.log}")
        return 0
    problem = preflight(matrix.server_needs(configs, opts), opts) or ports_problem(args.port, len(arms))
    if problem:
        print(f"e2e: {problem}", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    models = write_models(opts, out_dir)
    vocab = model_vocab(opts)
    pool = prompts(max(args.identity_prompts, window_requests(args, max(args.concurrency))) * args.rounds + 3,
                   args.prompt_len, vocab, args.random_seed, args.prompt_kind)
    result = {
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "command": " ".join(["python -m sglang_hostsync_plugin.e2e", *(argv if argv is not None else sys.argv[1:])]),
                 "configs": [c.name for c in configs], "arms": [a.name for a in arms],
                 "arm_slots": {a.name: a.slots for a in arms}, "concurrency": args.concurrency,
                 "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "options": vars(args),
                 "passes": passes_by_concurrency(args),
                 "vocab": vocab, "benchmark_only": opts.benchmark_only},
        "servers": {}, "identity": {}, "traffic": {}, "rows": [], "gpu_free_gib_after_warmup": {},
    }
    budget = Budget(args.time_budget)
    # SIGTERM (a timeout) unwinds like Ctrl-C: every server is stopped and what ran is reported.
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        for config in configs:
            if budget.spent():
                result["meta"]["stopped"] = "time budget spent"
                say(f"time budget spent: {config.name} not run")
                continue
            run_config(config, arms, opts, args, out_dir, models, args.port, pool, result, budget)
            save(result, out_dir)
    except KeyboardInterrupt as exc:
        interrupted = True
        result["meta"]["stopped"] = f"interrupted ({exc or 'Ctrl-C'})"  # the one record of a cut run
        say(f"{result['meta']['stopped']}: reporting the rounds that finished")
    traces = {(ln.config, ln.arm): ln.trace for ln in launches(configs, arms, opts, out_dir, models, args.port) if ln.trace}
    windows = attach_audit(result, traces)
    md = report(result, out_dir, windows)
    save(result, out_dir)
    print(md)
    if interrupted:
        return 130
    failed = [k for k, s in result["servers"].items() if s.get("ready_s") is None or s.get("died")]
    different = [k for k, v in result["identity"].items() if not v["identical"] and v.get("evidence", True)]
    real = traffic_failures(result)
    if failed or different or real:
        say(f"servers that failed: {failed or 'none'}; outputs different from stock: {different or 'none'}; "
            f"real-traffic failures: {real or 'none'}")
        return 1
    return 0
