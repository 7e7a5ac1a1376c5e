#!/usr/bin/env bash
# Device call 4 (2026-12-05 c): call 3's preset arm failed to start (five servers started together;
# SGLang's memory profile saw another server's weights load: "Loaded weights leave no GPU memory for
# the KV cache"). Again with four arms: the preset with audit_fine, with and without chain_tree_full_mask.
# Then pending item 1's bench rows (bench_replay_launch.py --rounds 2).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gc4; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/t1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=330 \
  E2E_ARGS="--configs standalone-t1-p16 --arms stock,audit --slots default,eagle_host,audit_fine --slots default,eagle_host,audit_fine,chain_tree_full_mask --concurrency 1 --rounds 3 --requests 4 --ready-timeout 200" \
  timeout 345 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '/^| config/,/^$/p' $G/t1/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/t1/e2e/e2e.md
sed -n '/Phases of/,/^$/p' $G/t1/e2e/e2e.md | head -40
timeout 150 python3 benchmarks/bench_replay_launch.py --rounds 2 > $G/bench_replay_launch.txt 2>&1
echo "bench rc $?" >> $G/bench_replay_launch.txt
tail -40 $G/bench_replay_launch.txt
tar -C /tmp -cJf $OUT/gc4.tar.xz --exclude='*/models/*' gc4
