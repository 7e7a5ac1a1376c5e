#!/usr/bin/env bash
# Device call 1 (2026-12-05 c): DFlash repeated A/B (docs/gpu.md pending item 4) with the new
# audit_block timers in every audited arm (the e2e adds them): stock / stock code audited /
# default audited / default without its two DFlash slots, 3 interleaved rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gc1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/dflash TESTS=0 BENCHES=e2e E2E_TIMEOUT=530 \
  E2E_ARGS="--configs dflash-p16 --arms stock,audit,plugin --slots default,-draft_input_reuse,-event_ring --concurrency 1 --rounds 3 --requests 4 --ready-timeout 300 --server-arg=--disable-prefill-cuda-graph" \
  timeout 560 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
sed -n '/^| config/,/^$/p' $G/dflash/e2e/e2e.md | head -12
sed -n '/Host µs per decode step/,/step window/p' $G/dflash/e2e/e2e.md
grep -h "audit_block\|draft_input_reuse\|event_ring" $G/dflash/e2e/*plugin*.log | grep -i "applied\|skipped\|failed" | cut -c1-200 | sort | uniq -c | head
tar -C /tmp -cJf $OUT/gc1.tar.xz --exclude='*/models/*' gc1
