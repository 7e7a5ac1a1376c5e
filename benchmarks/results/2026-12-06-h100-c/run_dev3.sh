#!/usr/bin/env bash
# Device call 3 (2026-12-06 c): topk 1 page 16, is `default` (only `event_ring` applies there) slower than stock?
# Call 1 read 0.994x at c1 (both rounds) and 0.991x at c8. stock / `default` / `default,-event_ring` (nothing applied),
# all unaudited, c1 and c8, 6 rounds; the server table now shows each KV pool from /server_info.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gc3; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $G/gpu.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=490 \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock,plugin-noaudit --slots default,-event_ring,-audit --concurrency 1 8 --rounds 6 --ready-timeout 300 --time-budget 430" \
  timeout 540 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -12
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
sed -n '/^| config | conc | A/,/^$/p' $G/a/e2e/e2e.md
grep -iE "restart|kv pool|max_total|too small" $G/a/e2e/e2e.md | head -8
tar -C /tmp -cJf $OUT/gc3.tar.xz --exclude='*/models/*' gc3
