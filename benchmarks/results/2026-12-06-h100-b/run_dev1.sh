#!/usr/bin/env bash
# Device call 1 (2026-12-06 c): docs/gpu.md item 17 -- the audit pass in Scheduler.on_idle (8fd439e) in a real server:
# topk 1 page 16 c1, stock / stock code audited / the preset audited, every step timed (item 16 call again).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
G=/tmp/gj1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $G/gpu.txt
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/a TESTS=0 BENCHES=e2e E2E_TIMEOUT=540 \
  E2E_ARGS="--configs standalone-t1-p16 --max-total-tokens 16384 --arms stock,audit --slots default,eagle_host --plugin-env SGLANG_HOSTSYNC_AUDIT_PHASE_EVERY=1 --concurrency 1 --requests 4 --rounds 3 --ready-timeout 300 --time-budget 520" \
  timeout 560 bash scripts/gpu_run.sh > $G/run_a.log 2>&1
echo "gpu_run a rc $?" >> $G/run_a.log
tail -2 $G/run_a.log
sed -n '/^| config/,/^$/p' $G/a/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/a/e2e/e2e.md
grep -B2 -A30 "first decode step after a prefill by phase" $G/a/e2e/e2e.md | head -45
grep -rh --include="*.log" -E "audit +(applied|refused)|slot audit|audit: " $G/a 2>/dev/null | sort | uniq -c | head -8
tar -C /tmp -cJf $OUT/gj1.tar.xz --exclude='*/models/*' gj1
