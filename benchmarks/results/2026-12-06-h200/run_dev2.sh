#!/usr/bin/env bash
# Device call 2 (2026-12-06): topk 1 page 16 c1 on the same warm H200: stock, stock code audited, the preset
# audited and unaudited; every step timed (SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY=1) for the first decode step after a prefill.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gi2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=540 \
  E2E_ARGS="--configs standalone-t1-p16 --arms stock,audit --slots default,eagle_host --slots default,eagle_host,-audit --plugin-env SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY=1 --concurrency 1 --requests 4 --rounds 4 --ready-timeout 300 --time-budget 520" \
  timeout 560 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -A6 "host stalls (misses" $G/a/e2e/e2e.md | tail -5
tar -C /tmp -cJf $OUT/gi2.tar.xz --exclude='*/models/*' gi2
