#!/usr/bin/env python3
"""Per-strategy memory and traffic of fsdp-train next to the planner's predictions.

Runs `mpirun -n N build/bin/fsdp-train --strategy S --steps K` for each preset, world size and
strategy, reads the step events of --metrics (steps after the first), asks
`build/bin/fsdp-plan --json` about the same run (the model, batch, precision and strategy of fsdp-train's config event), and prints a markdown
table: measured per-rank model-state bytes (param + grad + optimizer shards, max over ranks) next
to the planner's exact bytes and DESIGN.md's formula (ZeRO section 5), peak bytes (counting
allocator, the largest over the steps) next to the planner's peak and the relative error, logical
bytes communicated per step (one rank) next to the planner's, and step time (the median) next to
the planner's estimate and the relative error when --profile is given, and the exposed
communication (the seconds compute waited for a collective, fsdp-train's comm.exposed_s total, the
median) next to the planner's exposed_comm_s (with --profile). Every formula
is the planner's (include/fsdp/planner/, docs/planner.md): this script computes none.

  python3 bench/strategy_table.py --presets micro --nranks 1,2,4 [--out out/strategies] \\
      [--profile out/profile.json] -- --global-batch-size 4 --seq-len 64
"""
import argparse
import json
import os
import subprocess
import sys

STRATEGIES = ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"]


def plan(cfg, n, strategy, g, profile, bin_dir):
    """fsdp-plan's prediction for the run fsdp-train described in its config event."""
    cmd = [os.path.join(bin_dir, "fsdp-plan"), "--json", "--model", cfg["model"],
           "--n-layer", str(cfg["n_layer"]), "--n-head", str(cfg["n_head"]),
           "--n-embd", str(cfg["n_embd"]), "--block-size", str(cfg["block_size"]),
           "--vocab-size", str(cfg["vocab_size"]), "--attention", cfg["attention"],
           "--world-size", str(n), "--strategy", strategy,
           "--mixed-precision", cfg["mixed_precision"],
           "--global-batch-size", str(cfg["global_batch_size"]),
           "--micro-batch-size", str(cfg["micro_batch_size"]), "--seq-len", str(cfg["seq_len"]),
           "--forward-prefetch", "true" if cfg["forward_prefetch"] else "false",
           # the measured runs are fsdp-train over MPI or Gloo, whatever the profile
           "--reduce-scatter-route", "all_to_all"]
    if strategy == "hybrid_shard":
        cmd += ["--hybrid-shard-group-size", str(g)]
    if strategy == "no_shard":
        cmd += ["--bucket-cap-mb", str(cfg["bucket_cap_bytes"] / (1024 * 1024))]
    if profile:
        cmd += ["--profile", profile]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["strategies"][0]


def run(preset, n, strategy, steps, out, extra, bin_dir, reuse=False):
    d = os.path.join(out, f"{preset}_n{n}_{strategy}")
    os.makedirs(d, exist_ok=True)
    metrics = os.path.join(d, "metrics.jsonl")
    g = max(1, n // 2) if strategy == "hybrid_shard" else 0
    if reuse:  # --reuse-runs: the metrics an earlier run wrote there
        return (read_metrics(metrics) if os.path.exists(metrics) else None), g
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(n),
           os.path.join(bin_dir, "fsdp-train"), "--model", preset, "--strategy", strategy,
           "--steps", str(steps), "--metrics", metrics, "--progress", "lines", "--eval-every", "0",
           "--sample-tokens", "0"] + extra
    if strategy == "hybrid_shard":  # a strategy-specific flag: an error with any other strategy
        cmd += ["--hybrid-shard-group-size", str(g)]
    with open(os.path.join(d, "log.txt"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return None, g
    return read_metrics(metrics), g


def read_metrics(metrics):
    """fsdp-train's metrics file: (its config event, its step events)."""
    events = [json.loads(l) for l in open(metrics)]
    return next(e for e in events if e["event"] == "config"), [e for e in events if e["event"] == "step"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="micro")
    ap.add_argument("--nranks", default="1,2,4")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps-skipped", type=int, default=1,
                    help="steps left out of the step time's median and the peak (the first gathers zero1's "
                         "params lazily and warms the allocator; at N = 4 on 2 cores the first ~5 run slower than the rest)")
    ap.add_argument("--out", default="out/strategies")
    ap.add_argument("--bin", default="build/bin", help="folder holding fsdp-train and fsdp-plan")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="run nothing: plan again the runs whose metrics are already in --out (a planner change "
                         "checked against the same measurements and profile)")
    ap.add_argument("--profile", default="",
                    help="fsdp-plan profile (e.g. from `mpirun -n 2 fsdp-plan --calibrate --out FILE`) for "
                         "the predicted step time; without it that column is left empty")
    ap.add_argument("extra", nargs="*", help="extra fsdp-train flags after --")
    a = ap.parse_args()
    rows = ["| preset | N | strategy | state bytes/rank | planner | DESIGN formula | peak bytes/rank | "
            "planner peak | peak err | comm bytes/step | planner | step s | planner step s | step err | "
            "exposed comm s | planner exposed s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for preset in a.presets.split(","):
        for n in [int(x) for x in a.nranks.split(",")]:
            for s in a.strategies.split(","):
                res, g = run(preset, n, s, a.steps, a.out, a.extra, a.bin, a.reuse_runs)
                if res is None:
                    rows.append(f"| {preset} | {n} | {s} | failed (see {a.out}) | | | | | | | | | | | | |")
                    continue
                cfg, steps = res
                p = plan(cfg, n, s, g, a.profile, a.bin)
                last = steps[-1]
                mem, comm = last["mem"], last["comm"]
                state = mem["param_shard_bytes"] + mem["grad_shard_bytes"] + mem["optim_state_bytes"]
                cbytes = sum(comm.get(f"{k}_bytes", 0) for k in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"))
                ms = p["model_state"]
                planned = ms["sharded_param_bytes"] + ms["sharded_grad_bytes"] + ms["optim_state_bytes"]
                name = s + (f" (G={p['shard_group_size']})" if s == "hybrid_shard" else "")
                # Step time: the median over the steps after the warm-up ones (the first gathers
                # zero1's params lazily and warms the allocator); peak: the largest over those steps.
                timed = steps[a.warmup_steps_skipped:] or steps[-1:]
                times = sorted(e["step_time_s"] for e in timed)
                step_s = times[len(times) // 2]
                peak = max(e["mem"]["peak_bytes"] for e in timed)
                peak_err = 100.0 * (p["peak"]["peak_bytes"] - peak) / peak
                step_plan = f"{p['time']['step_s']:.3f}" if a.profile else ""
                step_err = f"{100.0 * (p['time']['step_s'] - step_s) / step_s:+.1f}%" if a.profile else ""
                exposed = sorted(e["comm"].get("exposed_s", {}).get("total", 0.0) for e in timed)
                exposed_plan = f"{p['time']['exposed_comm_s']:.3f}" if a.profile else ""
                rows.append(f"| {preset} | {n} | {name} | {state:,} | {planned:,} | {ms['zero_paper_bytes']:,.0f} | "
                            f"{peak:,} | {p['peak']['peak_bytes']:,} | {peak_err:+.1f}% | {cbytes:,} | "
                            f"{p['traffic']['logical_bytes']:,} | {step_s:.3f} | {step_plan} | {step_err} | "
                            f"{exposed[len(exposed) // 2]:.3f} | {exposed_plan} |")
                print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())
