#!/usr/bin/env bash
# ctest `fuzz_<target>`: replays the committed regression inputs of the target (every input that
# once crashed it; each must now pass), then fuzzes it for FSDP_FUZZ_SECONDS seconds (default 15)
# from the seed corpus (tests/fuzz/make_seeds.sh). Any crash, sanitizer report, leak or exception
# other than fsdp::Error fails the test; libFuzzer leaves the input as FUZZ_DIR/crash-<target>-*.
set -euo pipefail
FUZZER=$1
TARGET=$2
FUZZ_DIR=$3
REGRESSIONS=$4
SECONDS_=${FSDP_FUZZ_SECONDS:-15}
export FSDP_FUZZ_SEEDS="$FUZZ_DIR/seeds"
export TMPDIR="$FUZZ_DIR/tmp-$TARGET"
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT
if [ -d "$REGRESSIONS" ] && [ -n "$(ls -A "$REGRESSIONS")" ]; then
  echo "[fuzz_$TARGET] replaying $(ls "$REGRESSIONS" | wc -l) regression inputs"
  "$FUZZER" "$REGRESSIONS"/* 2>&1 | tail -n 3
fi
CORPUS="$FUZZ_DIR/run-corpus/$TARGET"
mkdir -p "$CORPUS"
"$FUZZER" -max_total_time="$SECONDS_" -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/crash-$TARGET-" \
  "$CORPUS" "$FUZZ_DIR/corpus/$TARGET" 2>&1 | grep -v '^#[0-9]*.*\(NEW\|REDUCE\|pulse\)' 
