#!/usr/bin/env bash
# Device call 1: the process roles in real servers. STANDALONE topk 4 page 16 c1, 2 rounds: stock,
# the eagle_host preset audited and not; every 10 s the RSS of each server's processes (ps), to
# compare the plugin servers' detokenizers with stock's.
set -u
source .device-bundle/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g1; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
( while true; do echo "T $(date +%s)"; ps -eo pid,ppid,rss,etimes,args --no-headers | grep -E "sglang::|launch_server" | grep -v grep | cut -c1-400; sleep 10; done ) > $G/ps.log 2>&1 &
PSPID=$!
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/roles-t4 TESTS=0 BENCHES=e2e E2E_TIMEOUT=520 \
  E2E_ARGS="--configs standalone-t4-p16 --arms stock --slots default,eagle_host --slots default,eagle_host,-audit \
  --concurrency 1 --rounds 2" timeout 540 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
kill $PSPID
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g1.tar.xz --exclude='*/models/*' g1
ls -la $OUT
