#!/usr/bin/env bash
# Device call 4 (2026-12-05 h): the same A/B under triton on the warm H100 after call 3: NGRAM page 1 c1 without the
# audit, stock vs P = default,eagle_host,ngram_full_mask vs default,eagle_host,ngram_host (P + ngram_late_wait), 10 rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gh4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
F=default,eagle_host
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi TESTS=0 BENCHES=e2e E2E_TIMEOUT=420 \
  E2E_ARGS="--configs ngram-p1 --arms stock --slots $F,ngram_full_mask,-audit --slots $F,ngram_host,-audit --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --rounds 10 --ready-timeout 300 --time-budget 400" \
  timeout 430 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/fi/e2e/e2e.md | head -6
sed -n '/^| server/,/^$/p' $G/fi/e2e/e2e.md
grep -A5 "B / A median" $G/fi/e2e/e2e.md
grep -h "ngram_late_wait\|ngram_full_mask" $G/fi/e2e/*ngram_host*.log | head -6
tar -C /tmp -cJf $OUT/gh4.tar.xz --exclude='*/models/*' gh4
