#!/usr/bin/env bash
# One-command demo: installs what is missing, builds, prepares the corpus and tokenizer, then trains
# the nano GPT with FULL_SHARD on 2 MPI ranks for a few minutes (about 3-5 min on 2 cores), printing
# the loss as it falls, validation losses and a sample at the end.
#
#   scripts/run.sh [fsdp-train flags...]     e.g. scripts/run.sh --model micro --steps 50
#
# Flags given here come after the defaults below, so they override them (fsdp-train keeps the last
# value of a repeated flag). Environment: FSDP_NP (ranks, default 2), FSDP_DATA_DIR (default ./data).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${FSDP_NP:-2}
DATA_DIR=${FSDP_DATA_DIR:-./data}

scripts/setup.sh
scripts/build.sh
scripts/prepare_data.sh "$DATA_DIR"

mkdir -p out
# mpirun gives the ranks a pseudo-terminal even when this script's output goes to a file or a pipe,
# so fsdp-train cannot tell: decide here. A progress bar only on a terminal, plain lines otherwise.
if [ -t 1 ]; then PROGRESS=bar; else PROGRESS=lines; fi
exec mpirun --allow-run-as-root --oversubscribe -n "$NP" build/bin/fsdp-train \
  --data-dir "$DATA_DIR" --model nano --strategy full_shard \
  --global-batch-size 32 --seq-len 128 --steps 250 --lr 3e-3 --min-lr 3e-4 --warmup-steps 10 \
  --eval-every 50 --eval-batches 4 --threads 1 --sample-tokens 120 \
  --progress "$PROGRESS" --metrics out/metrics.jsonl "$@"
