#!/usr/bin/env bash
# Device call 5 (2026-12-05 c): pending item 2, the eagle_host preset's time to ready beside stock's
# (one server at a time, benchmarks/bench_startup.py), topk 4 page 16.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gc5; rm -rf $G; mkdir -p $G
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/startup TESTS=0 BENCHES=startup STARTUP_ARGS="--runs 1 --slots default,eagle_host" \
  timeout 400 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -30 $G/run.log
tar -C /tmp -cJf $OUT/gc5.tar.xz --exclude='*/models/*' gc5
