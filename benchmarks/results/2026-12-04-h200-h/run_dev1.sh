#!/usr/bin/env bash
# Device call 1: FlashInfer topk 4 page 16 c1 with the eagle_host preset (never run under FlashInfer before).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g1; mkdir -p $G
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi-eagle-host-t4 TESTS=0 BENCHES=e2e E2E_TIMEOUT=545 \
  E2E_ARGS="--attention-backend flashinfer --configs standalone-t4-p16 --arms stock \
  --slots default,flashinfer,-audit --slots default,flashinfer,eagle_host,-metadata_glue_graph,-audit \
  --slots default,flashinfer,eagle_host,-metadata_glue_graph --concurrency 1 --rounds 2 \
  --server-arg=--disable-prefill-cuda-graph" timeout 565 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g1.tar.xz --exclude='*/models/*' g1
ls -la $OUT
