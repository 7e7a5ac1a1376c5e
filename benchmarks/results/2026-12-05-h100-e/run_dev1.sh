#!/usr/bin/env bash
# Device call 1 (2026-12-05 e): pending item 9, issue 16's topk 1 host-work ratio with audit_fine on
# both audited sides (stock code's `audit` arm and the preset arm), beside the preset without the audit (its tok/s/user).
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
G=/tmp/ge1; rm -rf $G; mkdir -p $G
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $G/digest.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $G/gpu.txt
# An H100 (80 GB) holds three 8B-shaped servers with a 16384-token KV pool: the unaudited preset is left out there.
EXTRA="--slots default,eagle_host,-audit"
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] || EXTRA="--max-total-tokens 16384"
HOSTSYNC_BUNDLE=/nonexistent OUT=$G/t1 TESTS=0 BENCHES=e2e E2E_TIMEOUT=560 \
  E2E_ARGS="--configs standalone-t1-p16 --arms stock,audit --slots default,eagle_host,audit_fine $EXTRA --concurrency 1 --rounds 3 --requests 4 --ready-timeout 300 --time-budget 520" \
  timeout 575 bash scripts/gpu_run.sh > $G/run.log 2>&1
echo "gpu_run rc $?" >> $G/run.log
tail -3 $G/run.log
sed -n '1,12p' $G/t1/e2e/e2e.md
sed -n '/^| config/,/^$/p' $G/t1/e2e/e2e.md | head -8
sed -n '/^| server/,/^$/p' $G/t1/e2e/e2e.md
sed -n '/Phases of/,/^$/p' $G/t1/e2e/e2e.md | head -40
tar -C /tmp -cJf $OUT/ge1.tar.xz --exclude='*/models/*' ge1
