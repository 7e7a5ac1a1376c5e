#!/usr/bin/env bash
# Device call 4 (2026-12-05 f): the audit's GPU markers (SGLANG_HOSTSYNC_AUDIT_MARKS=1): tests/test_gpu_audit.py,
# then NGRAM page 1 c1 with the markers in both audited arms (stock code, the host preset), beside stock.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gf4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
timeout 100 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_audit.py > $G/gpu_tests.log 2>&1
echo "gpu tests rc $?" >> $G/gpu_tests.log
grep -E "marks=|ahead:|passed|failed|rc " $G/gpu_tests.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/ngram-marks TESTS=0 BENCHES=e2e E2E_TIMEOUT=320 \
  E2E_ARGS="--configs ngram-p1 --arms stock,audit --slots default,eagle_host,ngram_full_mask --plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --rounds 2 --requests 4 --ready-timeout 240 --time-budget 300" \
  timeout 330 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/ngram-marks/e2e/e2e.md | head -6
grep -A32 "^Host µs per decode step" $G/ngram-marks/e2e/e2e.md
tar -C /tmp -cJf $OUT/gf4.tar.xz --exclude='*/models/*' gf4
