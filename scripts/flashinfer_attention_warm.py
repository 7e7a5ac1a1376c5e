#!/usr/bin/env python3
"""Build FlashInfer 0.7.2's attention JIT modules for SGLang 0.5.23's flashinfer backend in parallel,
one process per module, beside a server's start. A server needing a module this builds waits on
FlashInfer's per-module file lock (JitSpec.build_and_load) instead of building it again, so the
~220 s of serial builds (verify capture, draft-decode capture, first prefill) become about one.

    python3 scripts/flashinfer_attention_warm.py --shape small [--draft-key draft|none] [--list]
    python3 scripts/flashinfer_attention_warm.py --model-path T [--draft-model-path D] [--list]

Module choice (sglang/srt/layers/attention/flashinfer_backend.py, FlashInferAttnBackend):
  paged prefill/verify/draft-extend wrappers: backend="fa2" (l.335, 535-546, 1191, 1302), so the
    FA2 primary ("_kv_stride_equal") module, custom mask (EAGLE tree, any topk; NGRAM) or not: it is
    a run-time mode of the same module;
  ragged prefill (plain extend; l.501-525, 1058, 2297): backend="auto", which resolves through
    determine_attention_backend (no custom mask) to fa3 on SM90 for head_dim 64/128/256, else fa2;
  decode (l.549, 1144, 1840): backend="fa2"; tensor cores iff num_heads/num_kv_heads >= 4 (l.2670)
    -> the FA2 prefill module, else the batch-decode module.
  Every plan passes page_size=1, no window, no logits cap, pos_encoding NONE, int32 indptrs, so page
  size and topk pick no module. Two fixed helpers: "quantization" (plan(custom_mask=...) packs the
  verify tree mask with segment_packbits: EAGLE/STANDALONE any topk, NGRAM) and "cascade"
  (merge_state after a ragged extend over a cached prefix, l.1503). Module names carry no head
  counts: models of one head_dim and dtype share modules. The target plans decode only without
  speculation; the draft (multi-step draft backend, l.2442) only with more than one draft step.
Run it in the server's environment (same FlashInfer, CUDA_HOME, FLASHINFER_WORKSPACE_BASE/
SGLANG_CACHE_DIR): a different nvcc command line makes ninja rebuild in the server.
--list needs no GPU (FlashInfer must import; the ragged backend is then resolved for --sm).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package first

DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
          "fp16": "float16", "float32": "float16", "float": "float16"}  # SGLang's auto: fp32 -> fp16


def _model(cfg: dict, dtype: str) -> dict:
    """The attention shape SGLang's ModelConfig derives from a HF config (head_dim, heads, dtype)."""
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if dtype == "auto":
        dtype = DTYPES[str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")]
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        print(f"warning: sliding_window={cfg['sliding_window']}: SWA wrappers are not covered", file=sys.stderr)
    return {"heads": heads, "kv_heads": kv, "head_dim": hd, "dtype": DTYPES.get(dtype, dtype)}


def _configs(a) -> tuple[dict, dict | None]:
    if a.shape:
        from sglang_hostsync_plugin.e2e.checkpoints import checkpoint_models
        models = checkpoint_models(a.shape)
        return models["target"], (None if a.draft_key == "none" else models[a.draft_key])
    read = lambda p: json.load(open(os.path.join(p, "config.json")))  # noqa: E731
    return read(a.model_path), (read(a.draft_model_path) if a.draft_model_path else None)


def _ragged_backend(m: dict, dt, sm: int) -> str:
    """BatchPrefillWithRaggedKVCacheWrapper(backend="auto").plan() on this device (or on SM `sm`)."""
    import torch
    from flashinfer import utils as fu
    if torch.cuda.is_available():
        return fu.determine_attention_backend(torch.device("cuda"), 0, False, False, dt, dt,
                                              head_dim_qk=m["head_dim"], head_dim_vo=m["head_dim"])
    sm90a = sm // 10 == 9 and fu.version_at_least(torch.version.cuda or "0", "12.3")
    ok = fu.is_fa3_backend_supported(0, False, False, dt, dt)
    return "fa3" if sm90a and ok and fu.is_fa3_prefill_head_dim_supported(m["head_dim"], m["head_dim"]) else "fa2"


def plan_modules(a) -> list[dict]:
    """[{name, kind, backend, args, uses}], one per distinct JIT module (same name = same module)."""
    import torch
    from flashinfer.jit.attention.modules import (_get_batch_prefill_module_uri, get_batch_decode_uri,
                                                  get_batch_prefill_uri)
    target, draft = _configs(a)
    spec = a.speculative_algorithm or ("STANDALONE" if draft is not None else "NONE")
    roles = [("target", _model(target, a.dtype))] + ([("draft", _model(draft, a.dtype))] if draft else [])
    mods: dict[str, dict] = {}

    def add(kind, backend, args, use):
        if kind in ("quantization", "cascade"):  # gen_quantization_module / gen_cascade_module
            name = kind
        elif kind == "decode":
            name = get_batch_decode_uri(*args)
        else:  # get_batch_prefill_module: fa2 builds the equal-stride primary, others the runtime/full module
            base = get_batch_prefill_uri(backend, *args)
            name = _get_batch_prefill_module_uri(base, backend, "equal", "full") if backend == "fa2" else base
        mods.setdefault(name, {"name": name, "kind": kind, "backend": backend, "args": args, "uses": []})
        mods[name]["uses"].append(use)

    env_tc = os.environ.get("SGLANG_FLASHINFER_USE_TENSOR_CORE")
    use_paged = os.environ.get("SGLANG_FLASHINFER_USE_PAGED", "false").lower() in ("1", "true")
    for role, m in roles:
        dt = getattr(torch, m["dtype"])
        hd = m["head_dim"]
        tag = f"{role} h{m['heads']}/kv{m['kv_heads']} d{hd} {m['dtype']}"
        # (q, kv, o dtype, idx dtype, head_dim_qk, head_dim_vo, posenc, swa, logits cap[, fp16 qk])
        pargs = (dt, dt, dt, torch.int32, hd, hd, 0, False, False, False)
        paged_uses = ["paged extend (prefix)"]
        if role == "draft":
            paged_uses.insert(0, "draft extend (cuda graph + eager paged part)")
        if role == "target" and spec != "NONE":
            paged_uses.insert(0, "target verify (any topk, tree/NGRAM custom mask)")
            add("quantization", None, (), f"{tag}: target verify plan(custom_mask) -> segment_packbits")
        add("prefill", "fa2", pargs, f"{tag}: " + ", ".join(paged_uses))
        decodes = (role == "target" and spec == "NONE") or (role == "draft" and a.num_steps > 1)
        if decodes:
            tc = env_tc.lower() == "true" if env_tc is not None else m["heads"] // m["kv_heads"] >= 4
            if tc:
                add("prefill", "fa2", pargs, f"{tag}: decode (use_tensor_cores=True)")
            else:
                add("decode", None, pargs[:9], f"{tag}: decode (use_tensor_cores=False)")
        if not use_paged:
            add("prefill", _ragged_backend(m, dt, a.sm), pargs, f"{tag}: ragged extend/prefill (backend auto)")
            add("cascade", None, (), f"{tag}: ragged extend over a cached prefix -> merge_state")
    return list(mods.values())


def _build(kind: str, backend, args) -> tuple[float, float]:
    """In a fresh process: the very FlashInfer getter the server calls. Returns (import s, build s)."""
    t0 = time.perf_counter()
    if kind == "decode":
        from flashinfer.decode import get_batch_decode_module as get
    elif kind == "quantization":
        from flashinfer.quantization.packbits import get_quantization_module as get
    elif kind == "cascade":
        from flashinfer.cascade import get_cascade_module as get
    else:
        from flashinfer.prefill import get_batch_prefill_module as get
        args = (backend, *args)
    t1 = time.perf_counter()
    get(*args)  # JitSpec.build_and_load(): per-module FileLock, ninja, load
    return t1 - t0, time.perf_counter() - t1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-path", help="target checkpoint directory (its config.json is read)")
    src.add_argument("--shape", help="an e2e checkpoint shape (sglang_hostsync_plugin.e2e.checkpoints)")
    p.add_argument("--draft-model-path", help="draft checkpoint directory (STANDALONE/EAGLE)")
    p.add_argument("--draft-key", default="draft", help="with --shape: draft, draft-eagle3, ... or none (NGRAM)")
    p.add_argument("--speculative-algorithm", help="default STANDALONE with a draft, else NONE; NGRAM: no draft")
    p.add_argument("--num-steps", type=int, default=3, help="--speculative-num-steps (1: no draft decode)")
    p.add_argument("--dtype", default="auto", help="--dtype of the server (auto: the config's)")
    p.add_argument("--sm", type=int, default=90, help="compute capability for --list without a GPU")
    p.add_argument("--list", action="store_true", help="print the modules, build nothing")
    p.add_argument("--max-jobs", type=int, help="MAX_JOBS (ninja -j) per module build (default nproc+2)")
    return p


def main() -> int:
    a = build_parser().parse_args()
    if a.speculative_algorithm == "NGRAM":
        a.draft_key, a.draft_model_path = "none", None
    # sglang/__init__.py redirects FlashInfer's cache (srt/environ.py third_party_cache_defaults):
    # the server builds under $SGLANG_CACHE_DIR (~/.cache/sglang)/.cache/flashinfer. Mirror it.
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE",
                          os.path.expanduser(os.environ.get("SGLANG_CACHE_DIR", "~/.cache/sglang")))
    if a.max_jobs:
        os.environ["MAX_JOBS"] = str(a.max_jobs)
    mods = plan_modules(a)
    import torch
    sm = (lambda c: 10 * c[0] + c[1])(torch.cuda.get_device_capability()) if torch.cuda.is_available() else a.sm
    if sm >= 100:
        print("warning: checked for SM80/SM90 only (on SM100 SGLang gives the ragged wrapper fa2/cutlass)")
    from flashinfer.jit import env as jit_env
    print(f"FlashInfer JIT dir: {jit_env.FLASHINFER_JIT_DIR}")
    for m in mods:
        so = jit_env.FLASHINFER_JIT_DIR / m["name"] / f"{m['name']}.so"
        print(f"{m['name']}  [{m['kind']} {m['backend'] or ''}]{'  (.so exists)' if so.exists() else ''}")
        for u in m["uses"]:
            print(f"    {u}")
    if a.list:
        return 0
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    t0 = time.perf_counter()
    rc = 0
    with ProcessPoolExecutor(len(mods), mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_build, m["kind"], m["backend"], m["args"]): m for m in mods}
        for f in as_completed(futs):
            try:
                imp, s = f.result()
                print(f"built {futs[f]['name']} in {s:.1f} s (import {imp:.1f} s, "
                      f"done at {time.perf_counter() - t0:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - report every module
                rc = 1
                print(f"FAILED {futs[f]['name']}: {e}", flush=True)
    print(f"flashinfer attention JIT warm-up: {len(mods)} modules in {time.perf_counter() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
