#!/usr/bin/env python3
"""Per-strategy memory and traffic of fsdp-train next to DESIGN.md's formulas.

Runs `mpirun -n N build/bin/fsdp-train --strategy S --steps K` for each preset, world size and
strategy, reads the last step event of --metrics, and prints a markdown table: measured per-rank
model-state bytes (param + grad + optimizer shards, max over ranks), the formula's prediction,
peak bytes (counting allocator), logical bytes communicated per step (one rank), and step time.

  python3 bench/strategy_table.py --presets micro --nranks 1,2,4 [--out out/strategies]
"""
import argparse
import json
import os
import subprocess
import sys

STRATEGIES = ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"]


def formula_bytes(strategy, P, N, G):
    """DESIGN.md memory model, fp32 + AdamW, bytes per rank."""
    if strategy == "no_shard":
        return 16 * P
    if strategy == "zero1":
        return 4 * P + 4 * P + 8 * P / N
    if strategy == "shard_grad_op":
        return 4 * P + 12 * P / N
    if strategy == "full_shard":
        return 16 * P / N
    if strategy == "hybrid_shard":
        return 16 * P / G
    raise ValueError(strategy)


def formula_comm(strategy, P, N, G):
    """Logical bytes per step (fp32): DDP all-reduce P; ZeRO-1/2 reduce-scatter + all-gather 2P;
    FULL_SHARD 3P (root gathered once: slightly less); hybrid 3P in-group + P/G across."""
    if N == 1 and strategy != "hybrid_shard":
        pass
    return {"no_shard": 4 * P, "zero1": 8 * P, "shard_grad_op": 8 * P, "full_shard": 12 * P,
            "hybrid_shard": 12 * P + 4 * P / G}[strategy]


def run(preset, n, strategy, steps, out, extra):
    d = os.path.join(out, f"{preset}_n{n}_{strategy}")
    os.makedirs(d, exist_ok=True)
    metrics = os.path.join(d, "metrics.jsonl")
    g = max(1, n // 2) if strategy == "hybrid_shard" else 0
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(n),
           "build/bin/fsdp-train", "--model", preset, "--strategy", strategy, "--steps", str(steps),
           "--metrics", metrics, "--progress", "lines", "--eval-every", "0", "--sample-tokens", "0",
           "--hybrid-shard-group-size", str(g)] + extra
    with open(os.path.join(d, "log.txt"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return None, g
    events = [json.loads(l) for l in open(metrics)]
    cfg = next(e for e in events if e["event"] == "config")
    steps_ev = [e for e in events if e["event"] == "step"]
    return (cfg, steps_ev), g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="micro")
    ap.add_argument("--nranks", default="1,2,4")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="out/strategies")
    ap.add_argument("extra", nargs="*", help="extra fsdp-train flags after --")
    a = ap.parse_args()
    rows = ["| preset | N | strategy | state bytes/rank | formula | peak bytes/rank | comm bytes/step | formula | step s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for preset in a.presets.split(","):
        for n in [int(x) for x in a.nranks.split(",")]:
            for s in a.strategies.split(","):
                res, g = run(preset, n, s, a.steps, a.out, a.extra)
                if res is None:
                    rows.append(f"| {preset} | {n} | {s} | failed (see {a.out}) | | | | | |")
                    continue
                cfg, steps = res
                P = cfg["num_params"]
                last = steps[-1]
                mem, comm = last["mem"], last["comm"]
                state = mem["param_shard_bytes"] + mem["grad_shard_bytes"] + mem["optim_state_bytes"]
                cbytes = sum(v for k, v in comm.items() if k.endswith("_bytes") and not k.startswith("barrier"))
                gs = g or n
                name = s + (f" (G={gs})" if s == "hybrid_shard" else "")
                rows.append(f"| {preset} | {n} | {name} | {state:,} | {formula_bytes(s, P, n, gs):,.0f} | "
                            f"{mem['peak_bytes']:,} | {cbytes:,} | {formula_comm(s, P, n, gs):,.0f} | "
                            f"{last['step_time_s']:.2f} |")
                print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())
