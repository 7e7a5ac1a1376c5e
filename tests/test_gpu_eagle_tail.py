"""eagle_fixed_shape_tail on a CUDA device: Triton and csrc vs stock, no syncs.

Skipped without CUDA (CI); run on the H200 by scripts/gpu_run.sh. The pools use
SGLang's real tiled KV copy kernel (enable_kv_cache_copy=True)."""

import os
import random
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from hostsync_drivers.eagle_tail import changed, make_case, make_pool, pools_equal, run_both
from sglang.srt.speculative import eagle_worker_common as ewc
from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"
IMPLS = {"triton": eft.tail_slots_triton, "cuda": eft.tail_slots_cuda}


def caller(fn):
    def call(pool, rows, base, last, pages, topk, page_size):
        tgt, src = fn(rows, base, last, pages, topk, page_size)
        pool.move_kv_cache(tgt, src)
    return call


def cases(seed, n):
    rng = random.Random(seed)
    fixed = [(1, 2, 4, None), (1, 4, 16, 0), (3, 3, 16, 15), (2, 2, 2, 1), (256, 4, 64, None), (8, 8, 64, 63)]
    for bs, topk, ps, lp in fixed:
        yield rng, bs, topk, ps, lp
    for _ in range(n):
        yield rng, rng.randint(1, 48), rng.choice([2, 3, 4, 8]), rng.choice([2, 4, 16, 32, 64]), None


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_gpu_bit_identical_to_stock(impl):
    for i, (rng, bs, topk, ps, lp) in enumerate(cases(47677 + len(impl), 150)):
        size, args = make_case(rng, bs, topk, ps, last_page=lp, device=DEV)
        stock, plugin = run_both(size, args, topk, ps, caller(IMPLS[impl]), device=DEV, seed=i)
        assert pools_equal(stock, plugin), (impl, bs, topk, ps, lp)
        assert changed(stock, i, size, ps, DEV) == bool((args[2] > 0).any())


def test_gpu_triton_and_csrc_agree():
    for rng, bs, topk, ps, lp in cases(5, 200):
        _, args = make_case(rng, bs, topk, ps, last_page=lp, device=DEV)
        t = eft.tail_slots_triton(*args, topk, ps)
        c = eft.tail_slots_cuda(*args, topk, ps)
        assert torch.equal(t[0], c[0]) and torch.equal(t[1], c[1]), (bs, topk, ps)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_gpu_no_sync_in_the_plugin_path_and_stock_syncs(impl, monkeypatch):
    rng = random.Random(9)
    size, args = make_case(rng, 16, 4, 16, device=DEV)
    pool = make_pool(size, 16, DEV, 0)
    monkeypatch.setattr(eft, "_impl", impl)
    for _ in range(3):  # warm-up: kernel compile / csrc build
        eft.duplicate_prefix_tail(None, pool, *args, 4, 16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(200):
            eft.duplicate_prefix_tail(None, pool, *args, 4, 16)
        with pytest.raises(RuntimeError, match="synchroniz"):
            ewc.duplicate_prefix_tail_to_draft_branches(pool, *args, 4, 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_csrc_compiles_warning_free(tmp_path):
    code = textwrap.dedent("""
        from torch.utils import cpp_extension
        from sglang_hostsync_plugin import csrc
        cpp_extension.load(name="hostsync_eagle_tail_check", sources=[csrc.source_path("eagle_tail.cu")],
                           extra_cuda_cflags=list(csrc.NVCC_FLAGS), verbose=True)
        print("BUILT")
    """)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    log = proc.stdout + proc.stderr
    print(log[-3000:])
    assert proc.returncode == 0 and "BUILT" in proc.stdout, log[-6000:]
    # nvcc ran with "-Werror all-warnings"; also no host-compiler diagnostic printed.
    assert not re.search(r"warning(:| #)", log, re.IGNORECASE), log[-6000:]


def test_gpu_auto_serves_with_triton_while_csrc_builds_then_switches(tmp_path):
    """A cold extension cache in a fresh process, as a first server start: the launcher's
    prebuild runs, prepare returns within AUTO_WAIT_S on Triton, the pool stays
    bit-identical to stock before, during and after the switch to the csrc kernel."""
    code = textwrap.dedent("""
        import logging, random, time
        logging.basicConfig(level=logging.INFO)
        from hostsync_drivers.eagle_tail import make_case, pools_equal, run_both
        from sglang_hostsync_plugin import csrc
        from sglang_hostsync_plugin.slot import ServingFacts
        from sglang_hostsync_plugin.slots import eagle_fixed_shape_tail as eft

        def step(seed):
            rng = random.Random(seed)
            size, args = make_case(rng, 8, 4, 16, device="cuda")
            stock, plugin = run_both(size, args, 4, 16, lambda pool, *a: eft.duplicate_prefix_tail(None, pool, *a),
                                     device="cuda", seed=seed)
            assert pools_equal(stock, plugin), seed

        assert eft.choose_impl()[0] == "cuda"
        prebuild = csrc.start_prebuild(("eagle_tail",))
        t0 = time.perf_counter()
        note = eft.prepare(ServingFacts(speculative_algorithm="STANDALONE", topk=4, page_size=16))
        print(f"PREPARE {time.perf_counter() - t0:.2f} s: {note}", flush=True)
        assert "still building" in note and eft._impl == "triton", note
        seed, seen = 0, []
        while eft._impl != "cuda" and seed < 100000:
            seen.append(eft._impl)
            step(seed)
            seed += 1
            time.sleep(0.01)
        assert csrc.wait_loaded("eagle_tail", 600) and eft._impl == "cuda"
        for extra in range(20):
            step(seed + extra)
        assert prebuild.wait(600) == 0
        print(f"SWITCHED after {seed} Triton steps, {time.perf_counter() - t0:.1f} s", flush=True)
    """)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, (tests_dir, os.environ.get("PYTHONPATH")))))
    env.pop("SGLANG_HOSTSYNC_EAGLE_TAIL_IMPL", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    print(proc.stdout + "\n".join(line for line in proc.stderr.splitlines() if "hostsync" in line))
    assert proc.returncode == 0 and "SWITCHED" in proc.stdout, (proc.stdout + proc.stderr)[-6000:]
    assert "serves from now on" in proc.stderr
