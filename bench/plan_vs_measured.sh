#!/usr/bin/env bash
# Planner vs measured (docs/BENCHMARKS.md, "Planner vs measured"): for each preset and world size,
# calibrate this machine at that world size (fsdp-plan --calibrate: collectives over the MPI group,
# the preset's matmul shapes at the run's micro-batch), then run every strategy for a few steps of
# fsdp-train and print the measured peak bytes and step time next to fsdp-plan's (strategy_table.py).
#
#   bash bench/plan_vs_measured.sh [OUT_DIR]      (env: BIN=build/bin PRESETS="micro gpt2"
#                                                  NRANKS="1 2 4" STEPS=4 GLOBAL_BATCH=4 SEQ_LEN=64)
#
# CPU-heavy (gpt2 at N = 4 oversubscribes 2 cores): minutes per preset. Each N is calibrated with
# N ranks at once, as it runs (N = 1: one rank, no collectives).
set -euo pipefail
OUT=${1:-out/plan_vs_measured}
BIN=${BIN:-build/bin}
PRESETS=${PRESETS:-"micro gpt2"}
NRANKS=${NRANKS:-"1 2 4"}
STEPS=${STEPS:-4}
GLOBAL_BATCH=${GLOBAL_BATCH:-4}
SEQ_LEN=${SEQ_LEN:-64}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

for preset in $PRESETS; do
  for n in $NRANKS; do
    profile="$OUT/profile_${preset}_n${n}.json"
    "${MPIRUN[@]}" -n "$n" "$BIN/fsdp-plan" --calibrate --out "$profile" --name "${preset}-n${n}" \
      --model "$preset" --micro-batch-size $(( GLOBAL_BATCH / n )) --seq-len "$SEQ_LEN" \
      > "$OUT/calibrate_${preset}_n${n}.txt"
    python3 bench/strategy_table.py --presets "$preset" --nranks "$n" --steps "$STEPS" \
      --out "$OUT/runs" --bin "$BIN" --profile "$profile" \
      -- --global-batch-size "$GLOBAL_BATCH" --seq-len "$SEQ_LEN" > "$OUT/table_${preset}_n${n}.md"
    grep '^| '"$preset"' ' "$OUT/table_${preset}_n${n}.md" | sort -u
  done
done
