#!/usr/bin/env bash
# Device call 3 (2026-12-05 f): NGRAM page 1 c1 with the host preset, `default,eagle_host,ngram_full_mask`
# (the glue graph is allowed under triton NGRAM): (a) audited beside stock code audited (same timers:
# audit_ngram on both), (b) without the audit beside `default` without it. Three servers each (an H100 holds three).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gf3; rm -rf $G; mkdir -p $G
# (committed as ../ngram-host/ (a) and ../ngram-host-noaudit/ (b))
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
P=default,eagle_host,ngram_full_mask
COMMON="--configs ngram-p1 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --ready-timeout 200"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=250 \
  E2E_ARGS="$COMMON --arms stock,audit --slots $P --rounds 3 --time-budget 235" \
  timeout 265 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/b TESTS=0 BENCHES=e2e E2E_TIMEOUT=270 \
  E2E_ARGS="$COMMON --arms stock,plugin-noaudit --slots $P,-audit --rounds 4 --time-budget 255" \
  timeout 285 bash scripts/gpu_run.sh > $G/run_b.log 2>&1
echo "gpu_run b rc $?" >> $G/run_b.log
for x in a b; do
  tail -2 $G/run_$x.log
  sed -n '/^| config/,/^$/p' $G/$x/e2e/e2e.md | head -6
  sed -n '/^| server/,/^$/p' $G/$x/e2e/e2e.md
done
sed -n '/^Host µs per decode step/,/^$/p' $G/a/e2e/e2e.md | head -40
tar -C /tmp -cJf $OUT/gf3.tar.xz --exclude='*/models/*' gf3
