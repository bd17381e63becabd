#!/usr/bin/env bash
# Configures and builds fsdp-cpp into build/ (Release). Assumes scripts/setup.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
JOBS=${FSDP_BUILD_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=${FSDP_BUILD_TYPE:-Release} -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" >/dev/null
cmake --build build -j "$JOBS"
