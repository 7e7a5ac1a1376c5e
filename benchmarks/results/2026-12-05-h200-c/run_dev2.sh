#!/usr/bin/env bash
# Device call 2 (2026-12-05 c): DSpark with the 17 dspark_mega switches (pending item 4, never run)
# and NGRAM, each with the new family timers (audit_block / audit_ngram) in every audited arm.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gc2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/dspark TESTS=0 BENCHES=e2e E2E_TIMEOUT=300 \
  E2E_ARGS="--configs dspark-p16 --arms stock,audit,plugin --slots default,dspark_mega --concurrency 1 --rounds 2 --requests 4 --ready-timeout 200" \
  timeout 320 bash scripts/gpu_run.sh > $G/run_dspark.log 2>&1
echo "gpu_run rc $?" >> $G/run_dspark.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/ngram TESTS=0 BENCHES=e2e E2E_TIMEOUT=215 \
  E2E_ARGS="--configs ngram-p1 --arms stock,audit,plugin --concurrency 1 --rounds 2 --requests 4 --ready-timeout 150" \
  timeout 235 bash scripts/gpu_run.sh > $G/run_ngram.log 2>&1
echo "gpu_run rc $?" >> $G/run_ngram.log
for c in dspark ngram; do
  tail -3 $G/run_$c.log
  sed -n '/^| config/,/^$/p' $G/$c/e2e/e2e.md | head -10
  sed -n '/Host µs per decode step/,/step window/p' $G/$c/e2e/e2e.md
done
grep -h "hostsync" $G/dspark/e2e/*dspark_mega*.log | grep -i "failed\|refused\|error" | cut -c1-200 | head
grep -h -A3 "Traceback" $G/*/e2e/*.log | tail -12
tar -C /tmp -cJf $OUT/gc2.tar.xz --exclude='*/models/*' gc2
