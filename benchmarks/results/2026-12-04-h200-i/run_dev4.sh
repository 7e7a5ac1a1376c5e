#!/usr/bin/env bash
# Device call 4: FlashInfer STANDALONE topk 4 page 16 at concurrency 8 with the eagle_host preset (never run at c8):
# stock, default+flashinfer, the preset (less the glue graph, which conflicts with FlashInfer's host
# plans), without the audit; 2 rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g4; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi-t4-c8 TESTS=0 BENCHES=e2e E2E_TIMEOUT=530 \
  E2E_ARGS="--attention-backend flashinfer --configs standalone-t4-p16 --arms stock \
  --slots default,flashinfer,-audit --slots default,flashinfer,eagle_host,-metadata_glue_graph,-audit \
  --concurrency 8 --rounds 2 \
  --server-arg=--disable-prefill-cuda-graph" timeout 545 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g4.tar.xz --exclude='*/models/*' g4
ls -la $OUT
