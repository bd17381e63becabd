#!/usr/bin/env bash
# ctest `install`: installs the built library into a scratch prefix, builds an outside project
# against it with find_package(fsdp), and runs it on 2 MPI ranks.
set -euo pipefail
BUILD_DIR=$1
SRC_DIR=$(cd "$(dirname "$0")" && pwd)
PREFIX="$BUILD_DIR/install-test/prefix"
rm -rf "$BUILD_DIR/install-test"
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$SRC_DIR/consumer" -B "$BUILD_DIR/install-test/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_PREFIX" >/dev/null
cmake --build "$BUILD_DIR/install-test/build" -j 2 >/dev/null
mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 "$BUILD_DIR/install-test/build/consumer"
