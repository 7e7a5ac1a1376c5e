#!/usr/bin/env bash
# Device call 3 (2026-12-05 c): pending item 1, topk 1 page 16 c1: the eagle_host preset with audit_fine,
# without spec_kernel_replay, and with chain_tree_full_mask (opt-in); 2 interleaved rounds.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/gc3; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/t1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=470 \
  E2E_ARGS="--configs standalone-t1-p16 --arms stock,audit --slots default,eagle_host,audit_fine --slots default,eagle_host,audit_fine,-spec_kernel_replay --slots default,eagle_host,audit_fine,chain_tree_full_mask --concurrency 1 --rounds 2 --requests 4 --ready-timeout 200" \
  timeout 490 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '/^| config/,/^$/p' $G/t1/e2e/e2e.md | head -10
sed -n '/^| server/,/^$/p' $G/t1/e2e/e2e.md
sed -n '/Host µs per decode step/,/step window/p' $G/t1/e2e/e2e.md | grep -v "| -"
grep -h "chain_tree_full_mask\|spec_kernel_replay" $G/t1/e2e/*chain_tree*.log | grep -i "applied\|skipped\|failed" | cut -c1-160 | sort | uniq -c
tar -C /tmp -cJf $OUT/gc3.tar.xz --exclude='*/models/*' gc3
