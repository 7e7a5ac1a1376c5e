#!/usr/bin/env bash
# Device call 2 (2026-12-06 b): docs/gpu.md item 10 (H100 form, runs on either card) -- greedy_row_argmax at topk 1
# page 16 c1 without the audit: stock, the preset, the preset less greedy_row_argmax; tok/s/user round by round.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gi2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $G/gpu.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=${E2E_T:-540} \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock --slots default,eagle_host,-audit --slots default,eagle_host,-greedy_row_argmax,-audit --concurrency 1 --requests 4 --rounds 6 --ready-timeout 300 --time-budget $(( ${E2E_T:-540} - 20 ))" \
  timeout $(( ${E2E_T:-540} + 20 )) bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -A12 "B / A" $G/a/e2e/e2e.md | head -20
tar -C /tmp -cJf $OUT/gi2.tar.xz --exclude='*/models/*' gi2
