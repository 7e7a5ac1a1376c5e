#!/usr/bin/env bash
# Device call 2: FlashInfer topk 1 page 16 c1 with the eagle_host preset (never run under FlashInfer before).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g2; mkdir -p $G
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi-eagle-host-t1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=545 \
  E2E_ARGS="--attention-backend flashinfer --configs standalone-t1-p16 --arms stock \
  --slots default,flashinfer,-audit --slots default,flashinfer,eagle_host,-metadata_glue_graph,-audit \
  --slots default,flashinfer,eagle_host,-metadata_glue_graph --concurrency 1 --rounds 3 \
  --server-arg=--disable-prefill-cuda-graph" timeout 565 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g2.tar.xz --exclude='*/models/*' g2
ls -la $OUT
