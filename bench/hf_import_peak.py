#!/usr/bin/env python3
"""Peak memory of importing a Hugging Face checkpoint straight into the shards
(fsdp::checkpoint::import_safetensors), against the bound the library states: each rank's model
state (its shards, allocated by fully_shard after the meta-device build) plus one full tensor of
the model. transformers writes a randomly initialised GPT-2 of the given shape (gpt2-medium by
default: 24 layers, width 1024, 354.8M parameters, a 1.42 GB model.safetensors); build/bin/hf_interop
imports it at N = 1, 2, 4 (full_shard) and reports each rank's counted bytes (the counting
allocator: every CPU allocation of libtorch) before the import and at its peak.

  python3 bench/hf_import_peak.py [--bin build/bin/hf_interop] [--preset gpt2-medium] [--n 1 2 4]

Prints a Markdown table (docs/BENCHMARKS.md).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile

PRESETS = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280)}


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/hf_interop")
    ap.add_argument("--preset", default="gpt2-medium", choices=sorted(PRESETS))
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4])
    opts = ap.parse_args()
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    layers, heads, width = PRESETS[opts.preset]
    tmp = tempfile.mkdtemp(prefix="fsdp-hf-peak-")
    try:
        with torch.device("meta"):
            GPT2LMHeadModel(GPT2Config())  # warm the import
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width))
        params = sum(p.numel() for p in model.parameters())
        ck = os.path.join(tmp, "hf")
        model.save_pretrained(ck)
        del model
        file_bytes = os.path.getsize(os.path.join(ck, "model.safetensors"))
        tokens = os.path.join(tmp, "t.bin")
        np.zeros(8, dtype="<i8").tofile(tokens)
        print("%s: %.1fM parameters, model.safetensors %.2f GB; CPU: %s" %
              (opts.preset, params / 1e6, file_bytes / 1e9, cpu_name()))
        print()
        print("| N | rank | model state before (MB) | peak during import (MB) | extra over the state (MB) | "
              "bound: state + largest tensor (MB) | within |")
        print("|---|---|---|---|---|---|---|")
        for n in opts.n:
            out = os.path.join(tmp, "peak.json")
            p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(n),
                                opts.bin, "--hf", ck, "--tokens", tokens, "--batch", "1", "--seq", "8",
                                "--logits", os.path.join(tmp, "l.bin"), "--peak-json", out],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            if p.returncode != 0:
                raise SystemExit(p.stdout[-2000:])
            for r in json.load(open(out)):
                bound = r["before_bytes"] + r["largest_tensor_bytes"]
                print("| %d | %d | %.1f | %.1f | %.1f | %.1f | %s |" %
                      (n, r["rank"], r["before_bytes"] / 1e6, r["peak_bytes"] / 1e6,
                       (r["peak_bytes"] - r["before_bytes"]) / 1e6, bound / 1e6,
                       "yes" if r["peak_bytes"] <= bound else "NO"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
