#!/usr/bin/env bash
# Device call 1 (2026-12-06 c): the README's headline rows with HEAD (d73dcb4): topk 4 and topk 1, page 16,
# c1 and c8, stock / `default` / `default,eagle_host`, all unaudited, 2 rounds; also the e2e's KV check
# (b29ca18, 9b7946f) against a real /server_info.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gc1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $G/gpu.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=490 \
  E2E_ARGS="--configs standalone-t4-p16,standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock,plugin-noaudit --slots default,eagle_host,-audit --concurrency 1 8 --rounds 2 --ready-timeout 300 --time-budget 430" \
  timeout 540 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -12
grep -iE "restart|kv pool|max_total|too small" $G/a/e2e/e2e.md | head -8
tar -C /tmp -cJf $OUT/gc1.tar.xz --exclude='*/models/*' gc1
