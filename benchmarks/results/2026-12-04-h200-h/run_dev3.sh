#!/usr/bin/env bash
# Device call 3: triton EAGLE page 1 (topk 4 and topk 1) c1 with the eagle_host preset.
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g3; mkdir -p $G
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/eagle-host-p1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=500 \
  E2E_ARGS="--configs standalone-t4-p1,standalone-t1-p1 --arms stock,audit \
  --slots default,eagle_host,-audit --slots default,eagle_host --concurrency 1 --rounds 2" \
  timeout 520 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g3.tar.xz --exclude='*/models/*' g3
ls -la $OUT
