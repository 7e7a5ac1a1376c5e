#!/usr/bin/env bash
# Device call 3 (2026-12-05 e): pending item 7, DSpark's default and default,dspark_mega without the audit.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/ge3; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/dspark TESTS=0 BENCHES=e2e E2E_TIMEOUT=${E2E_T:-520} \
  E2E_ARGS="--configs dspark-p16 --arms stock,plugin-noaudit --slots default,dspark_mega,-audit --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --rounds 3 --requests 4 --ready-timeout 220 --time-budget $(( ${E2E_T:-520} - 40 ))" \
  timeout $(( ${E2E_T:-520} + 15 )) bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '1,12p' $G/dspark/e2e/e2e.md
sed -n '/^| config/,/^$/p' $G/dspark/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/dspark/e2e/e2e.md
tar -C /tmp -cJf $OUT/ge3.tar.xz --exclude='*/models/*' ge3
