#!/usr/bin/env bash
# Device call 1 (2026-12-05 f): pending item 10, greedy_row_argmax's host cost against its GPU saving at
# topk 1 page 16 c1: the audited preset with and without it (same timers), beside stock.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gf1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
# An H100 (80 GB) holds three 8B-shaped servers with a 16384-token KV pool: stock code's audited arm is left out there.
ARMS="stock,audit"
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] || ARMS="stock --max-total-tokens 16384"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/t1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=560 \
  E2E_ARGS="--configs standalone-t1-p16 --arms $ARMS --slots default,eagle_host,audit_fine --slots default,eagle_host,audit_fine,-greedy_row_argmax --concurrency 1 --rounds 4 --requests 4 --ready-timeout 300 --time-budget 520" \
  timeout 575 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '1,12p' $G/t1/e2e/e2e.md
sed -n '/^| config/,/^$/p' $G/t1/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/t1/e2e/e2e.md
sed -n '/^Host µs per decode step/,/^$/p' $G/t1/e2e/e2e.md | head -45
tar -C /tmp -cJf $OUT/gf1.tar.xz --exclude='*/models/*' gf1
