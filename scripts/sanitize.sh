#!/usr/bin/env bash
# Sanitizer and fuzz tiers (docs/testing.md), called by scripts/test.sh; assumes scripts/setup.sh
# has run (clang-14). Builds with clang at -O1 -gline-tables-only (Ninja when installed), only the
# targets each tier runs, and runs them through ctest:
#   asan  build-asan/: ASan + UBSan (+ libFuzzer coverage): unit, dist, a 2-rank MPI smoke test,
#         the five fuzz targets (FSDP_FUZZ_SECONDS each, default 15) after their regressions
#   tsan  build-tsan/: ThreadSanitizer: the dist tier (communication threads, autograd hooks)
#
#   scripts/sanitize.sh [--build-only | --tests-only] [asan] [tsan]      (default: both tiers,
#                                         built then tested)
# scripts/test.sh builds the trees (--build-only, at the lowest CPU priority) while the Release
# tests run, which leave about half of the CPU idle (processes waiting on each other, timeouts and
# launches), then runs their tests (--tests-only) after them.
# libtorch, Open MPI and gtest are prebuilt and uninstrumented; tests/sanitizers/ holds the
# runtime options' suppressions, each for one of those libraries and with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PHASE=all
case "${1:-}" in
  --build-only) PHASE=build; shift ;;
  --tests-only) PHASE=tests; shift ;;
esac
TIERS=("$@")
[ ${#TIERS[@]} -eq 0 ] && TIERS=(asan tsan)
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
JOBS=${FSDP_BUILD_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}  # nproc obeys OMP_NUM_THREADS (test.sh sets 1)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
for tool in clang++-14 clang-14; do
  command -v "$tool" >/dev/null || { echo "[sanitize] missing '$tool': run scripts/setup.sh" >&2; exit 1; }
done

configure() {  # DIR, extra cmake flags...
  local dir=$1; shift
  local generator=()
  [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 "${LAUNCHER[@]}" \
    -DFSDP_BUILD_APPS=OFF -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" "$@" >/dev/null
}

export OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
SUPP=$ROOT/tests/sanitizers
for tier in "${TIERS[@]}"; do
  start=$(date +%s)
  case "$tier" in
    asan)
      if [ "$PHASE" != tests ]; then
        configure build-asan -DFSDP_SANITIZE=address -DFSDP_FUZZ=ON
        cmake --build build-asan -j "$JOBS" --target fsdp_unit_tests fsdp_dist_tests fsdp_mpi_smoke \
          fuzz_make_seeds fuzz_manifest fuzz_rank_file fuzz_import fuzz_token_cache fuzz_safetensors
      fi
      built=$(date +%s)
      # Two at a time: the fuzz targets and the unit tier are single processes (the MPI smoke
      # test runs alone, RUN_SERIAL).
      [ "$PHASE" != build ] && (cd build-asan &&
        ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1" \
        LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        ctest --output-on-failure --timeout 900 -j 2)
      ;;
    tsan)
      if [ "$PHASE" != tests ]; then
        configure build-tsan -DFSDP_SANITIZE=thread
        cmake --build build-tsan -j "$JOBS" --target fsdp_dist_tests
      fi
      built=$(date +%s)
      [ "$PHASE" != build ] && (cd build-tsan &&
        TSAN_OPTIONS="suppressions=$SUPP/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0" \
        ctest --output-on-failure --timeout 900 -L dist)
      ;;
    *) echo "[sanitize] unknown tier '$tier' (asan, tsan)" >&2; exit 2 ;;
  esac
  end=$(date +%s)
  case "$PHASE" in
    build) echo "[sanitize] $tier: build $((built - start)) s" ;;
    tests) echo "[sanitize] $tier: tests $((end - built)) s" ;;
    *) echo "[sanitize] $tier: build $((built - start)) s, tests $((end - built)) s" ;;
  esac
done
