#!/usr/bin/env bash
# The one prepared check for a GPU machine (one NVIDIA GPU, a CUDA PyTorch, nvcc, CMake, ninja, no
# package registry), in one call of well under 9 minutes on 16 cores:
#   1. what the machine has (GPU, driver, torch and its CUDA, nvcc, CMake);
#   2. the build dependencies the image lacks, from the Debian packages in .gpu-debs/ (made on a
#      machine with a registry by scripts/gpu_deps.sh; git-ignored, so it must be copied or
#      carried to the GPU machine with the tree), unpacked into a private prefix;
#   3. the CUDA build (-DFSDP_WITH_CUDA=ON against the installed torch) into build-gpu/;
#   4. the GPU tests (ctest label gpu: the NCCL backend's ops against closed forms, and a sharded
#      model's steps on the GPU against the same steps on the CPU);
#   5. a report: REPORT_DIR/gpu_check.md (each phase, its time and result) and the logs.
# Usage: scripts/gpu_check.sh [REPORT_DIR]      (default out/gpu-check)
# Exit status: 0 when every phase passed; the first failing phase's status otherwise (the report
# is written in both cases). A test that finds no GPU skips, and the report says so.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR=${1:-out/gpu-check}
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/gpu_check.md"
PY=${FSDP_TORCH_PYTHON:-python3}
BUILD=${FSDP_GPU_BUILD_DIR:-build-gpu}
DEPS=${FSDP_GPU_DEPS_PREFIX:-/tmp/fsdp-gpu-deps}
t0=$(date +%s)
rc_all=0
echo "# GPU check" >"$REPORT"
echo >>"$REPORT"
echo "| phase | result | s |" >>"$REPORT"
echo "|---|---|---|" >>"$REPORT"

# phase NAME LOG CMD...: runs CMD with its output in REPORT_DIR/LOG, one report row.
phase() {
  local name=$1 log=$2; shift 2
  local start rc=0; start=$(date +%s)
  echo "[gpu-check] $name ..."
  "$@" >"$REPORT_DIR/$log" 2>&1 || rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" = 0 ]; then
    echo "| $name | ok | $took |" >>"$REPORT"
  else
    echo "| $name | FAILED (exit $rc; $log) | $took |" >>"$REPORT"
    tail -n 30 "$REPORT_DIR/$log"
    [ "$rc_all" = 0 ] && rc_all=$rc
  fi
  echo "[gpu-check] $name: exit $rc, ${took} s"
  return "$rc"
}

machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
EOF
  local nvcc; nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
  if [ -x "$nvcc" ]; then echo "nvcc $nvcc: $("$nvcc" --version | tail -n 1)"; else echo "no nvcc"; fi
  cmake --version | head -n 1
  echo "cores $(nproc)"
}

# Unpacks .gpu-debs/*.deb into DEPS (no root needed, nothing outside DEPS changes) and makes their
# CMake configurations relocatable (Gloo's names its library by an absolute /usr path).
dependencies() {
  local debs=(.gpu-debs/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    echo "no .gpu-debs/*.deb: run scripts/gpu_deps.sh on a machine with a package registry first" >&2
    return 3
  fi
  rm -rf "$DEPS" && mkdir -p "$DEPS" || return 3
  for f in "${debs[@]}"; do dpkg-deb -x "$f" "$DEPS" || return 3; done
  sed -i 's#"/usr/lib/#"${_IMPORT_PREFIX}/lib/#g' "$DEPS"/usr/share/cmake/Gloo/GlooTargets-*.cmake || return 3
  ls "$DEPS/usr/share/cmake" "$DEPS/usr/lib/x86_64-linux-gnu/cmake"
}

build() {
  export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS"
  export CMAKE_PREFIX_PATH="$DEPS/usr:$DEPS/usr/lib/x86_64-linux-gnu/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"  # the environment form: colons
  FSDP_TORCH_PYTHON=$(command -v "$PY") FSDP_CUDA_BUILD_DIR=$BUILD bash scripts/build_cuda.sh
}

gpu_tests() {
  # A test that needs no more GPUs than nvidia-smi lists fails, not skips, when it cannot see them.
  local gpus; gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  (cd "$BUILD" && FSDP_REQUIRE_GPUS=${gpus:-0} ctest -L gpu --output-on-failure --timeout 300 -V)
}

phase "machine" machine.log machine
cat "$REPORT_DIR/machine.log"
# What the build and the tests load from the private prefix (libgloo needs hiredis and libibverbs).
export PATH="$DEPS/usr/bin:$PATH"  # pkg-config, where the image has none
export LD_LIBRARY_PATH="$DEPS/usr/lib:$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
phase "dependencies (.gpu-debs)" deps.log dependencies &&
  phase "CUDA build ($BUILD)" build.log build &&
  phase "GPU tests (ctest -L gpu)" gpu_tests.log gpu_tests
{
  echo
  echo "Machine:"
  echo
  sed 's/^/    /' "$REPORT_DIR/machine.log"
  echo
  echo "GPU tests (passed, skipped, failed):"
  echo
  grep -E '^\[ +(OK|SKIPPED|FAILED) +\]|tests passed|Skipped' "$REPORT_DIR/gpu_tests.log" 2>/dev/null | sed 's/^/    /'
  echo
  echo "Total: $(( $(date +%s) - t0 )) s, exit $rc_all"
} >>"$REPORT"
cat "$REPORT"
exit "$rc_all"
