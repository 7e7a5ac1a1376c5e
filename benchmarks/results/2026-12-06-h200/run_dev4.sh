#!/usr/bin/env bash
# Device call 4 (2026-12-06): the 1B-shaped target (host-bound) at topk 1 page 16 c1 on the same warm H200: stock and the preset unaudited, 8 rounds (call 3 had a wide round spread)

set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gi4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=270 \
  E2E_ARGS="--configs standalone-t1-p16 --dummy-shape llama-1b --arms stock --slots default,eagle_host,-audit --concurrency 1 --requests 4 --rounds 8 --ready-timeout 200 --time-budget 250" \
  timeout 285 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -A6 "host stalls (misses" $G/a/e2e/e2e.md | tail -5
tar -C /tmp -cJf $OUT/gi4.tar.xz --exclude='*/models/*' gi4
