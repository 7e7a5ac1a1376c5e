"""What the end-to-end benchmark runs: server configurations, arms and their launch
commands. Pure data and string building; nothing here starts a process."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field, replace

from ..config import ENV_ENABLE, ENV_SLOTS
from ..slots.audit import ENV_EVERY, ENV_TRACE
from ..slots.audit_block import NAME as AUDIT_BLOCK
from ..slots.audit_fine import NAME as AUDIT_FINE
from ..slots.audit_ngram import NAME as AUDIT_NGRAM

# Dummy-weight models written by the benchmark (no download): a Llama-3-8B-shaped (or,
# with --dummy-shape llama-1b, Llama-3.2-1B-shaped) target, a 2-layer draft of the same
# width (STANDALONE speculative decoding), a 1-layer EAGLE3 head shaped like the public
# Llama-3.1-8B ones (32000-token draft vocabulary; dummy weights load no d2t token map), and
# 1-layer DFlash / DSpark block drafts of the target's width reading three target layers.
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}
# On the H200 at concurrency 1 its GPU step is shorter than the scheduler's host work per step
# (run-ahead 0 in every arm, 2026-12-02): the host, not the GPU, sets the pace.
LLAMA_1B = {**LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "head_dim": 64, "tie_word_embeddings": True}
DUMMY_SHAPES = {"llama-8b": LLAMA_8B, "llama-1b": LLAMA_1B}


EAGLE3_DRAFT_VOCAB = 32000
# The block drafts' mask token: any id of the target's vocabulary (the prompts are random ids).
BLOCK_DRAFT_MASK_TOKEN = 128002
DFLASH_BLOCK = 16  # SGLang's DFlash default
DSPARK_BLOCK = 5  # gamma of sglang#45450's DSpark runs


def _block_draft(target: dict, architecture: str, block_size: int) -> dict:
    """A 1-layer DFlash-family draft of the target's width (SGLang borrows the target's embedding and
    LM head) that projects the hidden states of three target layers: DFlash's fields in its
    ``dflash_config``, DSpark's flat with a vanilla Markov head, as in the public checkpoints."""
    layers = target["num_hidden_layers"]
    fields = {"block_size": block_size, "target_layer_ids": [1, layers // 2, layers - 2],
              "mask_token_id": BLOCK_DRAFT_MASK_TOKEN}
    draft = {**target, "architectures": [architecture], "num_hidden_layers": 1, "num_target_layers": layers}
    if architecture == "DSparkDraftModel":
        return {**draft, **fields, "markov_rank": 256, "markov_head_type": "vanilla",
                "enable_confidence_head": True, "confidence_head_with_markov": True}
    return {**draft, "block_size": block_size, "dflash_config": fields}


def dummy_models(shape: str = "llama-8b") -> dict[str, dict]:
    target = DUMMY_SHAPES[shape]
    eagle3 = {**target, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
              "draft_vocab_size": EAGLE3_DRAFT_VOCAB, "tie_word_embeddings": False}
    return {"target": target, "draft": {**target, "num_hidden_layers": 2}, "draft-eagle3": eagle3,
            "draft-dflash": _block_draft(target, "DFlashDraftModel", DFLASH_BLOCK),
            "draft-dspark": _block_draft(target, "DSparkDraftModel", DSPARK_BLOCK)}


@dataclass(frozen=True)
class Config:
    """One server configuration of the matrix."""

    name: str
    algorithm: str  # SGLang's --speculative-algorithm
    topk: int = 1
    page_size: int = 1
    num_steps: int = 3
    draft_tokens: int = 4
    uses_draft_model: bool = True
    draft: str = "draft"  # which dummy draft model it runs (a key of ``dummy_models``)
    # DFlash family: the draft block (SGLang derives the verify width: DFlash the block, DSpark block + 1).
    block_size: int | None = None
    # EAGLE family: give no steps, topk or draft tokens; SGLang chooses them (for a Llama target 5, 4, 8).
    auto_params: bool = False

    @property
    def block_draft(self) -> bool:
        """The DFlash family (DFLASH, DSPARK)."""
        return self.block_size is not None

    @property
    def audit_phases_slot(self) -> str | None:
        """The tool slot with the audit's phases of this algorithm's step (the audit's own are EAGLE v2's)."""
        if self.block_draft:
            return AUDIT_BLOCK
        return AUDIT_NGRAM if self.algorithm == "NGRAM" else None

    def server_args(self, draft_path: str | None) -> list[str]:
        args = ["--speculative-algorithm", self.algorithm, "--page-size", str(self.page_size)]
        if self.block_size is not None:  # one draft step of one branch: no steps or topk to give
            args += [f"--speculative-{self.algorithm.lower()}-block-size", str(self.block_size)]
        elif not self.auto_params:
            args += ["--speculative-num-draft-tokens", str(self.draft_tokens)]
        if self.uses_draft_model:
            if self.block_size is None and not self.auto_params:
                args += ["--speculative-num-steps", str(self.num_steps), "--speculative-eagle-topk", str(self.topk)]
            if draft_path:
                args += ["--speculative-draft-model-path", draft_path]
        else:  # NGRAM: one branch per step, so the tree is a chain like topk 1
            args += ["--speculative-ngram-max-bfs-breadth", str(self.topk)]
        return args


CONFIGS = {c.name: c for c in (
    Config("standalone-t1-p1", "STANDALONE", topk=1, page_size=1, draft_tokens=4),
    Config("standalone-t1-p16", "STANDALONE", topk=1, page_size=16, draft_tokens=4),
    Config("standalone-t4-p1", "STANDALONE", topk=4, page_size=1, draft_tokens=8),
    Config("standalone-t4-p16", "STANDALONE", topk=4, page_size=16, draft_tokens=8),
    Config("eagle3-t1-p16", "EAGLE3", topk=1, page_size=16, draft_tokens=4, draft="draft-eagle3"),
    Config("eagle3-t4-p16", "EAGLE3", topk=4, page_size=16, draft_tokens=8, draft="draft-eagle3"),
    # What a user who leaves the tree to SGLang runs (it picks 5 steps, topk 4, 8 draft tokens for a Llama
    # target); before 2026-12-05 the plugin's launcher read the missing topk as 1. Run on the H200 2026-12-05.
    Config("eagle3-auto-p16", "EAGLE3", topk=4, page_size=16, num_steps=5, draft_tokens=8, draft="draft-eagle3",
           auto_params=True),
    Config("ngram-p1", "NGRAM", topk=1, page_size=1, draft_tokens=8, uses_draft_model=False),
    # First real servers 2026-12-05 (benchmarks/results/2026-12-05-h200-b/). DFlash needs FlashInfer installed
    # (SGLang's DFlash worker prewarms top_p_renorm_prob at start); its prefill graphs take the start past 170 s.
    Config("dflash-p16", "DFLASH", page_size=16, draft_tokens=DFLASH_BLOCK, draft="draft-dflash", block_size=DFLASH_BLOCK),
    Config("dspark-p16", "DSPARK", page_size=16, draft_tokens=DSPARK_BLOCK + 1, draft="draft-dspark",
           block_size=DSPARK_BLOCK),
)}


@dataclass(frozen=True)
class Arm:
    """A server variant: ``slots`` None is stock SGLang (the plugin installed but off)."""

    name: str
    slots: str | None = None

    def env(self) -> dict[str, str]:
        if self.slots is None:
            return {}
        return {ENV_ENABLE: "1", ENV_SLOTS: self.slots}

    @property
    def tokens(self) -> list[str]:
        return [t.strip() for t in (self.slots or "").split(",") if t.strip()]

    @property
    def audited(self) -> bool:
        return "audit" in self.tokens


STOCK = Arm("stock")
STOCK_CODE = Arm("audit", "audit")  # stock SGLang's code measured by the audit: the host-work reference
ARMS = {a.name: a for a in (STOCK, STOCK_CODE, Arm("plugin", "default,audit"),
                             Arm("plugin-noaudit", "default"))}
DEFAULT_ARMS = ("stock", "audit", "plugin")


def extra_arm(spec: str) -> Arm:
    """``--slots SPEC`` as an arm, measured by the audit like the plugin arm; ``-audit`` in
    SPEC leaves the audit out (a speed-only arm, like plugin-noaudit)."""
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if "-audit" in tokens:
        return Arm(f"slots:{spec}", ",".join(t for t in tokens if t != "-audit"))
    if "audit" not in tokens:
        tokens.append("audit")
    return Arm(f"slots:{spec}", ",".join(tokens))


@dataclass(frozen=True)
class Launch:
    """Everything that starts one server: argv and the environment it adds."""

    config: str
    arm: str
    port: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    log: str = ""
    trace: str = ""

    def shell(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + " ".join(self.argv)


@dataclass(frozen=True)
class Options:
    """The benchmark's knobs that change a launch command."""

    model_path: str | None = None  # None: the benchmark's own models (``weights``)
    # "checkpoint": random-weight safetensors the benchmark writes (``checkpoints``), real acceptance;
    # "dummy": SGLang's --load-format dummy (embed == lm_head, outputs collapse): speed runs only.
    weights: str = "checkpoint"
    checkpoint_shape: str = "small"
    dummy_shape: str = "llama-8b"
    draft_model_path: str | None = None
    attention_backend: str = "triton"
    # Arms start together and SGLang takes the fraction of the memory free at its own
    # start, so it sizes nothing: the KV pool is fixed by max_total_tokens instead.
    mem_fraction_static: float = 0.85
    # Small enough that the real-traffic pass's 16 clients with 600-token prefixes make SGLang retract.
    max_total_tokens: int = 8192
    random_seed: int = 1
    # SGLANG_SIMULATE_ACC_LEN; 0 = real acceptance. Simulated acceptance replaces the target's verify
    # decision: speed runs only, never evidence of correctness.
    simulate_acc_len: float = 0.0
    radix_cache: bool = True
    # The arms' servers share the machine, and SGLang's idle scheduler polls without sleeping: each idle arm
    # would spin a CPU (a timed scheduler's hyperthread sibling, maybe) through another arm's window.
    sleep_on_idle: bool = True
    cuda_graph_max_bs: int = 8
    extra_server_args: tuple[str, ...] = ()
    # (KEY, VALUE) added to every plugin arm's environment (e.g. a slot's check setting).
    plugin_env: tuple[tuple[str, str], ...] = ()
    python: str = sys.executable
    server_module: str = "sglang.launch_server"

    @property
    def dummy(self) -> bool:
        return self.model_path is None and self.weights == "dummy"

    @property
    def benchmark_only(self) -> list[str]:
        """Why outputs and their identity prove nothing about the verify path ([] when they do)."""
        why = []
        if self.dummy:
            why.append("dummy weights (--load-format dummy: embed == lm_head, outputs collapse to a few tokens)")
        if self.simulate_acc_len > 0:
            why.append(f"simulated acceptance (SGLANG_SIMULATE_ACC_LEN={self.simulate_acc_len:g} replaces the "
                       "target's accept decision)")
        return why


def write_models(root: str, shape: str = "llama-8b") -> dict[str, str]:
    """The embedded model configs of ``shape`` as model directories under ``root``."""
    paths = {}
    for name, cfg in dummy_models(shape).items():
        path = os.path.join(root, f"dummy-{name}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        paths[name] = path
    return paths


def launch(config: Config, arm: Arm, port: int, opts: Options, models: dict[str, str], out_dir: str) -> Launch:
    target = opts.model_path or models["target"]
    draft = (opts.draft_model_path or models.get(config.draft)) if config.uses_draft_model else None
    argv = [opts.python, "-m", opts.server_module, "--model-path", target,
            "--host", "127.0.0.1", "--port", str(port),
            "--attention-backend", opts.attention_backend,
            "--mem-fraction-static", str(opts.mem_fraction_static),
            "--max-total-tokens", str(opts.max_total_tokens),
            "--cuda-graph-max-bs-decode", str(opts.cuda_graph_max_bs),
            "--random-seed", str(opts.random_seed),
            "--skip-tokenizer-init",
            "--sampling-backend", "pytorch", "--grammar-backend", "none",
            *config.server_args(draft)]
    if opts.dummy:
        argv += ["--load-format", "dummy"]
    if not opts.radix_cache:
        argv.append("--disable-radix-cache")
    if opts.sleep_on_idle:
        argv.append("--sleep-on-idle")
    if arm.slots is not None:
        argv.append("--enable-hostsync-plugin")
    argv += list(opts.extra_server_args)
    stem = file_stem(config.name, arm.name)
    trace = os.path.join(out_dir, f"{stem}.trace.tsv") if arm.audited else ""
    env = arm.env()
    if arm.audited and config.audit_phases_slot:
        # In every audited arm alike (stock code's too), so their phase tables compare; a
        # "-audit_block" (or "-audit_ngram") in the arm's list still removes it.
        env[ENV_SLOTS] += f",{config.audit_phases_slot}"
    if arm.slots is not None:
        env.update(dict(opts.plugin_env))
    if trace:
        # The summary's periodic log line is not needed: the benchmark reads the trace.
        env.update({ENV_TRACE: trace, ENV_EVERY: "100000000"})
    if opts.simulate_acc_len > 0:
        env["SGLANG_SIMULATE_ACC_LEN"] = f"{opts.simulate_acc_len:g}"
    return Launch(config.name, arm.name, port, tuple(argv), env, os.path.join(out_dir, f"{stem}.log"), trace)


# Packages SGLang requires that a partial install (--no-deps, a slim bundle) can lack, and that a
# configuration imports only once its server is minutes into its start: module -> its pip name.
SERVER_PACKAGES = {"flashinfer": "flashinfer_python"}


def server_needs(configs, opts: Options) -> dict[str, list[str]]:
    """Module -> what needs it (configurations, options), for one run."""
    needs: dict[str, list[str]] = {}
    if opts.attention_backend == "flashinfer":
        needs.setdefault("flashinfer", []).append("--attention-backend flashinfer")
    for c in configs:
        if c.algorithm == "DFLASH":  # its worker rehearses the sampling verify at start: flashinfer.sampling
            needs.setdefault("flashinfer", []).append(c.name)
    return needs


STEM_MAX = 120  # a file name is at most 255 bytes; suffixes run to 19 (".trace.rank1.tsv.xz", ".first-start.log.xz")


def _safe(name: str) -> str:
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in name)


def file_stem(config_name: str, arm_name: str) -> str:
    """The name of an arm's log and trace files: readable, and cut with a hash of the whole past
    STEM_MAX (a long slot list once made the server's log name too long to open, H100 2026-12-07)."""
    stem = f"{config_name}__{_safe(arm_name)}"
    if len(stem) <= STEM_MAX:
        return stem
    return f"{stem[:STEM_MAX - 13]}--{hashlib.sha1(stem.encode()).hexdigest()[:11]}"


def parse_plugin_env(items: list[str]) -> tuple[tuple[str, str], ...]:
    """``--plugin-env KEY=VALUE`` items; the benchmark strips SGLANG_HOSTSYNC_* from the
    environment it inherits, so this is how a plugin arm gets a slot setting."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not key.strip().replace("_", "").isalnum():
            raise ValueError(f"--plugin-env {item!r}: use KEY=VALUE")
        out.append((key.strip(), value))
    return tuple(out)


def parse_configs(spec: str) -> list[Config]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise ValueError(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    return [CONFIGS[n] for n in names]


def parse_arms(spec: str, extra_slots: list[str]) -> list[Arm]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)} (or add --slots LIST)")
    arms = [ARMS[n] for n in names] + [extra_arm(s) for s in extra_slots]
    if STOCK not in arms:
        raise ValueError("the stock arm is the reference for ratios and output identity; keep it")
    return same_timers(arms)


def same_timers(arms: list[Arm]) -> list[Arm]:
    """Where one audited arm selects ``audit_fine``, every audited arm (stock code's too) gets it:
    each timer costs host time, so host work compares only under the same timers. A
    ``-audit_fine`` in an arm's list still removes it."""
    if not any(AUDIT_FINE in a.tokens for a in arms if a.audited):
        return arms
    return [replace(a, slots=f"{a.slots},{AUDIT_FINE}")
            if a.audited and AUDIT_FINE not in a.tokens and f"-{AUDIT_FINE}" not in a.tokens else a
            for a in arms]
