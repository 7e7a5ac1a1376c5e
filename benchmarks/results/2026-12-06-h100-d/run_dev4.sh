#!/usr/bin/env bash
# Device call 4 (2026-12-06 d): tok/s/user unaudited, topk 1 page 16: stock vs `default,eagle_host` vs
# `default,eagle_step_graph`; (a) the 8B-shaped target (GPU-bound step), c1 and c8, 2 rounds;
# (b) the 1B-shaped target (host-bound step), c1, 2 rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gd4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $G/gpu.txt
COMMON="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock --slots default,eagle_host,-audit --slots default,eagle_step_graph,-audit --top-logprobs 0 --rounds 2 --ready-timeout 240"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=290 \
  E2E_ARGS="$COMMON --concurrency 1 8 --time-budget 250" timeout 320 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/b TESTS=0 BENCHES=e2e E2E_TIMEOUT=210 \
  E2E_ARGS="$COMMON --dummy-shape llama-1b --concurrency 1 --time-budget 180" timeout 240 bash scripts/gpu_run.sh > $G/run_b.log 2>&1
echo "gpu_run b rc $?" >> $G/run_b.log
for x in a b; do
  tail -1 $G/run_$x.log
  sed -n '/^| config/,/^$/p' $G/$x/e2e/e2e.md | head -9
  sed -n '/^| server/,/^$/p' $G/$x/e2e/e2e.md | head -6
done
grep -h "eagle_step_graph: .*captured\|failed" $G/*/e2e/*.log 2>/dev/null | cut -c1-200 | head -12
tar -C /tmp -cJf $OUT/gd4.tar.xz --exclude='*/models/*' gd4
