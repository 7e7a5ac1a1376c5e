"""Random-weight checkpoints for the end-to-end benchmark: real safetensors, so servers run real
acceptance on outputs that vary (no ``--load-format dummy``, no simulated acceptance).

    from sglang_hostsync_plugin.e2e import checkpoints
    models = checkpoints.write_checkpoints("/tmp/e2e-models", shape="small", seed=0)
    # {"target": ".../small-seed0-target", "draft": ..., "draft-eagle3": ...,
    #  "draft-dflash": ..., "draft-dspark": ...}: keyed like matrix.dummy_models()

Each model is a directory with ``config.json`` and one ``model.safetensors`` (bf16), written by
the benchmark itself (no network, no tokenizer: servers run ``--skip-tokenizer-init`` with
``input_ids``). Tensor names are the ones SGLang 0.5.23's own ``load_weights`` maps:

- ``target``: a ``LlamaForCausalLM``. Matrices normal(0, 0.02), norms ones. The residual-writing
  projections (``o_proj``, ``down_proj``) of layers 2 and up are scaled by 1/4, so the first two
  layers dominate the residual stream and a draft made of them agrees with the target part of
  the time (greedy acceptance that is neither 0 nor 1).
- ``draft`` (STANDALONE): a 2-layer ``LlamaForCausalLM`` whose tensors ARE the target's
  embedding, layers 0-1, final norm and LM head (byte-equal).
- ``draft-eagle3``: a ``LlamaForCausalLMEagle3`` head of 2 layers (the public ones have 1; SGLang
  builds any number), draft vocabulary = the target's (no d2t/t2d map: SGLang then uses target
  ids as they are) and no ``embed_tokens`` (SGLang shares the target's through ``set_embed``).
  Its layers are the target's layers 0-1 reading only the token embedding: the hidden-state half
  of layer 0's q/k/v and the ``fc`` over three target layers are zero, so its first draft token
  is the STANDALONE draft's prediction but for the embedding in the residual (later steps also
  add the previous step's hidden state: the residual SGLang's EAGLE3 layer 0 carries). A 1-layer
  head built this way (the target cut after layer 0) rarely agrees with the target: hence 2.
  Norms ones, LM head the target's.
- ``draft-dflash`` / ``draft-dspark``: the 1-layer block drafts of ``matrix._block_draft`` for
  this shape (mask token inside the vocabulary: SGLang rejects one >= vocab_size), random
  weights (q/k norms, ``fc`` over three target layers, ``hidden_norm``; DSpark adds the vanilla
  Markov head and the confidence head, the latter float32 as SGLang builds it). They borrow the
  target's embedding and LM head, so their acceptance is that of a random draft (about none).
- ``small-bigram`` (for the block drafts' acceptance): ``small`` with a target whose layers write
  nothing into the residual (``o_proj`` and ``down_proj`` zero), so its next token is a function of the
  current token alone, and block drafts built to compute that function from block position 0 (the
  bonus token) at every mask position: q/k zero (uniform attention), ``fc`` and the mask token's
  embedding zero (nothing else in the attention's values), values and output projections identities
  (as many KV heads as heads), ``down_proj`` and DSpark's Markov and confidence heads zero. The first
  draft token then matches the target's; the others match where the map repeats a token (expected
  accept length about 2). That function is a permutation of the ordinary tokens into cycles of 16
  (``_cycle_head``), so the outputs repeat every 16 tokens: NGRAM's copying workload (a drafter that
  copies earlier output accepts). No evidence about context handling: the target ignores it. Its
  STANDALONE draft computes the target's function exactly and its EAGLE3 head drafts token 0: read
  neither configuration's acceptance from this shape.
- ``llama-8b-bigram``: the same construction on Llama-3-8B's layer shapes (32 layers, hidden 4096,
  vocabulary 32000): the same outputs' structure with an 8B-sized GPU step, longer than a scheduler's
  host work per step (where ``small``'s is shorter), so whether the host runs ahead can show.

Determinism: every tensor draws from its own ``torch.Generator`` seeded from (seed, model,
tensor name), in fixed row chunks, so one seed gives byte-identical files (for one torch
version and CPU kind). ``device="cuda"`` draws from CUDA's generator instead: as deterministic
for a seed, but other numbers; its directories get a ``-cuda`` suffix so the two never mix.
CPU is the default: ``small`` writes in well under a minute on two cores, the time going to
drawing the numbers and writing the 2 GB.

A directory whose ``.complete`` marker (written last) records the same config, seed, device
and ``FORMAT`` is kept as it is, so a second call is instant; anything else is rewritten.

Sizes (bf16 safetensors): ``small`` target 1.02 GB, draft 0.45 GB, eagle3 0.36 GB, dflash 0.12 GB,
dspark 0.15 GB (2.1 GB in all); ``llama-1b`` (tied embeddings) target 2.08 GB, draft 0.37 GB,
eagle3 0.41 GB, dflash 0.15 GB, dspark 0.18 GB (3.2 GB); ``llama-8b-bigram`` target 15.0 GB (about 20 GB in all:
a minute or more to write, and as much GPU memory per server as an 8B model).

torch and safetensors are imported inside the functions: the package imports without them.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib

from .matrix import DFLASH_BLOCK, DSPARK_BLOCK, LLAMA_1B, LLAMA_8B, _block_draft

# Bump when what a seed writes changes (names, init, scaling), so old directories are rewritten.
FORMAT = 1
STD = 0.02
# The target layers a STANDALONE draft copies; later layers write into the residual at 1/4.
DRAFT_LAYERS = 2
LATER_LAYER_SCALE = 0.25
# Rows drawn per generator call (about 16 M elements at hidden 2048: a 64 MiB float32 buffer).
CHUNK_ELEMENTS = 1 << 24

_VOCAB = {"vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2}
SMALL = {**LLAMA_8B, **_VOCAB, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False}
CHECKPOINT_SHAPES = {"small": SMALL, "llama-1b": {**LLAMA_1B, **_VOCAB}, "small-bigram": SMALL,
                     "llama-8b-bigram": {**LLAMA_8B, **_VOCAB}}
# Shapes whose block drafts accept (see the module doc): the target's layers write nothing into the residual.
BIGRAM_SHAPES = {"small-bigram", "llama-8b-bigram"}
CYCLE = 16  # the bigram target's outputs repeat with this period (an n-gram drafter can copy them)


def _mask_token(target: dict) -> int:
    return target["vocab_size"] - 1  # inside the vocabulary (SGLang rejects one >= vocab_size); prompts never use it


def checkpoint_models(shape: str = "small") -> dict[str, dict]:
    """The configs ``write_checkpoints`` writes for ``shape``, keyed like ``matrix.dummy_models``."""
    target = CHECKPOINT_SHAPES[shape]
    mask = {"mask_token_id": _mask_token(target)}
    eagle3 = {**target, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": DRAFT_LAYERS,
              "draft_vocab_size": target["vocab_size"], "tie_word_embeddings": False}
    # A bigram shape's block-draft attention carries the whole hidden state: as many KV heads as heads.
    heads = {"num_key_value_heads": target["num_attention_heads"]} if shape in BIGRAM_SHAPES else {}
    dflash = {**_block_draft(target, "DFlashDraftModel", DFLASH_BLOCK), **heads}
    dflash = {**dflash, "dflash_config": {**dflash["dflash_config"], **mask}}
    dspark = {**_block_draft(target, "DSparkDraftModel", DSPARK_BLOCK), **mask, **heads}
    return {"target": target, "draft": {**target, "num_hidden_layers": DRAFT_LAYERS}, "draft-eagle3": eagle3,
            "draft-dflash": dflash, "draft-dspark": dspark}


def checkpoint_paths(root: str, shape: str = "small", seed: int = 0, device: str = "cpu") -> dict[str, str]:
    """Where ``write_checkpoints`` writes (or finds) each model of ``shape``; writes nothing.

    Raises:
        KeyError: an unknown shape.
    """
    suffix = "" if device == "cpu" else f"-{device.split(':')[0]}"
    return {name: os.path.join(root, f"{shape}-seed{seed}{suffix}-{name}") for name in checkpoint_models(shape)}


def write_checkpoints(root: str, shape: str = "small", seed: int = 0, device: str = "cpu") -> dict[str, str]:
    """Write (or keep) the five model directories of ``shape`` under ``root``.

    Args:
        root: the parent folder (created if missing).
        shape: a key of ``CHECKPOINT_SHAPES``.
        seed: the weights' seed; the same seed writes byte-identical files.
        device: where the random numbers are drawn ("cpu", or "cuda" for CUDA's generator:
            other numbers, other directories).

    Returns:
        Model key -> directory, keyed like ``matrix.dummy_models()``.

    Raises:
        KeyError: an unknown shape.
    """
    configs = checkpoint_models(shape)
    paths = checkpoint_paths(root, shape, seed, device)
    todo = [name for name in configs if not _complete(paths[name], configs[name], seed, device)]
    if not todo:
        return paths
    rng = _Draws(seed, device)
    bigram = shape in BIGRAM_SHAPES
    # The STANDALONE and EAGLE3 drafts are made of the target's tensors: drawn again (same numbers)
    # when only a draft is missing.
    target = (_target_tensors(configs["target"], rng, bigram)
              if {"target", "draft", "draft-eagle3"} & set(todo) else {})
    for name in todo:
        if name == "target":
            tensors = target
        elif name == "draft":
            tensors = _draft_tensors(configs[name], target)
        elif name == "draft-eagle3":
            tensors = _eagle3_tensors(configs[name], target)
        else:
            tensors = (_bigram_block_tensors if bigram else _block_tensors)(configs[name], rng.model(name))
        _write(paths[name], configs[name], tensors, seed, device)
    return paths


# --- the tensors of each model -------------------------------------------------------------------


class _Draws:
    """normal(0, STD) tensors in bf16 on the CPU, each from a generator seeded by (seed, model, name)."""

    def __init__(self, seed: int, device: str, model_name: str = "target"):
        self.seed, self.device, self.model_name = seed, device, model_name

    def model(self, model_name: str) -> "_Draws":
        return _Draws(self.seed, self.device, model_name)

    def normal(self, name: str, shape: tuple[int, ...], scale: float = 1.0):
        import torch

        key = zlib.crc32(f"{self.seed}/{self.model_name}/{name}".encode())
        gen = torch.Generator(device=self.device).manual_seed(key)
        out = torch.empty(shape, dtype=torch.bfloat16)
        rows = out.view(shape[0], -1)
        step = max(1, CHUNK_ELEMENTS // rows.shape[1])
        buf = torch.empty((min(step, rows.shape[0]), rows.shape[1]), dtype=torch.float32, device=self.device)
        for start in range(0, rows.shape[0], step):
            chunk = buf[: min(step, rows.shape[0] - start)]
            chunk.normal_(0.0, STD, generator=gen)
            if scale != 1.0:
                chunk.mul_(scale)
            rows[start:start + chunk.shape[0]].copy_(chunk)
        return out


def _ones(n: int):
    import torch

    return torch.ones(n, dtype=torch.bfloat16)


def _attn_mlp_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    h, hd, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    return {"self_attn.q_proj": (cfg["num_attention_heads"] * hd, h),
            "self_attn.k_proj": (cfg["num_key_value_heads"] * hd, h),
            "self_attn.v_proj": (cfg["num_key_value_heads"] * hd, h),
            "self_attn.o_proj": (h, cfg["num_attention_heads"] * hd),
            "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}


def _layer(cfg: dict, rng: _Draws, prefix: str, scale_residual: float = 1.0) -> dict:
    h = cfg["hidden_size"]
    out = {f"{prefix}.input_layernorm.weight": _ones(h), f"{prefix}.post_attention_layernorm.weight": _ones(h)}
    for part, shape in _attn_mlp_shapes(cfg).items():
        scale = scale_residual if part in ("self_attn.o_proj", "mlp.down_proj") else 1.0
        out[f"{prefix}.{part}.weight"] = rng.normal(f"{prefix}.{part}.weight", shape, scale)
    return out


def _target_tensors(cfg: dict, rng: _Draws, bigram: bool = False) -> dict:
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": rng.normal("model.embed_tokens.weight", (vocab, h))}
    if bigram:
        out["model.embed_tokens.weight"][_mask_token(cfg)] = 0  # the block drafts' mask embeds to nothing
    for i in range(cfg["num_hidden_layers"]):
        scale = 0.0 if bigram else 1.0 if i < DRAFT_LAYERS else LATER_LAYER_SCALE
        out.update(_layer(cfg, rng, f"model.layers.{i}", scale))
    out["model.norm.weight"] = _ones(h)
    if bigram:
        out["lm_head.weight"] = _cycle_head(out["model.embed_tokens.weight"], _mask_token(cfg), rng)
    elif not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = rng.normal("lm_head.weight", (vocab, h))
    return out


def _cycle_head(embed, mask: int, rng: _Draws):
    """An LM head whose row ``next(x)`` is ``x``'s embedding, ``next`` a permutation of the ordinary
    tokens (ids 3 and up, the mask left out) into cycles of ``CYCLE``: over its own embedding a token
    scores about ``hidden * 0.02``, over another about ``N(0, 0.02 * sqrt(hidden))``, so the greedy
    next token of the bigram target is ``next(x)`` and its outputs repeat every ``CYCLE`` tokens."""
    import torch

    head = embed.clone()  # ids 0-2 (bos, eos) and the mask map to themselves: no cycle reaches eos
    ids = torch.tensor([i for i in range(3, embed.shape[0]) if i != mask])
    order = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(zlib.crc32(
        f"{rng.seed}/cycles".encode())))]
    usable = len(order) - len(order) % CYCLE
    cycles = order[:usable].view(-1, CYCLE)
    head[cycles.roll(-1, dims=1).reshape(-1)] = embed[cycles.reshape(-1)]  # head[next(x)] = embed[x]
    head[order[usable:]] = embed[order[usable:]]  # the few left over map to themselves
    return head


def _draft_tensors(cfg: dict, target: dict) -> dict:
    keep = ("model.embed_tokens.", "model.norm.", "lm_head.") + tuple(
        f"model.layers.{i}." for i in range(cfg["num_hidden_layers"]))
    return {name: t for name, t in target.items() if name.startswith(keep)}


def _target_head(target: dict):
    return target.get("lm_head.weight", target["model.embed_tokens.weight"])


def _eagle3_tensors(cfg: dict, target: dict) -> dict:
    """The target's first layers on the token embedding: layer 0's q/k/v read [embedding, hidden]
    (the hidden half zero) and ``fc`` is zero, so the target's hidden states add nothing to the
    first draft step; each layer's ``hidden_norm`` (layer 1's input norm in SGLang) is ones."""
    import torch

    h = cfg["hidden_size"]
    out = {"model.fc.weight": torch.zeros((h, 3 * h), dtype=torch.bfloat16), "model.norm.weight": _ones(h),
           "lm_head.weight": _target_head(target)}
    layers = tuple(f"model.layers.{i}." for i in range(cfg["num_hidden_layers"]))
    for name, t in target.items():
        if not name.startswith(layers):
            continue
        if name.startswith("model.layers.0.") and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            t = torch.cat([t, torch.zeros_like(t)], dim=1)
        out[name] = t
    for prefix in layers:
        out[f"{prefix}hidden_norm.weight"] = _ones(h)
    return out


def _block_tensors(cfg: dict, rng: _Draws) -> dict:
    """DFlash's layers (with q/k norms), ``fc`` over the target layers, ``hidden_norm``, ``norm``;
    DSpark's Markov and confidence heads. Names without "model.", as SGLang's loaders resolve them."""
    import torch

    h, hd = cfg["hidden_size"], cfg["head_dim"]
    layers = len((cfg.get("dflash_config") or cfg)["target_layer_ids"])
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        out.update(_layer(cfg, rng, f"layers.{i}"))
        out[f"layers.{i}.self_attn.q_norm.weight"] = _ones(hd)
        out[f"layers.{i}.self_attn.k_norm.weight"] = _ones(hd)
    out.update({"norm.weight": _ones(h), "hidden_norm.weight": _ones(h),
                "fc.weight": rng.normal("fc.weight", (h, layers * h))})
    if cfg["architectures"] == ["DSparkDraftModel"]:
        vocab, rank = cfg["vocab_size"], cfg["markov_rank"]
        out["markov_head.markov_w1.weight"] = rng.normal("markov_head.markov_w1.weight", (vocab, rank))
        out["markov_head.markov_w2.weight"] = rng.normal("markov_head.markov_w2.weight", (vocab, rank))
        width = h + (rank if cfg["confidence_head_with_markov"] else 0)
        out["confidence_head.proj.weight"] = rng.normal("confidence_head.proj.weight", (1, width)).float()
        out["confidence_head.proj.bias"] = torch.zeros(1, dtype=torch.float32)
    return out


def _bigram_block_tensors(cfg: dict, rng: _Draws) -> dict:
    """A block draft that predicts the bigram target's next token from block position 0 (the bonus
    token) at every block position (DSpark also drafts from the anchor row): q/k zero (uniform attention),
    ``fc`` zero (context values zero, the mask embedding zero), values identity and output 256 x identity
    (the attention carries the bonus token's normalized embedding), ``down_proj`` and DSpark's Markov and
    confidence heads zero (SGLang loads the latter only outside static verify)."""
    import torch

    out = _block_tensors(cfg, rng)
    h = cfg["hidden_size"]
    eye = torch.eye(h, dtype=torch.bfloat16)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            out[f"{p}{name}.weight"] = torch.zeros_like(out[f"{p}{name}.weight"])
        # The attention output is the bonus token's normalized embedding over N keys; 256 (exact in bf16)
        # keeps it above the final norm's eps to N = 8192, which sampled DSpark rows need (they read the scale).
        out[f"{p}self_attn.v_proj.weight"], out[f"{p}self_attn.o_proj.weight"] = eye, eye * 256
    for name in ("fc.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                 "confidence_head.proj.weight"):
        if name in out:
            out[name] = torch.zeros_like(out[name])
    return out


# --- directories -----------------------------------------------------------------------------------

MARKER = ".complete"


def _stamp(config: dict, seed: int, device: str) -> dict:
    return {"format": FORMAT, "seed": seed, "device": device.split(":")[0], "config": config}


def _complete(path: str, config: dict, seed: int, device: str) -> bool:
    try:
        with open(os.path.join(path, MARKER)) as f:
            return json.load(f) == json.loads(json.dumps(_stamp(config, seed, device)))
    except (OSError, ValueError):
        return False


def _write(path: str, config: dict, tensors: dict, seed: int, device: str) -> None:
    from safetensors.torch import save_file

    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file({k: t.contiguous() for k, t in tensors.items()}, tmp, metadata={"format": "pt"})
    os.chmod(tmp, 0o644)  # safetensors creates it 0600
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump(_stamp(config, seed, device), f, indent=1)
