#!/usr/bin/env bash
# Device call 4: time to ready with the launcher's deferred plan (triton STANDALONE topk 1 page 1, arms started together), twice.
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g4; mkdir -p $G
for r in 1 2; do
  HOSTSYNC_BUNDLE=/nonexistent OUT=$G/start-$r TESTS=0 BENCHES=e2e E2E_TIMEOUT=125 \
    E2E_ARGS="--configs standalone-t1-p1 --arms stock,plugin-noaudit --slots default,eagle_host,-audit \
    --concurrency 1 --rounds 1" timeout 135 bash scripts/gpu_run.sh > $G/run-$r.log 2>&1
  echo "run $r rc $?" >> $G/run.log
  grep -A5 "ready s" $G/start-$r/e2e/e2e.md
  tar -C /tmp -cJf $OUT/g4-r$r.tar.xz --exclude='*/models/*' g4
done
