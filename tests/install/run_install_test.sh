#!/usr/bin/env bash
# ctest `install`: installs the built library into a scratch prefix, builds an outside project
# against it with find_package(fsdp), and runs it on 2 ranks: under mpirun when the library has
# MPI (LAUNCHER=mpi), under torchrun over Gloo when it does not (LAUNCHER=gloo).
set -euo pipefail
BUILD_DIR=$1
LAUNCHER=${2:-mpi}
SRC_DIR=$(cd "$(dirname "$0")" && pwd)
PREFIX="$BUILD_DIR/install-test/prefix"
rm -rf "$BUILD_DIR/install-test"
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# Relocatable: the installed package names libtorch's targets, not files of the build machine.
TORCH_ROOT=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
if grep -n -e "$TORCH_ROOT" -e 'libc10' "$PREFIX"/lib*/cmake/fsdp/*.cmake >&2; then
  echo "install test: the installed CMake package names files of the build machine's libtorch (above)" >&2
  exit 1
fi
cmake -S "$SRC_DIR/consumer" -B "$BUILD_DIR/install-test/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_PREFIX" >/dev/null
cmake --build "$BUILD_DIR/install-test/build" -j 2 >/dev/null
CONSUMER="$BUILD_DIR/install-test/build/consumer"
cd "$BUILD_DIR/install-test"  # the consumer writes its safetensors round trip here
if [ "$LAUNCHER" = mpi ]; then
  mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 "$CONSUMER"
else
  # A library built without MPI must not bring it into its users' programs.
  if ldd "$CONSUMER" | grep -q 'libmpi'; then
    echo "install test: the consumer of a library built without MPI links MPI:" >&2
    ldd "$CONSUMER" | grep 'libmpi' >&2
    exit 1
  fi
  python3 -m torch.distributed.run --no-python --standalone --nproc-per-node 2 "$CONSUMER"
fi
