#!/usr/bin/env bash
# One device call: benchmarks/step_graph_weights.py (eagle_step_graph and `auto` in real servers: weight
# update with recapture, forced capture failures, compared with stock), then a short timed e2e of `auto`
# at STANDALONE topk 1 page 16. Everything small lands in $OUT/sgw.tar.xz (gpu_out/ without $OUT).
set -u
cd "$(dirname "$0")/.."
[ -z "${DRY_RUN:-}" ] || exit 0  # scripts/device_call.sh's DRY_RUN: nothing here takes E2E_ARGS
G=/tmp/hostsync-sgw; rm -rf "$G"; mkdir -p "$G"
source "${HOSTSYNC_BUNDLE:-.device-bundle-fi}/setup.sh" > "$G/bundle.log" 2>&1 || { cat "$G/bundle.log"; exit 1; }
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$HOME/.cache/sglang}"
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=${SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND:-python}
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > "$G/digest.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$G/gpu.txt"
python3 -c "import torch, flashinfer.sampling as s; p=torch.rand(2,32000,device='cuda').softmax(-1); s.top_k_renorm_probs(p,40); s.top_p_renorm_probs(p,0.9); torch.cuda.synchronize(); print('flashinfer JIT warm')" > "$G/flashinfer_warm.log" 2>&1 &
timeout "${SGW_TIMEOUT:-330}" python3 benchmarks/step_graph_weights.py --out /tmp/sgw > "$G/sgw.json" 2> "$G/sgw.err"
echo "step_graph_weights rc $?" | tee -a "$G/sgw.err"
cat "$G/sgw.json" | head -60
for f in /tmp/sgw/*.log; do xz -9c "$f" > "$G/$(basename "$f").xz"; done
if [ "${E2E_TIMEOUT:-0}" -gt 0 ]; then
  timeout "$E2E_TIMEOUT" python3 -m sglang_hostsync_plugin.e2e --out "$G/e2e" --configs standalone-t1-p16 --arms stock \
    --slots auto,-audit --traffic off --concurrency 1 8 --rounds "${E2E_ROUNDS:-4}" --requests 2 --max-new-tokens 64 \
    --server-arg=--disable-prefill-cuda-graph --ready-timeout 200 --time-budget $((E2E_TIMEOUT - 20)) > "$G/e2e.log" 2>&1
  echo "e2e rc $?" >> "$G/e2e.log"
  sed -n '/^| config | conc | arm/,/^$/p' "$G/e2e/e2e.md" | head -12
  rm -rf "$G/e2e/models"; for f in "$G"/e2e/*.log; do [ -f "$f" ] && xz -9 "$f"; done
fi
DEST=${OUT:-gpu_out}; mkdir -p "$DEST"
tar -C /tmp -cJf "$DEST/sgw.tar.xz" hostsync-sgw
