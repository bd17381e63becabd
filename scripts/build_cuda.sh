#!/usr/bin/env bash
# Configures and builds the CUDA build of fsdp-cpp (FSDP_WITH_CUDA=ON: the NCCL backend and the
# gpu tests) into build-cuda/ (FSDP_CUDA_BUILD_DIR: another folder; Release, Ninja when installed),
# every target. Not part of
# scripts/test.sh: without a CUDA torch at hand it installs one (about 3 GB of wheels).
#
# Which torch:
#  - FSDP_TORCH_PYTHON=/path/to/python whose torch has CUDA (a GPU machine): that torch, and the
#    CUDA toolkit already installed there (nvcc on PATH, or CUDA_HOME / CUDA_PATH);
#  - unset: a virtual environment .venv-cuda/ in the repository (made once, then reused) with
#    torch==${FSDP_CUDA_TORCH_VERSION:-2.14.1} from the package index and the nvidia-* wheels of
#    the CUDA toolkit of the same major.minor as the CUDA runtime torch depends on (nvcc, crt,
#    nvvm, cccl; NCCL comes with torch). The wheels' toolkit is laid out for CMake in
#    build-cuda/cuda-toolkit/ (links into the environment, plus the unversioned library names).
# A GPU is not needed to build; the gpu tests skip without one (ctest -L gpu --test-dir build-cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${FSDP_CUDA_BUILD_DIR:-build-cuda}
JOBS=${FSDP_BUILD_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
T0=$(date +%s)
mkdir -p "$BUILD"

torch_cuda() { "$1" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true; }

CMAKE_CUDA_ARGS=()
if [ -n "${FSDP_TORCH_PYTHON:-}" ]; then
  PY=$FSDP_TORCH_PYTHON
  CUDA_VER=$(torch_cuda "$PY")
  if [ -z "$CUDA_VER" ]; then
    echo "build_cuda.sh: FSDP_TORCH_PYTHON=$PY has no torch with CUDA (torch.version.cuda is None" \
         "or torch is missing); unset it to build against a torch installed in .venv-cuda/" >&2
    exit 1
  fi
  NVCC=${CUDACXX:-$(command -v nvcc || true)}
  for home in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -z "$NVCC" ] && [ -n "$home" ] && [ -x "$home/bin/nvcc" ] && NVCC=$home/bin/nvcc
  done
  if [ -z "$NVCC" ]; then
    echo "build_cuda.sh: no nvcc (not on PATH, nor in CUDA_HOME, CUDA_PATH, /usr/local/cuda)" >&2
    exit 1
  fi
  TK=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)
  CMAKE_CUDA_ARGS=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$TK" -DCUDA_TOOLKIT_ROOT_DIR="$TK")
  # libtorch's CUDA set-up looks for nvcc on PATH and in CUDA_HOME too (/usr/local/cuda/bin is
  # often not on PATH).
  export PATH="$(dirname "$NVCC"):$PATH" CUDA_HOME="$TK" CUDACXX="$NVCC"
else
  VENV=$ROOT/.venv-cuda
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PY=$VENV/bin/python
  PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
  "${PIP[@]}" "torch==${FSDP_CUDA_TORCH_VERSION:-2.14.1}"
  CUDA_VER=$(torch_cuda "$PY")
  if [ -z "$CUDA_VER" ]; then
    echo "build_cuda.sh: the torch installed in $VENV has no CUDA (a CPU wheel came from the index)" >&2
    exit 1
  fi
  # The toolkit wheels of the CUDA runtime's major.minor (nvcc must match the runtime's headers).
  RT=$("$PY" -c 'import importlib.metadata as m; v = m.version("nvidia-cuda-runtime").split("."); print(v[0] + "." + v[1])')
  "${PIP[@]}" "nvidia-cuda-runtime==$RT.*" "nvidia-cuda-nvcc==$RT.*" "nvidia-cuda-crt==$RT.*" \
    "nvidia-nvvm==$RT.*" "nvidia-cuda-cccl==$RT.*" "nvidia-nccl-cu${RT%%.*}"
  SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  WHEEL_TK=$SITE/nvidia/cu${RT%%.*}
  [ -x "$WHEEL_TK/bin/nvcc" ] || { echo "build_cuda.sh: no nvcc in $WHEEL_TK/bin after installing nvidia-cuda-nvcc" >&2; exit 1; }
  # A toolkit tree as CMake and nvcc expect it: include and nvvm linked; bin a folder of links
  # (nvcc finds the libraries at bin/.., which must be this tree, not the wheels'); lib (and
  # lib64) a folder of links to the wheels' libraries, with the unversioned names (libcudart.so,
  # ...) that the wheels leave out.
  TK=$ROOT/$BUILD/cuda-toolkit
  rm -rf "$TK"
  mkdir -p "$TK/lib" "$TK/bin"
  for d in include nvvm; do ln -s "$WHEEL_TK/$d" "$TK/$d"; done
  for f in "$WHEEL_TK"/bin/*; do ln -s "$f" "$TK/bin/$(basename "$f")"; done
  for f in "$WHEEL_TK"/lib/*; do
    name=$(basename "$f")
    ln -sf "$f" "$TK/lib/$name"
    case $name in *.so.*) ln -sf "$f" "$TK/lib/${name%%.so.*}.so" ;; esac
  done
  ln -s lib "$TK/lib64"
  CMAKE_CUDA_ARGS=(-DCMAKE_CUDA_COMPILER="$TK/bin/nvcc" -DCUDAToolkit_ROOT="$TK" -DCUDA_TOOLKIT_ROOT_DIR="$TK")
  export PATH=$TK/bin:$PATH  # libtorch's FindCUDA looks for nvcc on PATH too
fi

TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
echo "build_cuda.sh: torch $("$PY" -c 'import torch; print(torch.__version__)') (CUDA $CUDA_VER) from $PY"
GENERATOR=()
[ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S . -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE="${FSDP_BUILD_TYPE:-Release}" \
  -DFSDP_WITH_CUDA=ON -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" "${CMAKE_CUDA_ARGS[@]}" >"$BUILD/configure.log" \
  || { tail -n 40 "$BUILD/configure.log" >&2; exit 1; }
grep -E "^-- (fsdp|PyTorch: CUDA detected)" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j "$JOBS"
echo "build_cuda.sh: built $BUILD/ in $(( $(date +%s) - T0 )) s"
