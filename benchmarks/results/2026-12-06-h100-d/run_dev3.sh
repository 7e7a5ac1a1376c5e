#!/usr/bin/env bash
# Device call 3 (2026-12-06 d): eagle_step_graph with inputs keyed by layout. (a) its GPU test; (b) real
# servers, topk 1 page 16, audited: stock, stock code (audit), `default,eagle_step_graph` (no self-check),
# c1 and c8, 2 rounds, greedy token identity against stock (top-logprobs 0: requests the graph serves).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HOSTSYNC_GPU_TESTS=1
G=/tmp/gd3; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $G/gpu.txt
timeout 150 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_eagle_step_graph.py > $G/gpu_test.log 2>&1
echo "gpu test rc $?" >> $G/gpu_test.log
grep -E "passed|failed|stand-in|Error" $G/gpu_test.log | head -12
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=420 \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock,audit --slots default,eagle_step_graph --top-logprobs 0 --concurrency 1 8 --rounds 2 --ready-timeout 300 --time-budget 370" \
  timeout 470 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -12
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -A4 "without SGLang's simulated" $G/a/e2e/e2e.md | head -6
grep -h "eagle_step_graph" $G/a/e2e/*.log 2>/dev/null | cut -c1-300 | tail -12
tar -C /tmp -cJf $OUT/gd3.tar.xz --exclude='*/models/*' gd3
