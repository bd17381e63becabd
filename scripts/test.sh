#!/usr/bin/env bash
# Sets up (installs what is missing), builds, and runs the whole test suite through ctest:
# tiers unit, dist (threaded in-process ranks), mpi (mpirun -n 1..4), and the app tests; then
# the sanitizer and fuzz tiers (scripts/sanitize.sh: ASan + UBSan on unit, dist, a 2-rank MPI
# smoke test and the libFuzzer targets; TSan on dist; docs/testing.md), whose trees build while
# ctest runs. FSDP_TEST_SANITIZERS=0 skips the sanitizer tiers. Each phase prints its wall time
# ("[test] ... s").
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
phase() {  # NAME: prints the time since the previous phase
  local now; now=$(date +%s)
  echo "[test] $1: $((now - t_prev)) s (total $((now - t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg))"
  t_prev=$now
}
t_prev=$t0
bash scripts/setup.sh
phase "setup"
bash scripts/build.sh
phase "build (Release)"
# The app tests train on the default corpus and tokenizer (idempotent; about a minute the first time).
bash scripts/prepare_data.sh ./data
phase "data"
# One rank per process, one intra-op thread per rank: the tests oversubscribe 2 cores with 4 ranks.
export OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The sanitizer trees build at the lowest CPU priority while ctest runs: the tests leave about half
# of the CPU idle (ranks waiting on each other, timeouts, launches), and the compiler takes only
# what they leave. Its log is build-sanitize.log; a failed build fails the suite after ctest.
san_pid=
if [ "${FSDP_TEST_SANITIZERS:-1}" != 0 ]; then
  nice -n 19 bash scripts/sanitize.sh --build-only >build-sanitize.log 2>&1 &
  san_pid=$!
fi
ctest_rc=0
(cd build && ctest --output-on-failure --timeout 900 "$@") || ctest_rc=$?
phase "ctest (Release)"
if [ -n "$san_pid" ]; then
  san_rc=0
  wait "$san_pid" || san_rc=$?
  phase "sanitizer builds (the rest after ctest; build-sanitize.log)"
  if [ "$san_rc" != 0 ]; then
    tail -n 40 build-sanitize.log >&2
    echo "[test] the sanitizer builds failed (exit $san_rc): build-sanitize.log" >&2
    exit "$san_rc"
  fi
fi
[ "$ctest_rc" = 0 ] || exit "$ctest_rc"
if [ "${FSDP_TEST_SANITIZERS:-1}" != 0 ]; then
  bash scripts/sanitize.sh --tests-only
  phase "sanitizer tiers (tests)"
else
  echo "[test] sanitizer and fuzz tiers skipped (FSDP_TEST_SANITIZERS=0)"
fi
