#!/usr/bin/env bash
# Device call 1 (2026-12-05 g): pending item 11 (tests/test_gpu_audit.py with the markers' slack share), then
# item 12: stock EAGLE v2 attribution with the GPU markers, STANDALONE topk 1 and topk 4 page 16, c1.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gg1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
timeout 100 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_audit.py > $G/gpu_tests.log 2>&1
echo "gpu tests rc $?" >> $G/gpu_tests.log
grep -E "marks=|ahead:|passed|failed|rc " $G/gpu_tests.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/eagle-marks TESTS=0 BENCHES=e2e E2E_TIMEOUT=440 \
  E2E_ARGS="--configs standalone-t1-p16,standalone-t4-p16 --arms stock,audit --slots default,eagle_host,audit_fine --plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 --max-total-tokens 16384 --concurrency 1 --rounds 2 --requests 4 --ready-timeout 260 --time-budget 420" \
  timeout 450 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/eagle-marks/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/eagle-marks/e2e/e2e.md
grep -A36 "^Host µs per decode step" $G/eagle-marks/e2e/e2e.md | head -80
tar -C /tmp -cJf $OUT/gg1.tar.xz --exclude='*/models/*' gg1
