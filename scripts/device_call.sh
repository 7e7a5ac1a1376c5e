#!/usr/bin/env bash
# One call on an offline CUDA machine (the device tool) around scripts/gpu_run.sh: sources the
# FlashInfer bundle once, warms FlashInfer's sampling JIT beside the servers' start (sampled requests
# under EAGLE-family speculation call it even with --sampling-backend pytorch), runs the e2e under an
# inner timeout, then the GPU test files named in GPU_TESTS, and packs everything into one archive
# under $OUT (a call returns at most 8 files).
#   NAME=t4 E2E_TIMEOUT=480 E2E_ARGS="--configs standalone-t4-p16 ..." GPU_TESTS="tests/test_gpu_x.py" \
#     [SLOT_DISTS="flashinfer_certified_plan:hostsync_cert_slot"] bash scripts/device_call.sh
# Without $OUT (another CUDA machine) the archive goes to gpu_out/.
set -u
cd "$(dirname "$0")/.."
NAME=${NAME:-call}
# DRY_RUN=1: the e2e's launch plan for E2E_ARGS only (its arguments checked), nothing started (tests/test_device_scripts.py).
if [ -n "${DRY_RUN:-}" ]; then
  [ -z "${E2E_ARGS:-}" ] || exec python3 -m sglang_hostsync_plugin.e2e $E2E_ARGS --dry-run --out /tmp/hostsync-dry-run
  exit 0
fi
G=/tmp/hostsync-$NAME; rm -rf "$G"; mkdir -p "$G"
bash scripts/stop_stray_servers.sh "$G/strays.log"
source "${HOSTSYNC_BUNDLE:-.device-bundle-fi}/setup.sh" > "$G/bundle.log" 2>&1 || { cat "$G/bundle.log"; exit 1; }
export PYTHONPATH=$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HOSTSYNC_GPU_TESTS=1
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$HOME/.cache/sglang}"
# The bundle's Rust radix-tree core rejects torch 2.11 tensors; SGLang's Python core works.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=${SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND:-python}
# SLOT_DISTS="module:dist ...": slots not yet in the catalogue, registered for the e2e's servers through the
# third-party entry-point group (tests/helpers.py write_slot_dist) on PYTHONPATH.
for pair in ${SLOT_DISTS:-}; do
  python3 -c "import sys; from helpers import write_slot_dist; write_slot_dist(*sys.argv[1:])" \
    "$G/dist" "${pair%%:*}" "${pair#*:}" || exit 1
  case ":$PYTHONPATH:" in *":$G/dist:"*) ;; *) export PYTHONPATH=$G/dist:$PYTHONPATH ;; esac
done
find sglang_hostsync_plugin -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16 > "$G/digest.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$G/gpu.txt"
# Where the GPU sits against this machine's CPUs (a server's scheduler on the far NUMA node launches slower):
# to tell a per-server offset between same-code arms from the host's drift.
{ nvidia-smi topo -m; lscpu; echo "affinity: $(taskset -pc $$ 2>/dev/null)"; } > "$G/topo.txt" 2>&1
(python3 - > "$G/flashinfer_warm.log" 2>&1 <<'PY'
import time, torch, flashinfer.sampling as s
t = time.perf_counter()
p = torch.rand(2, 32000, device="cuda").softmax(-1)
s.top_k_renorm_probs(p, 40); s.top_p_renorm_probs(p, 0.9); torch.cuda.synchronize()
print(f"flashinfer sampling JIT ready in {time.perf_counter() - t:.1f} s")
PY
) &
# FlashInfer's attention modules, built in parallel beside the servers' load (a server waits on a module's lock
# instead of building it; serially a fresh machine spent about 220 s there, 2026-12-07-h100-g). FI_WARM_SHAPE: the
# checkpoint shape (default: E2E_ARGS's --checkpoint-shape, else small), none to skip; only where FlashInfer serves.
# warm-shape begin (tests/test_device_scripts.py runs this block)
WARM_ARGS=
case " ${E2E_ARGS:-} ${GPU_TESTS:-} " in
  *flashinfer*)
    WARM_SHAPE=${FI_WARM_SHAPE:-$(echo " ${E2E_ARGS:-} " | sed -n 's/.* --checkpoint-shape[= ]\([^ ]*\) .*/\1/p')}
    WARM_SHAPE=${WARM_SHAPE:-small}
    # NGRAM configurations alone: no draft model, so no draft-decode module
    case " $(echo " ${E2E_ARGS:-} " | sed -n 's/.* --configs[= ]\([^ ]*\) .*/\1/p' | tr , ' ') " in
      "  ") ;;
      *" "[!n]*|*" "n[!g]*) ;;
      *) WARM_ARGS="--speculative-algorithm NGRAM" ;;
    esac ;;
  *) WARM_SHAPE=${FI_WARM_SHAPE:-none} ;;
esac
# warm-shape end
if [ "$WARM_SHAPE" != none ]; then
  # --max-jobs 4: five modules' ninja builds at once, about 20 nvcc jobs on 16 cores, not 27 (memory)
  { timeout 420 python3 scripts/flashinfer_attention_warm.py --shape "$WARM_SHAPE" $WARM_ARGS --max-jobs 4
    echo "warm-up rc $?"; } > "$G/flashinfer_attn_warm.log" 2>&1 &
fi
# PYSPY_CONFIGS (gpu_run.sh's line-level scheduler profiles): py-spy travels xz'd in .devwheels/ (carry it).
if [ -n "${PYSPY_CONFIGS:-}" ] && [ -z "${PYSPY:-}" ]; then
  if [ -f .devwheels/py-spy.xz ]; then
    xz -dc .devwheels/py-spy.xz > /tmp/py-spy && chmod +x /tmp/py-spy && export PYSPY=/tmp/py-spy
  elif ! command -v py-spy > /dev/null; then
    echo "PYSPY_CONFIGS is set but no py-spy: carry .devwheels/ with py-spy.xz (no profile this call)" | tee "$G/pyspy_missing.txt"
  fi
fi
if [ -n "${E2E_ARGS:-}" ]; then
  HOSTSYNC_BUNDLE=/nonexistent OUT=$G/run TESTS=0 BENCHES=e2e E2E_TIMEOUT=${E2E_TIMEOUT:-480} \
    timeout $(( ${E2E_TIMEOUT:-480} + 45 )) bash scripts/gpu_run.sh > "$G/gpu_run.log" 2>&1
  echo "gpu_run rc $?" >> "$G/gpu_run.log"
  tail -1 "$G/gpu_run.log"
  sed -n '/^## Real traffic/,/^| config/p' "$G/run/e2e/e2e.md" | head -30
  sed -n '/^| config/,/^$/p' "$G/run/e2e/e2e.md" | head -20
  grep -h "e2e\] .*\(FAILED\|DIED\|real-traffic failures\|checkpoints ready\)" "$G/gpu_run.log" | cut -c1-400 | head
fi
# The GPU tests start beside the warm-up too (its build holds FlashInfer's lock; a server that needs the module waits
# on it instead of building it again): waiting first cost a fresh machine's GPU tests 90 s (2026-12-07-h100-g).
if [ -n "${GPU_TESTS:-}" ]; then
  timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -rs -s -p no:cacheprovider $GPU_TESTS > "$G/gpu_tests.log" 2>&1
  echo "gpu tests rc $?" >> "$G/gpu_tests.log"
  grep -E "passed|failed|error" "$G/gpu_tests.log" | tail -5
fi
wait
cat "$G/flashinfer_warm.log" | tail -2
tail -2 "$G/flashinfer_attn_warm.log" 2>/dev/null
# The FlashInfer modules this call's servers built or found (their names carry the JIT parameters): what a warm-up
# of the attention modules beside the servers' load would have to build.
find "$FLASHINFER_WORKSPACE_BASE" -name '*.so' -printf '%TT %s %p\n' 2>/dev/null | sort > "$G/flashinfer_jit.txt"
DEST=${OUT:-gpu_out}; mkdir -p "$DEST"
tar -C /tmp -cJf "$DEST/$NAME.tar.xz" --exclude='*/models/*' --exclude='*.trace.tsv' "hostsync-$NAME"
