#!/usr/bin/env python3
"""Bytes on the links between test hosts, per training step, against the formula; step times.

  bench/hosts/link_traffic.py --bin build/bin/fsdp-train --data-dir ./data [--rate 1gbit]
      [--model gpt2] [--strategies full_shard,hybrid_shard,no_shard,full_shard+int8+hpz+host+qgz]

A strategy may carry options after '+': int8 (--all-gather-codec int8), hpz
(--reshard-after-forward host), host (--host-aware-collectives host), qgz
(--reduce-scatter-codec int8).

Makes 2 test hosts (scripts/hosts.sh up 2 [RATE]), runs fsdp-train on 2 hosts x 2 ranks for 1
and for S steps (--steps, default 2) per strategy, and reports for each strategy:
  * link bytes of one step: what host 1's interface received during the S-step run minus during
    the 1-step run, over S - 1 (set-up, evaluation and shutdown cancel out);
  * the formula: inter_host_bytes of step 2 of the metrics (rank 0; [Note: host traffic] in
    include/fsdp/comm/comm_stats.h), and measured / (2 ranks x formula): 1.0 when every rank
    fetches its own copy across the link (pairwise), 0.5 when each byte crosses once per host;
  * the median step_time_s of steps 2..S and the largest peak memory of rank 0 (mem.peak_bytes)
    among them;
  * the planner's prediction of the formula: fsdp-plan's traffic.inter_node_bytes for the same
    layout and options (--plan-bin, default fsdp-plan beside --bin); with --plan-profile (a
    profile from `mpirun -n 4 fsdp-plan --calibrate` on this machine) also its step time and peak
    per rank, the link given to it as --inter-node-bandwidth (--rate, or --unlimited-rate).
Prints one Markdown table row per strategy. Needs root (network namespaces); the hosts are
removed at the end, also after a failure.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = os.path.join(HERE, "..", "..", "scripts", "hosts.sh")


def counters(env):
    out = subprocess.run(["bash", HOSTS, "counters"], env=env, text=True,
                         stdout=subprocess.PIPE, check=True).stdout
    return {l.split()[0]: int(l.split()[1]) for l in out.splitlines() if l.strip()}


def steps(path):
    with open(path) as f:
        return [e for e in map(json.loads, f) if e.get("event") == "step"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--rate", default="", help="tbf rate of every host link, e.g. 1gbit")
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--strategies", default="full_shard,hybrid_shard,no_shard")
    ap.add_argument("--batch", default="4", help="--global-batch-size")
    ap.add_argument("--seq-len", default="64")
    ap.add_argument("--plan-bin", default="", help="fsdp-plan (default: beside --bin)")
    ap.add_argument("--vocab-size", default="8192", help="the tokenizer's, for fsdp-plan")
    ap.add_argument("--plan-profile", default="", help="a calibrated profile for the planner's step time and peak")
    ap.add_argument("--unlimited-rate", default="",
                    help="with --plan-profile and no --rate: the veth link's rate for the planner, e.g. 20Gbit")
    ap.add_argument("--steps", type=int, default=2, help="steps of the timed run (at least 2)")
    ap.add_argument("--times-only", action="store_true",
                    help="skip the 1-step runs (step times only, no link bytes)")
    a = ap.parse_args()
    if a.steps < 2:
        raise SystemExit("--steps must be at least 2")
    prefix = "fsdpb"
    tmp = tempfile.mkdtemp(prefix="fsdp-link-traffic-")
    env = dict(os.environ, FSDP_HOSTS_PREFIX=prefix, FSDP_HOSTS_DIR=os.path.join(tmp, "hosts"),
               OMP_NUM_THREADS="1")
    subprocess.run(["bash", HOSTS, "up", "2"] + ([a.rate] if a.rate else []), env=env, check=True)
    try:
        with open(os.path.join(env["FSDP_HOSTS_DIR"], "mpirun_args")) as f:
            mpirun_args = f.read().split()
        print("| strategy | link | formula: inter_host_bytes per rank per step | planner: inter_node_bytes "
              "| measured: host 1 received per step | measured / (2 ranks x formula) | step time (s) | "
              "planner: step time (s) | peak per rank | planner: peak per rank |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        plan_bin = a.plan_bin or os.path.join(os.path.dirname(os.path.abspath(a.bin)), "fsdp-plan")
        options = {"int8": ["--all-gather-codec", "int8"], "hpz": ["--reshard-after-forward", "host"],
                   "host": ["--host-aware-collectives", "host"], "qgz": ["--reduce-scatter-codec", "int8"]}
        for label in a.strategies.split(","):
            strategy, *opts = label.split("+")
            extra = ["--hybrid-shard-group-size", "host"] if strategy == "hybrid_shard" else []
            for o in opts:
                extra += options[o]
            rx = {}
            for n in ((a.steps,) if a.times_only else (1, a.steps)):
                m = os.path.join(tmp, "%s-%d.jsonl" % (label, n))
                c0 = counters(env)
                cmd = ["bash", HOSTS, "exec", prefix + "0", "mpirun", "--allow-run-as-root",
                       "--bind-to", "none", "-x", "OMP_NUM_THREADS"] + mpirun_args + \
                      ["-npernode", "2", os.path.abspath(a.bin), "--data-dir",
                       os.path.abspath(a.data_dir), "--model", a.model, "--global-batch-size",
                       a.batch, "--seq-len", a.seq_len, "--steps", str(n), "--eval-every", "0",
                       "--eval-batches", "1", "--progress", "lines", "--strategy", strategy,
                       "--metrics", m] + extra
                p = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
                if p.returncode != 0:
                    sys.stderr.write(p.stdout[-3000:])
                    raise SystemExit("run failed: %s" % " ".join(cmd))
                rx[n] = counters(env)[prefix + "1"] - c0[prefix + "1"]
                timed = steps(m)[1:]
            last = timed[-1]
            step_s = statistics.median(e["step_time_s"] for e in timed)
            peak_bytes = max(e["mem"]["peak_bytes"] for e in timed)
            formula = last["comm"]["inter_host_bytes"]
            # fsdp-plan's hybrid group size is a number: 2 ranks per host here.
            plan_extra = ["2" if i and extra[i - 1] == "--hybrid-shard-group-size" else v for i, v in enumerate(extra)]
            if a.plan_profile:
                plan_extra += ["--profile", a.plan_profile]
                if a.rate or a.unlimited_rate:
                    plan_extra += ["--inter-node-bandwidth", a.rate or a.unlimited_rate]
            pl = subprocess.run([plan_bin, "--model", a.model, "--vocab-size", a.vocab_size, "--world-size", "4",
                                 "--ranks-per-node", "2", "--global-batch-size", a.batch, "--seq-len", a.seq_len,
                                 "--strategy", strategy, "--json"] + plan_extra, text=True, stdout=subprocess.PIPE)
            plan = json.loads(pl.stdout)["strategies"][0] if pl.returncode == 0 else None
            planned = plan["traffic"]["inter_node_bytes"] if plan else None
            plan_step = "%.1f" % plan["time"]["step_s"] if plan and a.plan_profile else "-"
            plan_peak = "%.0f MB" % (plan["peak"]["peak_bytes"] / 1e6) if plan else "-"
            if a.times_only:
                measured, ratio = "-", "-"
            else:
                per_step = (rx[a.steps] - rx[1]) / (a.steps - 1)
                measured = "%.1f MB" % (per_step / 1e6)
                ratio = "%.2f" % (per_step / (2 * formula))
            print("| %s | %s | %.1f MB | %s | %s | %s | %.1f | %s | %.0f MB | %s |" % (
                label, a.rate or "veth, no limit", formula / 1e6,
                "-" if planned is None else "%.1f MB" % (planned / 1e6), measured, ratio,
                step_s, plan_step, peak_bytes / 1e6, plan_peak), flush=True)
    finally:
        subprocess.run(["bash", HOSTS, "down"], env=env)


if __name__ == "__main__":
    main()
