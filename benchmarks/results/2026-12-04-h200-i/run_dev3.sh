#!/usr/bin/env bash
# Device call 3: FlashInfer NGRAM page 1 c1 with the eagle_host preset (never run under FlashInfer):
# stock, default+flashinfer, the preset (less the glue graph, which conflicts with FlashInfer's host
# plans) with and without the audit; 2 rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/g3; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/fi-ngram TESTS=0 BENCHES=e2e E2E_TIMEOUT=540 \
  E2E_ARGS="--attention-backend flashinfer --configs ngram-p1 --arms stock \
  --slots default,flashinfer,-audit --slots default,flashinfer,eagle_host,-metadata_glue_graph,-audit \
  --slots default,flashinfer,eagle_host,-metadata_glue_graph --concurrency 1 --rounds 2 \
  --server-arg=--disable-prefill-cuda-graph" timeout 555 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -5 $G/run.log
tar -C /tmp -cJf $OUT/g3.tar.xz --exclude='*/models/*' g3
ls -la $OUT
