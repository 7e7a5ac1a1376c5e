# Why SGLang's _record keeps prepare_verify_commit_outputs on the normal path (device diagnosis, 2026-12-04:
# benchmarks/results/2026-12-04-h200-c/unit/probe_verify_commit.txt; until 2026-12-06 this script lived there).
import random, torch
from triton.runtime.jit import JITFunction
from sglang.kernels.ops.diffusion.common import fast_launch as fl
from sglang.kernels.ops.speculative import eagle
from hostsync_drivers import spec_wrappers as sw
fn = eagle.prepare_verify_commit_outputs
for variant in ("", "fused"):
    args, kw = sw.case("prepare_verify_commit_outputs", random.Random(3), 4, variant)
    fn(*sw.clone(args), **sw.clone(kw))
    key, inputs = fl._signature(args, kw)
    launches = []; jit_run = JITFunction.run
    def run(self, *a, grid, warmup, **k):
        c = jit_run(self, *a, grid=grid, warmup=warmup, **k)
        launches.append((self, c, grid, a, k, torch.accelerator.current_device_index())); return c
    guard = fl._LaunchOnly(); JITFunction.run = run
    try:
        with guard:
            out = fn(*args, **kw)
    finally:
        JITFunction.run = jit_run
    print(f"variant {variant!r}: key {key is not None}, violation {guard.violation}, launches {len(launches)}")
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    for jit_fn, compiled, grid, a, k, dev in launches:
        names = jit_fn.arg_names
        values = list(a) + [k[n] if n in k else jit_fn.params[i].default for i, n in enumerate(names[len(a):], start=len(a))]
        print("  signature", len(compiled.src.signature), "values", len(values), "grid", grid)
        ins = {t.data_ptr(): i for i, t in enumerate(inputs)}; outs = {t.data_ptr(): j for j, t in enumerate(leaves)}
        for p, (n, v) in enumerate(zip(names, values)):
            if isinstance(v, torch.Tensor):
                print(f"   {p} {n}: input {ins.get(v.data_ptr())} output {outs.get(v.data_ptr())}")
    try:
        print("  plan", fl._plan(tuple(leaves), inputs, launches))
    except Exception as e:
        print("  plan raised", type(e).__name__, e)
