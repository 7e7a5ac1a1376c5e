#!/usr/bin/env bash
# Device call 1 (2026-12-05 b): chain_tree_full_mask's GPU test after 1d50e37, then the first
# DFlash and DSpark real servers (dflash-p16: 1-layer DFlash dummy draft, block 16; dspark-p16:
# 1-layer DSpark dummy draft, vanilla Markov head, gamma 5), stock vs audited stock vs plugin (default).
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g1; mkdir -p $G/unit
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
timeout 70 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_chain_tree_full_mask.py \
  > $G/unit/gpu_tests.log 2>&1
echo "pytest rc $?" >> $G/unit/gpu_tests.log
tail -4 $G/unit/gpu_tests.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/block TESTS=0 BENCHES=e2e E2E_TIMEOUT=480 \
  E2E_ARGS="--configs dflash-p16,dspark-p16 --arms stock,audit,plugin --concurrency 1 --rounds 1 --ready-timeout 170" \
  timeout 495 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -30 $G/run.log
grep -hi "error\|Traceback\|refused\|skipped\|applied" $G/block/e2e/*.log | cut -c1-250 | sort | uniq -c | sort -rn | head -30
tar -C /tmp -cJf $OUT/g1.tar.xz --exclude='*/models/*' g1
ls -la $OUT
