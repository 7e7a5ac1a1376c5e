#!/usr/bin/env bash
# Device call 2 (2026-12-05 g): the new opt-in slot ngram_late_wait. GPU tests (late wait, readback), then NGRAM
# page 1 c1: (a) unaudited, stock vs the host preset vs the preset + ngram_late_wait, 6 rounds; (b) audited with the
# GPU markers, the same two plugin arms beside stock, 3 rounds (the servers start warm after (a)).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gg2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
timeout 90 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_ngram_late_wait.py tests/test_gpu_ngram_accept_readback.py > $G/gpu_tests.log 2>&1
echo "gpu tests rc $?" >> $G/gpu_tests.log
grep -E "ngram_|passed|failed|rc |Error" $G/gpu_tests.log | tail -8
P=default,eagle_host,ngram_full_mask
COMMON="--configs ngram-p1 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=300 \
  E2E_ARGS="$COMMON --arms stock --slots $P,-audit --slots $P,ngram_late_wait,-audit --rounds 6 --ready-timeout 260 --time-budget 290" \
  timeout 310 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/b TESTS=0 BENCHES=e2e E2E_TIMEOUT=170 \
  E2E_ARGS="$COMMON --arms stock --slots $P --slots $P,ngram_late_wait --plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 --rounds 3 --ready-timeout 150 --time-budget 160" \
  timeout 180 bash scripts/gpu_run.sh > $G/run_b.log 2>&1
echo "gpu_run b rc $?" >> $G/run_b.log
for x in a b; do
  tail -2 $G/run_$x.log
  sed -n '/^| config/,/^$/p' $G/$x/e2e/e2e.md | head -6
  sed -n '/^| server/,/^$/p' $G/$x/e2e/e2e.md
done
grep -A40 "^Host µs per decode step" $G/b/e2e/e2e.md | head -44
grep -A4 "^Sync sites" $G/b/e2e/e2e.md
grep -h "ngram_late_wait" $G/*/e2e/*late_wait*.log | head -4
tar -C /tmp -cJf $OUT/gg2.tar.xz --exclude='*/models/*' gg2
