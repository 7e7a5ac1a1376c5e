#!/usr/bin/env bash
# Device call 5 (2026-12-06 d): eagle_step_graph's final code. (a) its GPU test; (b) real servers, topk 1
# page 16: stock vs `default,eagle_step_graph` (audited) with the eager self-check on every replayed step,
# c1, c4 and c8 (batch sizes 1-8 and their input layouts), greedy token identity against stock.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HOSTSYNC_GPU_TESTS=1
G=/tmp/gd5; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $G/gpu.txt
timeout 100 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_eagle_step_graph.py > $G/gpu_test.log 2>&1
echo "gpu test rc $?" >> $G/gpu_test.log
grep -E "passed|failed|stand-in|Error" $G/gpu_test.log | head -12
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=300 \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock --slots default,eagle_step_graph --plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=1 --top-logprobs 0 --concurrency 1 4 8 --rounds 1 --ready-timeout 240 --time-budget 260" \
  timeout 330 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -1 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -9
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md | head -5
grep -h "eagle_step_graph" $G/a/e2e/*.log 2>/dev/null | grep -v "applied\|enabled\|SLOTS" | cut -c1-260 | tail -24
tar -C /tmp -cJf $OUT/gd5.tar.xz --exclude='*/models/*' gd5
