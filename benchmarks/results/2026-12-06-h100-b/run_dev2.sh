#!/usr/bin/env bash
# Device call 2 (2026-12-06 c): docs/gpu.md item 4 -- DFlash, 3 interleaved rounds, stock / audit / default / default without
# draft_input_reuse and event_ring (H100: --max-total-tokens 16384 for three servers on 80 GB).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gj2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/dflash TESTS=0 BENCHES=e2e E2E_TIMEOUT=560 \
  E2E_ARGS="--configs dflash-p16 --max-total-tokens 16384 --arms stock,audit,plugin --slots default,-draft_input_reuse,-event_ring --concurrency 1 --rounds 3 --ready-timeout 300 --server-arg=--disable-prefill-cuda-graph --time-budget 540" \
  timeout 580 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/dflash/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/dflash/e2e/e2e.md
tar -C /tmp -cJf $OUT/gj2.tar.xz --exclude='*/models/*' gj2
