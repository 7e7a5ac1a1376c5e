#!/usr/bin/env bash
# Device call 2 (2026-12-05 e): pending items 6 and 8, NGRAM settled (4 arms, prefill graphs off so the
# servers come up inside the ready timeout) with the audit's seq_lens_resolve phase in both audited arms.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/ge2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
ARMS=stock,audit,plugin,plugin-noaudit
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] || ARMS=stock,audit,plugin
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/ngram TESTS=0 BENCHES=e2e E2E_TIMEOUT=480 \
  E2E_ARGS="--configs ngram-p1 --arms $ARMS --concurrency 1 --rounds 4 --requests 4 --ready-timeout 300 --server-arg=--disable-prefill-cuda-graph --max-total-tokens 16384 --time-budget 440" \
  timeout 495 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '1,12p' $G/ngram/e2e/e2e.md
sed -n '/^| config/,/^$/p' $G/ngram/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/ngram/e2e/e2e.md
sed -n '/Phases of/,/^$/p' $G/ngram/e2e/e2e.md | head -30
tar -C /tmp -cJf $OUT/ge2.tar.xz --exclude='*/models/*' ge2
