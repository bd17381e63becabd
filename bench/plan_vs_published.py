#!/usr/bin/env python3
"""fsdp-plan against published end-to-end FSDP throughput (docs/BENCHMARKS.md, "Planner vs
published"). Each row is one published measurement with its setup as its source states it; the
script asks `fsdp-plan --json` for the full_shard plan of that setup and prints planned against
published tokens per second per GPU (and the peak bytes against the published memory where
given) as a Markdown table.

    python3 bench/plan_vs_published.py [--bin build/bin]
"""
import argparse
import json
import subprocess
import sys

# Llama 3.1 8B and Llama 3 70B as fsdp-plan builds them from the Llama-2 presets.
LLAMA3_8B = ["--model", "llama2-7b", "--n-kv-head", "8", "--ffn-hidden", "14336", "--vocab-size", "128256",
             "--block-size", "8192"]
LLAMA3_70B = ["--model", "llama2-70b", "--vocab-size", "128256", "--block-size", "8192"]
LLAMA2_13B = ["--model", "llama2-13b"]
LLAMA2_70B = ["--model", "llama2-70b"]

TT_H100 = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TT_A100 = "torchtitan docs/performance.md (64 A100 80GB, FSDP2)"

# (source, setup, flags, published tokens/s per GPU, published memory GiB or None)
ROWS = [
    (TT_H100 + ", table 1", "Llama 3.1 8B, 8 H100, 2 x 8192, selective op AC -> full AC",
     LLAMA3_8B + ["--seq-len", "8192", "--micro-batch-size", "2", "--world-size", "8", "--activation-checkpointing",
                  "--profile", "h100", "--memory-per-rank", "96GB"], 5762, 82.4),
    (TT_H100 + ", table 1", "same, selective op AC -> every 2nd block",
     LLAMA3_8B + ["--seq-len", "8192", "--micro-batch-size", "2", "--world-size", "8", "--activation-checkpointing",
                  "--checkpoint-every", "2", "--profile", "h100", "--memory-per-rank", "96GB"], 5762, 82.4),
    (TT_H100 + ", table 3", "Llama 3.1 8B, 128 H100 (16 nodes), 2 x 8192, selective op AC -> full AC",
     LLAMA3_8B + ["--seq-len", "8192", "--micro-batch-size", "2", "--world-size", "128", "--activation-checkpointing",
                  "--profile", "h100", "--memory-per-rank", "96GB"], 5605, 67.0),
    (TT_H100 + ", table 3", "same, selective op AC -> every 2nd block",
     LLAMA3_8B + ["--seq-len", "8192", "--micro-batch-size", "2", "--world-size", "128", "--activation-checkpointing",
                  "--checkpoint-every", "2", "--profile", "h100", "--memory-per-rank", "96GB"], 5605, 67.0),
    (TT_A100, "Llama 3 8B, 64 A100, 1 x 8192, selective layer AC (every 2nd block)",
     LLAMA3_8B + ["--seq-len", "8192", "--micro-batch-size", "1", "--world-size", "64", "--activation-checkpointing",
                  "--checkpoint-every", "2", "--profile", "a100"], 2904, None),
    (TT_A100, "Llama 3 70B, 64 A100, 1 x 8192, full AC",
     LLAMA3_70B + ["--seq-len", "8192", "--micro-batch-size", "1", "--world-size", "64", "--activation-checkpointing",
                   "--profile", "a100"], 331, None),
    (TT_A100, "Llama 2 13B, 64 A100, 2 x 4096, no AC",
     LLAMA2_13B + ["--seq-len", "4096", "--micro-batch-size", "2", "--world-size", "64", "--profile", "a100"], 2162, None),
    (TT_A100, "Llama 2 13B, 64 A100, 2 x 4096, selective layer AC (every 2nd block)",
     LLAMA2_13B + ["--seq-len", "4096", "--micro-batch-size", "2", "--world-size", "64", "--activation-checkpointing",
                   "--checkpoint-every", "2", "--profile", "a100"], 1914, None),
    (TT_A100, "Llama 2 70B, 64 A100, 2 x 4096, full AC",
     LLAMA2_70B + ["--seq-len", "4096", "--micro-batch-size", "2", "--world-size", "64", "--activation-checkpointing",
                   "--profile", "a100"], 353, None),
]


def plan(bin_dir, flags):
    cmd = [f"{bin_dir}/fsdp-plan", "--json", "--strategy", "full_shard", "--mixed-precision", "bf16"] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    s = json.loads(out)["strategies"][0]
    return s, json.loads(out)["inputs"]["world_size"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    args = ap.parse_args()
    print("| source | setup | published tok/s/GPU | planned | error | MFU | HFU | published memory | planned peak | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for source, setup, flags, tps, mem_gib in ROWS:
        s, n = plan(args.bin, flags)
        t = s["time"]
        per_gpu = t["tokens_per_s"] / n
        err = (per_gpu / tps - 1) * 100
        peak_gib = s["peak"]["peak_bytes"] / 2**30
        mem = f"{mem_gib:.1f} GiB | {peak_gib:.1f} GiB | {(peak_gib / mem_gib - 1) * 100:+.1f}%" if mem_gib else "- | " \
            f"{peak_gib:.1f} GiB | -"
        print(f"| {source} | {setup} | {tps:,} | {per_gpu:,.0f} | {err:+.1f}% | {100 * t['mfu']:.1f}% | "
              f"{100 * t['hfu']:.1f}% | {mem} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
