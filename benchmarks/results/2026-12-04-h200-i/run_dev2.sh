#!/usr/bin/env bash
# Device call 2: start-up with the deferred launcher and the process roles: bench_startup.py --runs 2
# (stock vs the default slots started together, cold then warm csrc cache), then the GPU tests that
# read it (tests/test_gpu_startup.py) and the audit's GPU tests (its outputs now take a rank).
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g2; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
( while true; do echo "T $(date +%s)"; ps -eo pid,ppid,rss,etimes,args --no-headers | grep -E "sglang::|launch_server" | grep -v grep | sed -E 's/ --model-path.*(--port [0-9]+).*/ \1/'; sleep 10; done ) > $G/ps.log 2>&1 &
PSPID=$!
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/startup TESTS=1 BENCHES=startup \
  GPU_TESTS="tests/test_gpu_startup.py tests/test_gpu_audit.py" timeout 545 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
kill $PSPID
tail -8 $G/run.log
tar -C /tmp -cJf $OUT/g2.tar.xz --exclude='*/models/*' g2
ls -la $OUT
