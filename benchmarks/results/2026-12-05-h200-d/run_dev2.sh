#!/usr/bin/env bash
# Device call 2 (2026-12-05 h): docs/gpu.md item 13, py-spy (500 samples/s, non-blocking) on the NGRAM schedulers
# without the audit: stock vs P vs P + ngram_late_wait, 4 rounds, --ready-timeout 300 (py-spy slows a cold capture).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gh2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
xz -dc .devwheels/py-spy.xz > /tmp/py-spy; chmod +x /tmp/py-spy
P=default,eagle_host,ngram_full_mask
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/pyspy TESTS=0 BENCHES=e2e PYSPY_CONFIGS=ngram-p1 PYSPY=/tmp/py-spy PYSPY_RATE=500 E2E_TIMEOUT=560 \
  E2E_ARGS="--configs ngram-p1 --arms stock --slots $P,-audit --slots $P,ngram_late_wait,-audit --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --concurrency 1 --requests 4 --rounds 4 --ready-timeout 330 --time-budget 550" \
  timeout 575 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -2 $G/run.log
sed -n '/^| config/,/^$/p' $G/pyspy/e2e/e2e.md | head -6
sed -n '/^| server/,/^$/p' $G/pyspy/e2e/e2e.md
ls $G/pyspy/pyspy 2>/dev/null | head; du -sh $G/pyspy/pyspy 2>/dev/null
tar -C /tmp -cJf $OUT/gh2.tar.xz --exclude='*/models/*' gh2
