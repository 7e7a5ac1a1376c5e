#!/usr/bin/env bash
# Device call 2 (2026-12-05 b): the first DFlash real servers, with FlashInfer (.device-bundle-fi):
# SGLang's DFlash worker prewarms its sampling path (top_p_renorm_prob), which imports flashinfer.
# Prefill CUDA graphs off in every arm: their 58 shapes took the start past 170 s in the first try.
set -u
G=/tmp/g2; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=.device-bundle-fi OUT=$G/dflash TESTS=0 BENCHES=e2e E2E_TIMEOUT=400 \
  E2E_ARGS="--configs dflash-p16 --arms stock,audit,plugin --concurrency 1 --rounds 1 --ready-timeout 300 --server-arg=--disable-prefill-cuda-graph" \
  timeout 420 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -32 $G/run.log
grep -h "hostsync" $G/dflash/e2e/dflash-p16__plugin.log | grep -i "applied\|refused\|error\|digest" | cut -c1-200 | head
grep -h -A3 "Traceback" $G/dflash/e2e/*.log | tail -20
tar -C /tmp -cJf $OUT/g2.tar.xz --exclude='*/models/*' g2
