#!/usr/bin/env bash
# Device call 2 (2026-12-06 d): eagle_step_graph's first GPU run. (a) its GPU test over the stand-in
# step; (b) real servers, topk 1 page 16: stock vs `default,eagle_step_graph` (audited) with its eager
# self-check on every replayed step, c1 and c8, greedy identity against stock.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HOSTSYNC_GPU_TESTS=1
G=/tmp/gd2; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $G/gpu.txt
timeout 150 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_eagle_step_graph.py > $G/gpu_test.log 2>&1
echo "gpu test rc $?" >> $G/gpu_test.log
tail -15 $G/gpu_test.log
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=380 \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --server-arg=--disable-prefill-cuda-graph --arms stock --slots default,eagle_step_graph --plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=1 --top-logprobs 0 --concurrency 1 8 --rounds 1 --ready-timeout 300 --time-budget 330" \
  timeout 420 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -5 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -12
grep -h "eagle_step_graph\|Traceback\|Error" $G/a/e2e/*.log 2>/dev/null | grep -v Warning | sort | uniq -c | sort -rn | head -30
grep -i "identical\|differ" $G/a/e2e/e2e.md | head -5
grep -h -A 40 "capturing the bs" $G/a/e2e/*.log | head -60
tar -C /tmp -cJf $OUT/gd2.tar.xz --exclude='*/models/*' gd2
