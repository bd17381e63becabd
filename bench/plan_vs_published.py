#!/usr/bin/env python3
"""fsdp-plan against published end-to-end FSDP throughput (docs/BENCHMARKS.md, "Planner vs
published"). Each row is one published measurement with its setup as its source states it; the
script asks `fsdp-plan --json` for the full_shard plan of that setup and prints planned against
published tokens per second per GPU (and the peak bytes against the published memory where
given) as a Markdown table.

The first rows are the built-in profiles' calibration: the a100 and h100 efficiency curves
(docs/planner.md "Profiles") are the fractions of the peak that reproduce IBM's and Meta's
published PyTorch FSDP runs of Llama 2 7B, 34B and 70B; `--derive-points` derives those points
again (by bisection on --compute-efficiency) for after a change of the FLOP count or the overlap
model. The other rows are held out: nothing in the profiles was fitted to them.

    python3 bench/plan_vs_published.py [--bin build/bin] [--derive-points]
"""
import argparse
import json
import subprocess
import sys

# Llama 3.1 8B and Llama 3 70B as fsdp-plan builds them from the Llama-2 presets.
LLAMA3_8B = ["--model", "llama2-7b", "--n-kv-head", "8", "--ffn-hidden", "14336", "--vocab-size", "128256",
             "--block-size", "8192"]
LLAMA3_70B = ["--model", "llama2-70b", "--vocab-size", "128256", "--block-size", "8192"]
LLAMA2_7B = ["--model", "llama2-7b"]
LLAMA2_13B = ["--model", "llama2-13b"]
LLAMA2_70B = ["--model", "llama2-70b"]

# Llama 2 34B as fms-fsdp builds it (C 8192, 48 layers, 64 heads with 8 key/value heads, MLP 22016).
LLAMA2_34B = ["--model", "llama2-70b", "--n-layer", "48", "--ffn-hidden", "22016"]

IBM = "IBM and Meta, pytorch.org blog 'Maximizing training throughput using PyTorch FSDP' (2024), table 1"
TT_H100 = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TT_A100 = "torchtitan docs/performance.md (64 A100 80GB, FSDP2)"


def ibm(gpu, model, recompute):
    n, nics = ("128", "2") if gpu == "a100" else ("96", "2")  # 400 / 800 Gb/s per node: 2 adapters
    flags = model + ["--seq-len", "4096", "--micro-batch-size", "2", "--world-size", n, "--profile", gpu,
                     "--nics-per-node", nics]
    return flags + (["--activation-checkpointing"] if recompute else [])


# Calibration: (gpu, width, source, setup, flags, strategy, published tokens/s per GPU). 7B in the
# repository's default hybrid sharding (one node per shard group), without checkpointing.
CALIBRATION = [
    ("a100", 4096, IBM, "Llama 2 7B, 128 A100, 2 x 4096, no AC, hybrid", ibm("a100", LLAMA2_7B, False), "hybrid_shard", 3700),
    ("a100", 8192, IBM, "Llama 2 34B, 128 A100, 2 x 4096, full AC", ibm("a100", LLAMA2_34B, True), "full_shard", 700),
    ("a100", 8192, IBM, "Llama 2 70B, 128 A100, 2 x 4096, full AC", ibm("a100", LLAMA2_70B, True), "full_shard", 370),
    ("h100", 4096, IBM, "Llama 2 7B, 96 H100, 2 x 4096, no AC, hybrid", ibm("h100", LLAMA2_7B, False), "hybrid_shard", 7500),
    ("h100", 8192, IBM, "Llama 2 34B, 96 H100, 2 x 4096, full AC", ibm("h100", LLAMA2_34B, True), "full_shard", 1550),
    ("h100", 8192, IBM, "Llama 2 70B, 96 H100, 2 x 4096, full AC", ibm("h100", LLAMA2_70B, True), "full_shard", 800),
]

# Held out: (source, setup, flags, published tokens/s per GPU, published memory GiB or None)
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


# Another stack, held out as well: MosaicML LLM Foundry's MPT benchmarks (github.com/mosaicml/
# llm-foundry, scripts/train/benchmarking/README.md, "A100 80GB with 1600 Gbps node-node
# interconnect": Composer's FSDP FULL_SHARD, amp_bf16, Triton flash attention), every row of
# MPT 3B-30B at 2048 and 4096 tokens (the 70B rows train in pure bf16, no fp32 master: another
# precision). MPT as the planner's GPT kind: GELU MLP 4C, vocab 50368 (its ALiBi, and no biases,
# change the FLOPs by under 1%).
MPT = {"3b": (2560, 32, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 64)}
FOUNDRY = "LLM Foundry MPT benchmarks, A100 80GB table"
# (model, seq len, GPUs, micro-batch, activation checkpointing, published tokens/s per GPU)
FOUNDRY_ROWS = [("30b", 4096, 8, 1, True, 814), ("30b", 2048, 8, 3, True, 916), ("13b", 4096, 8, 10, True, 2060),
                ("13b", 2048, 8, 2, False, 2262), ("7b", 4096, 8, 16, True, 3684), ("7b", 2048, 8, 6, False, 4641),
                ("3b", 4096, 8, 5, False, 9457), ("3b", 2048, 8, 10, False, 10811)]


def foundry_flags(model, seq, n, micro, recompute):
    c, layers, heads = MPT[model]
    return (["--model", "gpt2", "--n-embd", str(c), "--n-layer", str(layers), "--n-head", str(heads),
             "--vocab-size", "50368", "--block-size", str(seq), "--seq-len", str(seq), "--micro-batch-size",
             str(micro), "--world-size", str(n), "--profile", "a100", "--memory-per-rank", "80GB"] +
            (["--activation-checkpointing"] if recompute else []))


def plan(bin_dir, flags, strategy="full_shard"):
    cmd = [f"{bin_dir}/fsdp-plan", "--json", "--strategy", strategy, "--mixed-precision", "bf16"] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    s = json.loads(out)["strategies"][0]
    return s, json.loads(out)["inputs"]["world_size"]


def tokens_per_gpu(bin_dir, flags, strategy="full_shard"):
    s, n = plan(bin_dir, flags, strategy)
    return s["time"]["tokens_per_s"] / n, s["time"]


def derive_points(bin_dir):
    """Each calibration run's efficiency (the --compute-efficiency whose plan gives its published
    tokens/s, by bisection), and per GPU and width the point: one run's figure, or the mean of 1/E
    over the runs of that width."""
    inverse = {}
    for gpu, width, _, setup, flags, strategy, tps in CALIBRATION:
        lo, hi = 0.01, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if tokens_per_gpu(bin_dir, flags + ["--compute-efficiency", str(mid)], strategy)[0] < tps:
                lo = mid
            else:
                hi = mid
        e = (lo + hi) / 2
        print(f"{gpu} {setup}: {e:.4f}")
        inverse.setdefault((gpu, width), []).append(1 / e)
    for (gpu, width), inv in sorted(inverse.items()):
        print(f"point {gpu} C = {width}: {len(inv) / sum(inv):.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--derive-points", action="store_true",
                    help="print the calibration runs' efficiencies and the curves' points, then stop")
    args = ap.parse_args()
    if args.derive_points:
        derive_points(args.bin)
        return 0
    print("Calibration (the profiles' efficiency points come from these runs):\n")
    print("| source | setup | published tok/s/GPU | planned | error | efficiency | MFU | HFU |")
    print("|---|---|---|---|---|---|---|---|")
    for gpu, width, source, setup, flags, strategy, tps in CALIBRATION:
        per_gpu, t = tokens_per_gpu(args.bin, flags, strategy)
        print(f"| {source} | {setup} | {tps:,} | {per_gpu:,.0f} | {(per_gpu / tps - 1) * 100:+.1f}% | "
              f"{t['matmul_efficiency']:.3f} | {100 * t['mfu']:.1f}% | {100 * t['hfu']:.1f}% |")
    print("\nHeld out:\n")
    print("| source | setup | published tok/s/GPU | planned | error | efficiency | MFU | HFU | published memory | "
          "planned peak | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for source, setup, flags, tps, mem_gib in ROWS:
        s, n = plan(args.bin, flags)
        t = s["time"]
        per_gpu = t["tokens_per_s"] / n
        err = (per_gpu / tps - 1) * 100
        peak_gib = s["peak"]["peak_bytes"] / 2**30
        mem = f"{mem_gib:.1f} GiB | {peak_gib:.1f} GiB | {(peak_gib / mem_gib - 1) * 100:+.1f}%" if mem_gib else "- | " \
            f"{peak_gib:.1f} GiB | -"
        print(f"| {source} | {setup} | {tps:,} | {per_gpu:,.0f} | {err:+.1f}% | {t['matmul_efficiency']:.3f} | "
              f"{100 * t['mfu']:.1f}% | {100 * t['hfu']:.1f}% | {mem} |")
    print("\nAnother stack (held out):\n")
    print("| source | setup | published tok/s/GPU | planned | error | efficiency | MFU | HFU |")
    print("|---|---|---|---|---|---|---|---|")
    for model, seq, n, micro, recompute, tps in FOUNDRY_ROWS:
        per_gpu, t = tokens_per_gpu(args.bin, foundry_flags(model, seq, n, micro, recompute))
        setup = f"MPT {model.upper()}, {n} A100, {micro} x {seq}, {'full AC' if recompute else 'no AC'}"
        print(f"| {FOUNDRY} | {setup} | {tps:,} | {per_gpu:,.0f} | {(per_gpu / tps - 1) * 100:+.1f}% | "
              f"{t['matmul_efficiency']:.3f} | {100 * t['mfu']:.1f}% | {100 * t['hfu']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
