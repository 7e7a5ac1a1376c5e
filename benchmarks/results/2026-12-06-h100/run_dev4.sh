#!/usr/bin/env bash
# Device call 4 (2026-12-06 b, as run inline): docs/gpu.md item 2, two runs (cold, then warm extension cache).
source .device-bundle-fi/setup.sh; export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gi4; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a BENCHES=startup STARTUP_ARGS="--runs 2 --slots default,eagle_host" \
  GPU_TESTS="tests/test_gpu_startup.py" timeout 400 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "rc $?" >> $G/run.log; tail -25 $G/run.log
tar -C /tmp -cJf $OUT/gi4.tar.xz gi4
