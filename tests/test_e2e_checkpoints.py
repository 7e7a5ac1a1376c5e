"""The e2e benchmark's random-weight checkpoints (``e2e/checkpoints.py``), on a tiny shape: the
files are deterministic, the drafts are made of the target's tensors as documented, and SGLang's
own model classes load every tensor into every parameter."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_hostsync_plugin.e2e import checkpoints

# ``small``'s layer layout (8 layers: the captured target layers distinct), tiny widths.
TINY = {**checkpoints.SMALL, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024}
KEYS = ("target", "draft", "draft-eagle3", "draft-dflash", "draft-dspark")


def write_tiny(root, seed: int = 0) -> dict[str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(checkpoints.CHECKPOINT_SHAPES, "tiny", TINY)
        paths = checkpoints.write_checkpoints(str(root), shape="tiny", seed=seed)
        assert checkpoints.checkpoint_paths(str(root), "tiny", seed) == paths
        return paths


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    return write_tiny(tmp_path_factory.mktemp("ckpt"))


def tensors(path: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(path, "model.safetensors"))


def read(path: str, name: str) -> bytes:
    with open(os.path.join(path, name), "rb") as f:
        return f.read()


def test_the_same_seed_writes_the_same_bytes(tiny, tmp_path):
    again = write_tiny(tmp_path / "again")
    other = write_tiny(tmp_path / "other", seed=1)
    assert tuple(tiny) == tuple(again) == KEYS
    for key in KEYS:
        for name in ("model.safetensors", "config.json"):
            assert read(tiny[key], name) == read(again[key], name), (key, name)
        assert read(tiny[key], "model.safetensors") != read(other[key], "model.safetensors"), key


def test_a_complete_directory_is_kept_and_a_stale_one_rewritten(tmp_path):
    paths = write_tiny(tmp_path)
    stamp = {k: os.stat(os.path.join(p, "model.safetensors")).st_mtime_ns for k, p in paths.items()}
    draft = read(paths["draft"], "model.safetensors")
    assert write_tiny(tmp_path) == paths
    assert {k: os.stat(os.path.join(p, "model.safetensors")).st_mtime_ns for k, p in paths.items()} == stamp
    os.remove(os.path.join(paths["draft"], checkpoints.MARKER))  # an interrupted write
    marker = os.path.join(paths["draft-dspark"], checkpoints.MARKER)
    with open(marker) as f:
        old = json.load(f)
    with open(marker, "w") as f:  # written by another version of the recipe
        json.dump({**old, "format": old["format"] - 1}, f)
    write_tiny(tmp_path)
    changed = {k for k, p in paths.items() if os.stat(os.path.join(p, "model.safetensors")).st_mtime_ns != stamp[k]}
    assert changed == {"draft", "draft-dspark"}
    assert read(paths["draft"], "model.safetensors") == draft  # the target's tensors drawn again, the same


def test_the_drafts_are_made_of_the_targets_tensors(tiny):
    """STANDALONE: the target's embedding, layers 0-1, final norm and LM head, byte-equal. The target's
    later layers write into the residual at 1/4. EAGLE3: the same two layers on the token embedding
    (hidden halves and fc zero), the target's LM head, no embedding of its own."""
    target, draft, eagle3 = tensors(tiny["target"]), tensors(tiny["draft"]), tensors(tiny["draft-eagle3"])
    first = ("model.embed_tokens.", "model.norm.", "lm_head.", "model.layers.0.", "model.layers.1.")
    assert set(draft) == {n for n in target if n.startswith(first)}
    assert all(torch.equal(draft[n], target[n]) for n in draft)
    std = {n: t.float().std().item() for n, t in target.items() if t.dim() == 2}
    for i in range(TINY["num_hidden_layers"]):
        for part in ("self_attn.o_proj", "mlp.down_proj", "self_attn.q_proj", "mlp.up_proj"):
            scaled = i >= checkpoints.DRAFT_LAYERS and part in ("self_attn.o_proj", "mlp.down_proj")
            want = checkpoints.STD * (checkpoints.LATER_LAYER_SCALE if scaled else 1.0)
            assert std[f"model.layers.{i}.{part}.weight"] == pytest.approx(want, rel=0.1), (i, part)
        norm = target[f"model.layers.{i}.input_layernorm.weight"]
        assert torch.equal(norm, torch.ones_like(norm))

    h = TINY["hidden_size"]
    assert "model.embed_tokens.weight" not in eagle3 and torch.equal(eagle3["lm_head.weight"], target["lm_head.weight"])
    assert eagle3["model.fc.weight"].shape == (h, 3 * h) and not eagle3["model.fc.weight"].any()
    for name, t in eagle3.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) and name.startswith("model.layers.0."):
            assert torch.equal(t[:, :h], target[name]) and not t[:, h:].any(), name
        elif name in target:
            assert torch.equal(t, target[name]), name
    assert {n for n in eagle3 if n not in target} == {"model.fc.weight", "model.layers.0.hidden_norm.weight",
                                                      "model.layers.1.hidden_norm.weight"}


def test_the_block_drafts_configs_parse_as_sglang_reads_them(tiny):
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    for key in ("draft-dflash", "draft-dspark"):
        with open(os.path.join(tiny[key], "config.json")) as f:
            cfg = parse_dflash_draft_config(draft_hf_config=json.load(f))
        # SGLang's DFlash worker rejects a mask token outside the target's vocabulary.
        assert 0 <= cfg.mask_token_id < TINY["vocab_size"], key
        assert cfg.resolve_target_layer_ids(target_num_layers=TINY["num_hidden_layers"]) == [1, 4, 6]
    with open(os.path.join(tiny["draft-dspark"], "config.json")) as f:
        assert parse_dspark_draft_config(draft_hf_config=json.load(f)).require_markov()


def test_the_package_imports_without_torch():
    from helpers import out, run_python

    proc = run_python("""
        import sys
        sys.modules["torch"] = sys.modules["safetensors"] = None  # any import of them raises
        from sglang_hostsync_plugin.e2e import checkpoints
        assert checkpoints.checkpoint_models("small")["target"]["num_hidden_layers"] == 8
        print("OK")
    """, timeout=120, fresh=True)  # a fresh interpreter: one forked with torch imported would let torch.x imports through
    assert proc.returncode == 0 and "OK" in proc.stdout, out(proc)


# Builds each model with SGLang's own class on the meta device (bf16, as its loader does; a gloo world of one;
# the server arguments of that model's algorithm published as a scheduler does), wraps every parameter's weight
# loader to record (parameter, checkpoint tensor, shard), and feeds the class's load_weights the file through
# SGLang's own safetensors iterator. Loaders that ignore an unknown name silently show up as a tensor no
# loader received. A non-static ragged verify mode, so DSpark builds its confidence head too.
LOAD_EVERY_MODEL = """
import json, os, socket, sys
import torch
models = json.loads(sys.argv[1])
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import publish, SpawnRanks
from sglang.srt.distributed import parallel_state as ps
from sglang.srt.layers.moe import utils as moe_utils
from sglang.srt.layers.rotary_embedding import base as rope
from sglang.srt.model_loader.weight_utils import default_weight_loader, safetensors_weights_iterator
from sglang.srt.models.registry import ModelRegistry
from transformers import AutoConfig

ALGORITHM = {"draft": "STANDALONE", "draft-eagle3": "EAGLE3", "draft-dflash": "DFLASH", "draft-dspark": "DSPARK"}
rope._is_cpu = True  # no CUDA in this torch: the rotary layer's CPU path (its weights are the same)
report = {}
for n, key in enumerate(ALGORITHM):
    args = prepare_server_args(["--model-path", models["target"], "--speculative-algorithm", ALGORITHM[key],
                                "--speculative-draft-model-path", models[key], "--attention-backend", "triton",
                                "--skip-tokenizer-init", "--device", "cuda"])
    args.resolve_once()
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    if n == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel()
        moe_utils.initialize_moe_config()
    for name in (["target", key] if key == "draft" else [key]):
        cfg = AutoConfig.from_pretrained(models[name])
        cls, _ = ModelRegistry.resolve_model_cls(cfg.architectures)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("meta"):
            model = cls(cfg)
        torch.set_default_dtype(torch.float32)
        weights = list(safetensors_weights_iterator([os.path.join(models[name], "model.safetensors")]))
        by_id = {id(t): tname for tname, t in weights}
        calls = []

        def recorder(pname, loader):
            def load(param, loaded, *shard):
                calls.append([pname, by_id.get(id(loaded), "?"), shard[0] if shard else None])
                return loader(param, loaded, *shard)
            return load

        params = dict(model.named_parameters())
        for pname, p in params.items():
            p.weight_loader = recorder(pname, getattr(p, "weight_loader", default_weight_loader))
        model.load_weights(iter(weights))
        report[name] = {"cls": cls.__name__, "calls": calls,
                        "tensors": {t: [list(w.shape), str(w.dtype)] for t, w in weights},
                        "params": {k: [list(p.shape), str(p.dtype)] for k, p in params.items()}}
print("LOADED " + json.dumps(report))
"""
CLASSES = {"target": "LlamaForCausalLM", "draft": "LlamaForCausalLM", "draft-eagle3": "LlamaForCausalLMEagle3",
           "draft-dflash": "DFlashDraftModel", "draft-dspark": "DSparkDraftModel"}
# Parameters SGLang fills from the target instead of the checkpoint (EAGLE3's set_embed).
SHARED = {"draft-eagle3": {"model.embed_tokens.weight"}}
SHARDS = {"qkv_proj.weight": ["k", "q", "v"], "gate_up_proj.weight": ["0", "1"]}


def test_sglang_loads_every_tensor_into_every_parameter(tiny):
    """For each model: every checkpoint tensor reaches a parameter's loader (none ignored), every parameter
    gets exactly its shards (q/k/v, gate/up) once, their shapes add up to the parameter's and the dtypes
    are the ones SGLang builds (bf16; DSpark's confidence head float32)."""
    assert_sglang_loads_every_tensor(tiny)


def assert_sglang_loads_every_tensor(paths: dict[str, str]) -> None:
    from helpers import out, run_python

    proc = run_python(LOAD_EVERY_MODEL.replace("sys.argv[1]", repr(json.dumps(paths))), timeout=600,
                      SGLANG_RAGGED_VERIFY_MODE="compact")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED ")]
    assert proc.returncode == 0 and line, out(proc)
    report = json.loads(line[0][len("LOADED "):])
    assert set(report) == set(KEYS)
    for key, model in report.items():
        assert model["cls"] == CLASSES[key]
        received = {tensor for _, tensor, _ in model["calls"]}
        assert sorted(set(model["tensors"]) - received) == [], f"{key}: tensors no loader received"
        assert "?" not in received, key
        got: dict[str, list] = {}
        for param, tensor, shard in model["calls"]:
            got.setdefault(param, []).append((shard, tensor))
        assert sorted(set(model["params"]) - set(got)) == sorted(SHARED.get(key, ())), f"{key}: parameters not loaded"
        for param, loads in got.items():
            pshape, pdtype = model["params"][param]
            want = next((s for suffix, s in SHARDS.items() if param.endswith(suffix)), ["None"])
            assert sorted(str(s) for s, _ in loads) == want, (key, param, loads)
            shapes = [model["tensors"][t][0] for _, t in loads]
            assert [sum(s[0] for s in shapes), *shapes[0][1:]] == pshape, (key, param, shapes)
            assert {model["tensors"][t][1] for _, t in loads} == {pdtype}, (key, param)
    assert {d for _, d in report["draft-dspark"]["params"].values()} == {"torch.bfloat16", "torch.float32"}


# --- small-bigram: block drafts that accept ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_bigram(tmp_path_factory) -> dict[str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(checkpoints.CHECKPOINT_SHAPES, "tiny-bigram", TINY)
        mp.setattr(checkpoints, "BIGRAM_SHAPES", {"tiny-bigram"})
        return checkpoints.write_checkpoints(str(tmp_path_factory.mktemp("bigram")), shape="tiny-bigram")


def _rms(x, w, eps=TINY["rms_norm_eps"]):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_the_bigram_targets_next_token_is_a_function_of_the_current_token_with_short_cycles(tiny_bigram):
    t = tensors(tiny_bigram["target"])
    for i in range(TINY["num_hidden_layers"]):
        for part in ("self_attn.o_proj", "mlp.down_proj"):  # nothing written into the residual
            assert not t[f"model.layers.{i}.{part}.weight"].any(), (i, part)
    vocab = TINY["vocab_size"]
    embed, head = t["model.embed_tokens.weight"].float(), t["lm_head.weight"].float()
    assert not embed[vocab - 1].any() and embed[: vocab - 1].abs().sum(-1).min() > 0  # the block drafts' mask token
    nxt = (_rms(embed, t["model.norm.weight"].float()) @ head.T).argmax(-1)
    nxt[vocab - 1] = vocab - 1  # (its embedding is zero: every logit 0)
    assert sorted(nxt.tolist()) == list(range(vocab))  # a permutation
    assert nxt[:3].tolist() == [0, 1, 2]  # bos and eos map to themselves: no cycle reaches eos
    walk, period = torch.arange(vocab), torch.zeros(vocab, dtype=torch.long)
    for step in range(1, checkpoints.CYCLE + 1):
        walk = nxt[walk]
        period[(walk == torch.arange(vocab)) & (period == 0)] = step
    ordinary = period[3: vocab - 1]
    assert (ordinary == checkpoints.CYCLE).sum() >= len(ordinary) - checkpoints.CYCLE, ordinary.bincount()
    assert set(ordinary.tolist()) <= {1, checkpoints.CYCLE}  # the few left over are fixed points


def test_the_8b_bigram_shape_is_llama_8bs_layers_and_its_head_keeps_the_cycle_map_at_hidden_4096():
    """``llama-8b-bigram``: Llama-3-8B's layer shapes, the small vocabulary, a bigram shape. At its hidden size
    the cycle head still makes ``next(x)`` the greedy token by a wide margin (a sample of rows: the whole
    vocabulary against them)."""
    from sglang_hostsync_plugin.e2e.matrix import LLAMA_8B

    cfg = checkpoints.CHECKPOINT_SHAPES["llama-8b-bigram"]
    assert "llama-8b-bigram" in checkpoints.BIGRAM_SHAPES
    assert {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "head_dim")} == {
        k: LLAMA_8B[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim")}
    assert cfg["vocab_size"] == 32000 and not cfg["tie_word_embeddings"]
    vocab, hidden = 4096, cfg["hidden_size"]  # (a smaller vocabulary: the margin depends on the hidden size)
    rng = checkpoints._Draws(0, "cpu")
    embed = rng.normal("model.embed_tokens.weight", (vocab, hidden))
    embed[vocab - 1] = 0
    head = checkpoints._cycle_head(embed, vocab - 1, rng).float()
    rows = torch.arange(3, vocab - 1, 61)
    logits = _rms(embed[rows].float(), torch.ones(hidden), cfg["rms_norm_eps"]) @ head.T
    top2 = logits.topk(2, dim=-1).values
    nxt = logits.argmax(-1)
    assert (head[nxt] == embed[rows].float()).all()  # the greedy row is the current token's embedding
    assert (top2[:, 0] - top2[:, 1]).min() > 40  # hidden * 0.02 = 82 over N(0, 1.3)


def test_the_bigram_block_drafts_predict_the_targets_next_token_at_every_block_position(tiny_bigram):
    """A one-layer DFlash-family draft step over the block [x, mask, ...] with context values zero, as SGLang
    computes it (pre-norm attention, fused residual adds, final norm, the target's LM head), in float32 from
    the checkpoint's bf16 tensors, the attention output rounded to bf16 as a bf16 server rounds it: the
    argmax at every mask position, and at the anchor row (DSpark drafts from it too), is the target's next
    token after x, for every x and context length; the final norm's input stays above its eps (sampled
    DSpark rows read the logits' scale)."""
    t = tensors(tiny_bigram["target"])
    embed, head = t["model.embed_tokens.weight"].float(), t["lm_head.weight"].float()
    vocab, h = TINY["vocab_size"], TINY["hidden_size"]
    tokens = torch.arange(vocab - 1)
    target_next = (_rms(embed[tokens], t["model.norm.weight"].float()) @ head.T).argmax(-1)
    assert len(set(target_next.tolist())) > vocab // 4  # a map of the token, not a constant
    for key in ("draft-dflash", "draft-dspark"):
        with open(os.path.join(tiny_bigram[key], "config.json")) as f:
            cfg = json.load(f)
        assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] and cfg["num_attention_heads"] * cfg["head_dim"] == h
        d = {k: v.float() for k, v in tensors(tiny_bigram[key]).items()}
        assert not d["fc.weight"].any() and not d["layers.0.self_attn.q_proj.weight"].any()
        assert not d["layers.0.self_attn.k_proj.weight"].any()  # with q: every score 0, uniform attention
        if key == "draft-dspark":
            assert not any(d[n].any() for n in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                                                  "confidence_head.proj.weight"))
        ln_in = d["layers.0.input_layernorm.weight"]
        values = _rms(embed[tokens], ln_in) @ d["layers.0.self_attn.v_proj.weight"].T  # block position 0's
        mask_value = _rms(embed[vocab - 1], ln_in) @ d["layers.0.self_attn.v_proj.weight"].T
        assert not mask_value.any()  # the mask positions (and the zero context) add nothing
        for keys in (2, 7, 300, 8192):  # keys a block position attends to: context + block
            attn = ((values / keys).bfloat16().float() @ d["layers.0.self_attn.o_proj.weight"].T).bfloat16().float()
            assert attn.pow(2).mean(-1).min() > 10 * TINY["rms_norm_eps"], keys
            for row, residual in (("mask", attn), ("anchor", attn + embed[tokens])):  # + its input embedding
                hidden = _rms(residual, d["layers.0.post_attention_layernorm.weight"])
                mlp = (torch.nn.functional.silu(hidden @ d["layers.0.mlp.gate_proj.weight"].T)
                       * (hidden @ d["layers.0.mlp.up_proj.weight"].T)) @ d["layers.0.mlp.down_proj.weight"].T
                final = _rms(mlp + residual, d["norm.weight"])
                agree = ((final @ head.T).argmax(-1) == target_next).float().mean().item()
                assert agree > 0.99, (key, keys, row, agree)


def test_sglang_loads_every_bigram_tensor_into_every_parameter(tiny_bigram):
    assert_sglang_loads_every_tensor(tiny_bigram)  # the block drafts with as many KV heads as heads
