#!/usr/bin/env bash
# Device call 3 (2026-12-06 b, as run inline): docs/gpu.md item 2 with `--runs 1` as written there, and the audit's GPU tests.
# The startup test needs two runs (cold and warm): call 4 reran it with `--runs 2`.
source .device-bundle-fi/setup.sh; export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gi3; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a BENCHES=startup STARTUP_ARGS="--runs 1 --slots default,eagle_host" \
  GPU_TESTS="tests/test_gpu_startup.py tests/test_gpu_audit.py" timeout 440 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "rc $?" >> $G/run.log; tail -40 $G/run.log
tar -C /tmp -cJf $OUT/gi3.tar.xz gi3
