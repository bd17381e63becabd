#!/usr/bin/env bash
# Sets up (installs what is missing), builds, and runs the whole test suite through ctest:
# tiers unit, dist (threaded in-process ranks), mpi (mpirun -n 1..4), and the app tests. With
# FSDP_TEST_SANITIZERS=1 also the sanitizer and fuzz tiers (scripts/sanitize.sh: ASan + UBSan, TSan,
# libFuzzer; docs/testing.md): their three extra builds take ~10 minutes on 2 cores, which would
# put the default run past its 20-minute budget.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# The app tests train on the default corpus and tokenizer (idempotent; about a minute the first time).
bash scripts/prepare_data.sh ./data
# One rank per process, one intra-op thread per rank: the tests oversubscribe 2 cores with 4 ranks.
export OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
(cd build && ctest --output-on-failure --timeout 900 "$@")
if [ "${FSDP_TEST_SANITIZERS:-0}" = 1 ]; then
  bash scripts/sanitize.sh
else
  echo "[test] sanitizer and fuzz tiers not run (FSDP_TEST_SANITIZERS=1 scripts/test.sh runs them)"
fi
