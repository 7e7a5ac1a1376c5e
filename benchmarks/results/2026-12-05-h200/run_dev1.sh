#!/usr/bin/env bash
# Device call 1 (2026-12-05): the GPU tests of spec_kernel_replay (verify commit) and chain_tree_full_mask,
# then the e2e eagle3-auto-p16 (no steps/topk/draft tokens given: SGLang picks 5, 4, 8), stock vs plugin.
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g1; mkdir -p $G/unit
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
timeout 170 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_spec_kernel_replay.py \
  tests/test_gpu_chain_tree_full_mask.py > $G/unit/gpu_tests.log 2>&1
echo "pytest rc $?" >> $G/unit/gpu_tests.log
tail -4 $G/unit/gpu_tests.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/auto TESTS=0 BENCHES=e2e E2E_TIMEOUT=330 \
  E2E_ARGS="--configs eagle3-auto-p16 --arms stock,audit,plugin --concurrency 1 --rounds 1" \
  timeout 350 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -25 $G/run.log
grep -h "plan refined\|eagle_fixed_shape_tail" $G/auto/e2e/*.log | cut -c1-300 | head -12
tar -C /tmp -cJf $OUT/g1.tar.xz --exclude='*/models/*' g1
ls -la $OUT
