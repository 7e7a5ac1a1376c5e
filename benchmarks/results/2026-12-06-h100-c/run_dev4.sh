#!/usr/bin/env bash
# Device call 4 (2026-12-06 c): issue 16's topk-1 host work without any audit: py-spy (500 samples/s, non-blocking)
# on the schedulers of stock and `default,eagle_host` (unaudited), topk 1 page 16 c1, 4 rounds; by-line and
# by-function host time of the current preset for docs/host-work.md (the last such run: 2026-12-04, 0.817x).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gc4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
xz -dc .devwheels/py-spy.xz > /tmp/py-spy; chmod +x /tmp/py-spy
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/pyspy TESTS=0 BENCHES=e2e PYSPY_CONFIGS=standalone-t1-p16 PYSPY=/tmp/py-spy PYSPY_RATE=500 E2E_TIMEOUT=470 \
  E2E_ARGS="--configs standalone-t1-p16 --arms stock --slots default,eagle_host,-audit --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --rounds 4 --ready-timeout 330 --time-budget 420" \
  timeout 530 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/pyspy/e2e/e2e.md | head -6
sed -n '/^| server/,/^$/p' $G/pyspy/e2e/e2e.md
ls $G/pyspy/pyspy 2>/dev/null | head; du -sh $G/pyspy/pyspy 2>/dev/null
tar -C /tmp -cJf $OUT/gc4.tar.xz --exclude='*/models/*' gc4
