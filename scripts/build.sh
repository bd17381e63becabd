#!/usr/bin/env bash
# Configures and builds fsdp-cpp into build/ (Release). Assumes scripts/setup.sh has run.
# Ninja when installed (a new build/ only: an existing tree keeps its generator), so that a
# target's files compile while another target's precompiled header is still being built.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
JOBS=${FSDP_BUILD_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}  # nproc obeys OMP_NUM_THREADS (test.sh sets 1)
GENERATOR=()
[ ! -f build/CMakeCache.txt ] && command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S . -B build "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=${FSDP_BUILD_TYPE:-Release} \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" >/dev/null
cmake --build build -j "$JOBS"
