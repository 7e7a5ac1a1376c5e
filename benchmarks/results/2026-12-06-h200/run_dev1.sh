#!/usr/bin/env bash
# Device call 1 (2026-12-06): docs/gpu.md item 15, the review commit 9c9d978 on the GPU: the three NGRAM GPU test files,
# then NGRAM page 1 c1 without the audit: stock vs P = default,eagle_host,ngram_full_mask vs default,eagle_host,ngram_host.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gi1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
timeout 120 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_ngram_late_wait.py tests/test_gpu_ngram_accept_readback.py tests/test_gpu_ngram_full_mask.py > $G/gpu_tests.log 2>&1
echo "gpu tests rc $?" >> $G/gpu_tests.log
grep -E "ngram_|passed|failed|rc |Error" $G/gpu_tests.log | tail -8
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=445 \
  E2E_ARGS="--configs ngram-p1 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --arms stock --slots default,eagle_host,ngram_full_mask,-audit --slots default,eagle_host,ngram_host,-audit --rounds 5 --ready-timeout 250 --time-budget 435" \
  timeout 460 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -6
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -B2 -A8 "rounds B faster\|B / A" $G/a/e2e/e2e.md | head -24
grep -h "ngram_late_wait\|ngram_full_mask" $G/a/e2e/*ngram_host*.log | head -6
tar -C /tmp -cJf $OUT/gi1.tar.xz --exclude='*/models/*' gi1
