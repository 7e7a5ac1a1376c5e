#!/usr/bin/env bash
# Device call 3 (2026-12-05 g): tests/test_gpu_ngram_late_wait.py after its fix (step 0 allocates the pinned
# mirrors as a server's first NGRAM step does), beside the readback's GPU test.
set -u
source .device-bundle-fi/setup.sh
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} HOSTSYNC_GPU_TESTS=1 PYTHONUNBUFFERED=1
mkdir -p $OUT/gg3
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > $OUT/gg3/digest.txt
timeout 90 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_gpu_ngram_late_wait.py tests/test_gpu_ngram_accept_readback.py > $OUT/gg3/gpu_tests.log 2>&1
echo "gpu tests rc $?" >> $OUT/gg3/gpu_tests.log
tail -5 $OUT/gg3/gpu_tests.log; grep -E "ngram_" $OUT/gg3/gpu_tests.log
