#!/usr/bin/env bash
# Every GPU-side run of this project, on any CUDA machine with SGLang 0.5.23:
#   - with .device-bundle/ (../shared/device/build_bundle.sh; an offline machine such as
#     the H200 device) it first sources the bundle: real SGLang 0.5.23, real SM90 sgl_kernel;
#     HOSTSYNC_BUNDLE=.device-bundle-fi adds FlashInfer 0.7.2 (scripts/build_flashinfer_bundle.sh);
#   - elsewhere the installed sglang and this checkout (pip install -e .) are used.
# Output goes to ${OUT:-gpu_out}/.
#   bash scripts/gpu_run.sh                                # every benchmark below, then the GPU tests
#   TESTS=0 BENCHES=e2e E2E_ARGS="--configs standalone-t4-p16" bash scripts/gpu_run.sh
#   bash scripts/gpu_run.sh tests/test_gpu_e2e.py          # only these tests
# BENCHES (default: all but profile, plugin_load and result_readback): e2e startup dp_meta eagle_tail tree_compact greedy_row_argmax replay_launch relay_stash draft_topk small_copy draft_vocab_topk ngram_full_mask draft_input events decode_loop pageable_h2d profile plugin_load result_readback
#   e2e:         python -m sglang_hostsync_plugin.e2e $E2E_ARGS (real servers) -> $OUT/e2e/, stopped after
#                E2E_TIMEOUT seconds if set (it then reports the rounds that finished); with
#                PYSPY_CONFIGS="standalone-t4-p16 ..." (and PYSPY=path/to/py-spy) each config's schedulers
#                are sampled by py-spy beside it (PYSPY_RATE samples/s, default 250) -> $OUT/pyspy/ (report: benchmarks/pyspy_schedulers.py report)
#   startup:     benchmarks/bench_startup.py $STARTUP_ARGS (launch-to-ready, cold/warm csrc cache) -> $OUT/startup/
#   plugin_load: benchmarks/bench_plugin_load.py (the plugin's import and set-up cost per launcher / scheduler start; no GPU work)
#   result_readback: benchmarks/bench_result_readback.py (SGLang's per-tensor result D2H vs one packed D2H; why no packed-readback slot)
#   decode_loop: benchmarks/bench_decode_loop.py with every owned slot (--opt-in pinned_d2h_ring)
#   profile:     benchmarks/profile_step_kernels.py $PROFILE_ARGS (GPU time per step, graph vs eager; real servers) -> $OUT/profile/
# TESTS=1 (default) then runs tests/test_gpu_*.py (the CPU suite is CI's); the real-server
# tests check the e2e/startup output of this run where there is one, else start their own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
# HOSTSYNC_BUNDLE=.device-bundle-fi: the bundle plus FlashInfer (scripts/build_flashinfer_bundle.sh).
BUNDLE=${HOSTSYNC_BUNDLE:-.device-bundle}
if [ -f "$BUNDLE/setup.sh" ]; then
  source "$BUNDLE/setup.sh" || exit 1
fi
export PYTHONPATH="$PWD/tests:${PYTHONPATH:-}" HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
# FlashInfer's JIT cache where SGLang's servers keep theirs (SGLANG_CACHE_DIR), so the GPU
# tests reuse the modules the e2e servers built.
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$HOME/.cache/sglang}"
if [ $# -gt 0 ]; then
  python3 -m pytest -q -rs -s -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests_subset.log"
  exit "${PIPESTATUS[0]}"
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, sglang, sgl_kernel; print('torch', torch.__version__, 'triton', triton.__version__, 'sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__file__)"
  git rev-parse HEAD 2>/dev/null  # the device's .git can be older than the tree that runs: the digest says which ran
  echo "plugin source digest $(find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
  } | tee "$OUT/env.txt"
rc=0
for b in ${BENCHES:-dp_meta eagle_tail tree_compact greedy_row_argmax replay_launch relay_stash draft_topk small_copy draft_vocab_topk ngram_full_mask draft_input events decode_loop pageable_h2d startup e2e}; do
  case $b in
    e2e) spies=""
         for c in ${PYSPY_CONFIGS:-}; do  # line-level scheduler profiles beside the e2e (benchmarks/pyspy_schedulers.py)
           python3 benchmarks/pyspy_schedulers.py record --e2e-txt "$OUT/e2e.txt" --config "$c" --out "$OUT/pyspy" \
             --py-spy "${PYSPY:-py-spy}" --rate "${PYSPY_RATE:-250}" > "$OUT/pyspy_$c.log" 2>&1 & spies="$spies $!"
         done
         # E2E_TIMEOUT (s): the e2e itself gets the SIGTERM (a timeout around this script stops only bash)
         # and reports the rounds that finished.
         timeout -s TERM "${E2E_TIMEOUT:-0}" python3 -m sglang_hostsync_plugin.e2e --out "$OUT/e2e" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.txt"
         [ "${PIPESTATUS[0]}" = 0 ] || rc=1
         [ -z "$spies" ] || { sleep 2; kill $spies 2>/dev/null; }
         export HOSTSYNC_E2E_DIR="$OUT/e2e" ;;
    startup) python3 benchmarks/bench_startup.py --out "$OUT/startup" ${STARTUP_ARGS:-} 2>&1 | tee "$OUT/startup.txt"
         [ "${PIPESTATUS[0]}" = 0 ] || rc=1
         export HOSTSYNC_STARTUP_DIR="$OUT/startup" ;;
    profile) python3 benchmarks/profile_step_kernels.py --out "$OUT/profile" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.txt"
         [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
    decode_loop) python3 benchmarks/bench_decode_loop.py --opt-in pinned_d2h_ring --json "$OUT/bench_decode_loop.json" \
                   --png "$OUT/bench_decode_loop_lead.png" 2>&1 | grep -v Warning | tee "$OUT/bench_decode_loop.txt" ;;
    *) python3 "benchmarks/bench_$b.py" --json "$OUT/bench_$b.json" 2>&1 | grep -v Warning | tee "$OUT/bench_$b.txt" ;;
  esac
done
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -rs -s -p no:cacheprovider ${GPU_TESTS:-tests/test_gpu_*.py} 2>&1 | tee "$OUT/gpu_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit $rc
