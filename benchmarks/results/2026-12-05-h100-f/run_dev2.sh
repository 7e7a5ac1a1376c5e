#!/usr/bin/env bash
# Device call 2 (2026-12-05 f): pending item 6, NGRAM page 1 c1 with `default` without the audit beside stock and stock code audited.
# topk 1 page 16 c1: the audited preset with and without it (same timers), beside stock.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gf2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
# An H100 holds three servers with a 16384-token KV pool: the audited `default` arm (run 2026-12-05 13:5x, 2026-12-05-h100-e/ngram/) is left out there.
ARMS="stock,audit,plugin,plugin-noaudit"
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] || ARMS="stock,audit,plugin-noaudit --max-total-tokens 16384"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/ngram TESTS=0 BENCHES=e2e E2E_TIMEOUT=560 \
  E2E_ARGS="--configs ngram-p1 --arms $ARMS --server-arg=--disable-prefill-cuda-graph --concurrency 1 --rounds 4 --requests 4 --ready-timeout 300 --time-budget 520" \
  timeout 575 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '1,12p' $G/ngram/e2e/e2e.md
sed -n '/^| config/,/^$/p' $G/ngram/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/ngram/e2e/e2e.md
sed -n '/^Host µs per decode step/,/^$/p' $G/ngram/e2e/e2e.md | head -45
tar -C /tmp -cJf $OUT/gf2.tar.xz --exclude='*/models/*' gf2
