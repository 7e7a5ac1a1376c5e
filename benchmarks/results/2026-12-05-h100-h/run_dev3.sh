#!/usr/bin/env bash
# Device call 3 (2026-12-05 h): ngram_late_wait under FlashInfer (never run there) and the new preset ngram_host in a
# real server: NGRAM page 1 c1, --attention-backend flashinfer, without the audit, stock vs
# F = default,flashinfer,eagle_host,-metadata_glue_graph plus ngram_full_mask, vs F plus ngram_host (ngram_full_mask
# and ngram_late_wait), 8 rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gh3; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
F=default,flashinfer,eagle_host,-metadata_glue_graph
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi TESTS=0 BENCHES=e2e E2E_TIMEOUT=575 \
  E2E_ARGS="--attention-backend flashinfer --configs ngram-p1 --arms stock --slots $F,ngram_full_mask,-audit --slots $F,ngram_host,-audit --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --rounds 8 --ready-timeout 450 --time-budget 565" \
  timeout 585 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/fi/e2e/e2e.md | head -6
sed -n '/^| server/,/^$/p' $G/fi/e2e/e2e.md
grep -A5 "B / A median" $G/fi/e2e/e2e.md
grep -h "ngram_late_wait\|ngram_full_mask" $G/fi/e2e/*ngram_host*.log | head -6
tar -C /tmp -cJf $OUT/gh3.tar.xz --exclude='*/models/*' gh3
