#!/usr/bin/env bash
# GPU tests + benchmarks on a CUDA machine without internet (the H200 device):
#   wheels in .whl/ (sglang 0.5.23 cp312 + the small packages the image lacks, see
#   docs/gpu.md), sgl_kernel replaced by scripts/gpu_stubs (raises if called).
# Output goes to ${OUT:-gpu_out}/: gpu_tests.log, bench_dp_meta.txt/.json,
# bench_eagle_tail.txt/.json, bench_draft_input.txt/.json, bench_events.txt/.json, bench_decode_loop.txt/.json/.png.
# The decode loop runs every owned slot: the default set plus --opt-in pinned_d2h_ring.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"  # ninja, for csrc builds
fi
export PYTHONPATH="$PWD:$PWD/scripts/gpu_stubs:${PYTHONPATH:-}" HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
if [ $# -gt 0 ]; then  # a quick rerun: `bash scripts/gpu_run.sh tests/test_gpu_events.py [bench cmd...]`
  python3 -m pytest -q -rs -s -p no:cacheprovider "$@" 2>&1 | grep -v Warning | tee "$OUT/gpu_tests_subset.log"
  exit "${PIPESTATUS[0]}"
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"
echo "NOTE: sgl_kernel is an import stub here (scripts/gpu_stubs); any call into it raises." | tee -a "$OUT/env.txt"
rc=0
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: benchmarks only
  python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_dp_meta.py tests/test_dspark_dp_meta.py \
    tests/test_gpu_eagle_tail.py tests/test_gpu_draft_input_reuse.py tests/test_draft_input_reuse.py tests/test_gpu_audit.py \
    tests/test_gpu_events.py tests/test_gpu_target_dp_meta.py tests/test_target_dp_meta.py tests/test_source_edit.py tests/test_event_ring.py tests/test_accept_lens_snapshot.py tests/test_pinned_d2h_ring.py 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
  python3 -c "import sgl_kernel; print('sgl_kernel stub calls:', sgl_kernel.CALLED)" | tee -a "$OUT/gpu_tests.log"
fi
# BENCHES picks benchmarks (default all): dp_meta eagle_tail draft_input events decode_loop
for b in ${BENCHES:-dp_meta eagle_tail draft_input events decode_loop}; do
  case $b in
    decode_loop) python3 -m sglang_hostsync_plugin.bench --opt-in pinned_d2h_ring --json "$OUT/bench_decode_loop.json" \
                   --png "$OUT/bench_decode_loop_lead.png" ;;
    *) python3 "benchmarks/bench_$b.py" --json "$OUT/bench_$b.json" ;;
  esac 2>&1 | grep -v Warning | tee "$OUT/bench_$b.txt"
done
exit $rc
