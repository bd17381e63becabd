#!/usr/bin/env bash
# ctest `fuzz_seeds`: writes the fuzz fixture (fuzz_make_seeds) and the seed corpus of each target
# into FUZZ_DIR: corpus/manifest (the checkpoint's manifest.json), corpus/rank_file (its rank
# files), corpus/import (export_full's file and state dicts written by Python's torch.save),
# corpus/token_cache (two valid caches), corpus/safetensors (files Python wrote).
set -euo pipefail
MAKE_SEEDS=$1
FUZZ_DIR=$2
rm -rf "$FUZZ_DIR"
mkdir -p "$FUZZ_DIR"/corpus/{manifest,rank_file,import,token_cache,safetensors}
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
# safetensors files as Python's safetensors writes them (every dtype read here, a scalar, an
# empty tensor, metadata) and, when transformers is installed, a GPT-2's save_pretrained file.
python3 - "$FUZZ_DIR/corpus/safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
out = sys.argv[1]
torch.manual_seed(0)
save_file({"w": torch.randn(4, 3), "b": torch.randn(5).bfloat16(), "h": torch.randn(2, 2, 2).half(),
           "ids": torch.arange(6), "s": torch.tensor(1.5, dtype=torch.float64), "e": torch.empty(0, 3),
           "m": torch.tensor([True, False]), "i8": torch.arange(4, dtype=torch.int8)},
          f"{out}/mixed.safetensors", metadata={"format": "pt"})
try:
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2)).save_pretrained(f"{out}/gpt2")
    import os, shutil
    shutil.move(f"{out}/gpt2/model.safetensors", f"{out}/gpt2.safetensors")
    shutil.rmtree(f"{out}/gpt2")
except ImportError:
    pass
PY
echo "[fuzz_seeds] $(find "$FUZZ_DIR/corpus" -type f | wc -l) seed files in $FUZZ_DIR/corpus"
