#!/usr/bin/env bash
# ctest `fuzz_seeds`: writes the fuzz fixture (fuzz_make_seeds) and the seed corpus of each target
# into FUZZ_DIR: corpus/manifest (the checkpoint's manifest.json), corpus/rank_file (its rank
# files), corpus/import (export_full's file and state dicts written by Python's torch.save).
set -euo pipefail
MAKE_SEEDS=$1
FUZZ_DIR=$2
rm -rf "$FUZZ_DIR"
mkdir -p "$FUZZ_DIR"/corpus/{manifest,rank_file,import,token_cache}
"$MAKE_SEEDS" "$FUZZ_DIR/seeds"
CKPT="$FUZZ_DIR/seeds/checkpoint/step-000000001"
cp "$CKPT/manifest.json" "$FUZZ_DIR/corpus/manifest/"
cp "$CKPT"/rank-*.bin "$FUZZ_DIR/corpus/rank_file/"
cp "$FUZZ_DIR/seeds/export.pt" "$FUZZ_DIR/corpus/import/"
cp "$FUZZ_DIR"/seeds/token_cache_*.tok "$FUZZ_DIR/corpus/token_cache/"
# Python-written dicts: the model's names and shapes (valid), a dtype mismatch, a missing name,
# a non-tensor value and the legacy (non-zip) format.
python3 - "$FUZZ_DIR/corpus/import" <<'PY'
import sys, torch
out = sys.argv[1]
torch.manual_seed(0)
sd = {"fc1.weight": torch.randn(5, 6), "fc1.bias": torch.randn(5),
      "fc2.weight": torch.randn(3, 5), "fc2.bias": torch.randn(3), "scale": torch.full((3,), 0.5)}
torch.save(sd, f"{out}/python_valid.pt")
torch.save({**sd, "fc1.bias": sd["fc1.bias"].double()}, f"{out}/python_float64.pt")
torch.save({k: v for k, v in sd.items() if k != "fc2.bias"}, f"{out}/python_missing.pt")
torch.save({**sd, "extra": 3}, f"{out}/python_int_value.pt")
torch.save(sd, f"{out}/python_legacy.pt", _use_new_zipfile_serialization=False)
PY
echo "[fuzz_seeds] $(find "$FUZZ_DIR/corpus" -type f | wc -l) seed files in $FUZZ_DIR/corpus"
