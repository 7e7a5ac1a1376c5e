#!/usr/bin/env bash
# Builds .device-bundle-fi/: the device bundle (../shared/device/build_bundle.sh) plus
# flashinfer-python 0.7.2, trimmed so both travel in one 64 MiB device call.
#
#   bash scripts/build_flashinfer_bundle.sh          # needs .device-bundle/ (build it first)
#   HOSTSYNC_BUNDLE=.device-bundle-fi bash scripts/gpu_run.sh ...   # on the device, carry .device-bundle-fi
#
# Trimmed from the bundle (never imported by a text-only `sglang.launch_server`): jedi (IPython
# imports it lazily), sglang/multimodal_gen, the Rust extensions _bench, _grpc, _multimodal, sgl_kernel's
# InfLLM-V2 extension (a CPython 3.10 build, loaded only by that backend's lazy loader) and zstandard's cffi
# backend (its C backend loads first); the tracked tree and the bundle must stay under one call's 64 MiB.
# Trimmed from FlashInfer: the sources of its non-attention JIT families (csrc/ subfolders:
# MoE, GEMM, Blackwell, DSV4, ...), CUTLASS/CCCL examples, tests and docs, and kernel-selection
# JSON artifacts. What stays: every .py file, csrc/ top-level sources and templates (the
# FA2 / FA3 prefill and decode families SGLang's flashinfer backend builds), include/,
# cutlass/include, cutlass/tools/util, cccl/{cub,libcudacxx,thrust}. Its kernels compile with the machine's nvcc on first use.
# One edit: cute_dsl.is_cute_dsl_available() returns False. The bundle's cutlass is a
# permissive stand-in (stubs/), which FlashInfer would otherwise take for the CuTe DSL and
# import its Blackwell kernels at `import flashinfer` (they fail on the stand-in).
set -euo pipefail
SRC=${1:-.device-bundle}
DEST=${2:-.device-bundle-fi}
FI=flashinfer-python==0.7.2
[ -f "$SRC/site.tar.xz" ] || { echo "no $SRC/site.tar.xz: run bash ../shared/device/build_bundle.sh first" >&2; exit 1; }
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d "$STAGE/whl" "$FI"
mkdir -p "$STAGE/fi" "$STAGE/site" "$DEST"
unzip -q "$STAGE"/whl/flashinfer_python-*.whl -d "$STAGE/fi.full"
( cd "$STAGE/fi.full" && tar cf - --exclude='flashinfer/data/csrc/*/*' \
    --exclude='flashinfer/data/cutlass/examples' --exclude='flashinfer/data/cutlass/test' \
    --exclude='flashinfer/data/cutlass/tools/[!u]*' --exclude='flashinfer/data/cutlass/python' \
    --exclude='flashinfer/data/cccl/python' --exclude='flashinfer/data/cccl/benchmarks' \
    --exclude='flashinfer/data/cccl/ci' --exclude='flashinfer/data/cccl/docs' \
    --exclude='*/artifacts/*' --exclude='__pycache__' flashinfer flashinfer_python-*.dist-info ) \
  | tar xf - -C "$STAGE/fi"
python3 - "$STAGE/fi/flashinfer/cute_dsl/availability.py" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read(); head = "def is_cute_dsl_available() -> bool:\n"
assert head in s, "flashinfer changed: is_cute_dsl_available not found"
open(p, "w").write(s.replace(head, head + "    return False  # hostsync device bundle: cutlass is a stand-in\n", 1))
PY
tar xJf "$SRC/site.tar.xz" -C "$STAGE/site"
rm -rf "$STAGE"/site/jedi "$STAGE"/site/sglang/multimodal_gen \
  "$STAGE"/site/sglang/srt/rust_extensions/_{bench,grpc,multimodal}.*.so \
  "$STAGE"/site/sgl_kernel/infllm_ops.*.so "$STAGE"/site/zstandard/_cffi.*.so
echo "packing (xz, a few minutes on 2 cores) ..."
tar -C "$STAGE/fi" -cf - . | xz -T0 -9 > "$DEST/flashinfer.tar.xz"
if [ "${FI_ONLY:-0}" != 1 ] || [ ! -f "$DEST/site.tar.xz" ]; then  # FI_ONLY=1: keep an existing trimmed site
  tar -C "$STAGE/site" -cf - . | xz -T0 -9 > "$DEST/site.tar.xz"
fi
rm -rf "$DEST/stubs"; cp -r "$SRC/stubs" "$DEST/stubs"
cp "$SRC/setup.sh" "$DEST/setup.base.sh"
cat > "$DEST/setup.sh" <<'EOF'
# Source on the CUDA machine: the bundle's setup, then FlashInfer into the same /tmp/site.
_fb=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$_fb/setup.base.sh" || return 1
if [ ! -f /tmp/site/.flashinfer-ok ]; then
  tar -xJf "$_fb/flashinfer.tar.xz" -C /tmp/site && touch /tmp/site/.flashinfer-ok
fi
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -8
EOF
echo "$DEST: $(du -sh "$DEST" | cut -f1) (carry it with the checkout; source $DEST/setup.sh)"
