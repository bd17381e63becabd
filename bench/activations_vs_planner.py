#!/usr/bin/env python3
"""Activation memory of fsdp-train next to the planner's activation model.

For each preset, precision and activation-checkpointing setting, runs
`mpirun -n N build/bin/fsdp-train --model P --mixed-precision M [--activation-checkpointing]
--steps K --metrics FILE` and reads `mem.activation_bytes` of the step events (what one
micro-batch's forward and loss leave for its backward, counted by the counting allocator, less the
unsharded params alive: [Note: measurement rules] in apps/train/reporting.h), the largest over
steps 2..K; then asks `build/bin/fsdp-plan --json` about the same run (the model, batch and
precision of fsdp-train's config event) for `activations.total_saved_bytes` (one micro-batch's
saved tensors, src/planner/activations.cpp). Prints a markdown table (docs/BENCHMARKS.md,
"Activation memory vs planner").

  python3 bench/activations_vs_planner.py [--presets micro gpt2] [--nranks 1] [--steps 3]
      [--bin build/bin] [--out out/activations] [-- extra fsdp-train flags]
"""
import argparse
import json
import os
import subprocess
import sys


def run(bin_dir, out, preset, n, mp, ck, steps, extra):
    d = os.path.join(out, "%s_n%d_%s%s" % (preset, n, mp, "_ck" if ck else ""))
    os.makedirs(d, exist_ok=True)
    metrics = os.path.join(d, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(n),
           os.path.join(bin_dir, "fsdp-train"), "--model", preset, "--mixed-precision", mp,
           "--steps", str(steps), "--metrics", metrics, "--progress", "lines", "--eval-every", "0",
           "--sample-tokens", "0"] + (["--activation-checkpointing"] if ck else []) + extra
    with open(os.path.join(d, "log.txt"), "w") as log:
        if subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT) != 0:
            sys.exit("fsdp-train failed: %s (log in %s)" % (" ".join(cmd), d))
    events = [json.loads(l) for l in open(metrics)]
    cfg = next(e for e in events if e["event"] == "config")
    measured = max(e["mem"]["activation_bytes"] for e in events if e["event"] == "step" and e["step"] >= 2)
    return cfg, measured


def plan(bin_dir, cfg, ck):
    cmd = [os.path.join(bin_dir, "fsdp-plan"), "--json", "--model", cfg["model"],
           "--n-layer", str(cfg["n_layer"]), "--n-head", str(cfg["n_head"]),
           "--n-embd", str(cfg["n_embd"]), "--block-size", str(cfg["block_size"]),
           "--vocab-size", str(cfg["vocab_size"]), "--attention", cfg["attention"],
           "--world-size", str(cfg["world_size"]), "--strategy", cfg["strategy"],
           "--mixed-precision", cfg["mixed_precision"],
           "--global-batch-size", str(cfg["global_batch_size"]),
           "--micro-batch-size", str(cfg["micro_batch_size"]), "--seq-len", str(cfg["seq_len"])]
    if ck:
        cmd.append("--activation-checkpointing")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["activations"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["micro", "gpt2"])
    ap.add_argument("--nranks", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="out/activations")
    ap.add_argument("extra", nargs="*", help="extra fsdp-train flags after --")
    a = ap.parse_args()
    extra = a.extra or ["--global-batch-size", "2", "--seq-len", "64"]
    print("| preset | precision | checkpointing | attention | B x T per rank | measured | planner | error |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in a.presets:
        for mp in ("fp32", "bf16"):
            for ck in (False, True):
                cfg, measured = run(a.bin, a.out, preset, a.nranks, mp, ck, a.steps, extra)
                act = plan(a.bin, cfg, ck)
                want = act["total_saved_bytes"]
                print("| %s | %s | %s | %s | %d x %d | %s | %s | %+.2f%% |" %
                      (preset, mp, "yes" if ck else "no", act["attention_kernel"], cfg["micro_batch_size"],
                       cfg["seq_len"], format(measured, ","), format(want, ","),
                       100.0 * (want - measured) / measured), flush=True)


if __name__ == "__main__":
    main()
