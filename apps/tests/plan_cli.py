#!/usr/bin/env python3
"""Tests of the fsdp-plan program as a user runs it, run by ctest (apps/CMakeLists.txt).

  plan_cli.py --bin build/bin/fsdp-plan
      * the headline figures (issue 14): a 7B model with AdamW in mixed precision needs 16 bytes per
        parameter, 112 GB per rank under DDP and 14 GB per rank with FULL_SHARD at N = 8, in the
        --json output and in the terminal table;
      * Llama-2-13B on 64 H100s: a recommendation that is not DDP (13B x 16 B = 208 GB > 80 GB),
        whose reason the output states;
      * Llama 3.1 8B on 8 and 128 H100s (issue 32): the published 0.344 at width 4096 in the JSON and
        the report's compute line, MFU < HFU < 0.344, HFU / MFU the recompute ratio,
        --compute-efficiency replacing the figure;
      * bad flags exit 2 with one line "fsdp-plan: error: ..." on stderr;
      * --calibrate under mpirun -n 2 writes a profile that --profile reads back, with the step
        update's seconds per tensor by size (skipped without mpirun); with 2 threads per rank on
        one bound core each, compute oversubscribes the cores: shared-core factors down to 0.1 and
        the update timed to each rank's own end, mean over ranks;
      * under mpirun -n 2 without --calibrate the plan, or an error, is printed once;
      * with --train-bin: fsdp-train --dry-run of gpt2 is at GPT-2's vocabulary unless --vocab-size
        is given, then the model and bytes are fsdp-plan's at that vocabulary.

Exit 0: pass; anything else: fail.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from e2e_common import launcher, torchrun_prefix

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, file=sys.stderr)


def plan(bin_path, *args, expect_rc=0):
    p = subprocess.run([bin_path, *args], capture_output=True, text=True, timeout=60)
    check(p.returncode == expect_rc,
          f"fsdp-plan {' '.join(args)}: exit {p.returncode}, expected {expect_rc}; stderr: {p.stderr.strip()}")
    return p


def flat(text):
    """The report's words, each run of blanks and line breaks one space (it wraps at 100 columns)."""
    return " ".join(text.split())


def by_strategy(doc):
    return {s["label"]: s for s in doc["strategies"]}


def headline(bin_path):
    args = ["--params", "7e9", "--world-size", "8", "--mixed-precision", "bf16"]
    doc = json.loads(plan(bin_path, *args, "--json").stdout)
    check(doc["bytes_per_param"]["engine"]["total"] == 16, "16 bytes per parameter (engine split)")
    check(doc["bytes_per_param"]["zero_paper"]["optimizer"] == 12, "ZeRO's K = 12 for mixed-precision Adam")
    s = by_strategy(doc)
    check(s["no_shard"]["model_state"]["total_bytes"] == 112_000_000_000,
          f"no_shard state {s['no_shard']['model_state']['total_bytes']}, expected 112e9")
    check(s["full_shard"]["model_state"]["total_bytes"] == 14_000_000_000,
          f"full_shard state {s['full_shard']['model_state']['total_bytes']}, expected 14e9")
    check(not s["no_shard"]["fits"], "112 GB of DDP model state cannot fit in 80 GB")
    text = plan(bin_path, *args).stdout
    rows = {}  # the first table (memory) names each strategy first
    for line in text.splitlines():
        if line.split():
            rows.setdefault(line.split()[0], line)
    check("112.0 GB" in rows.get("no_shard", ""), "the table's no_shard row shows 112.0 GB")
    check("14.0 GB" in rows.get("full_shard", ""), "the table's full_shard row shows 14.0 GB")


def llama13b_on_64_h100(bin_path):
    args = ["--model", "llama2-13b", "--world-size", "64", "--mixed-precision", "bf16", "--profile", "h100"]
    doc = json.loads(plan(bin_path, *args, "--json").stdout)
    r = doc["recommendation"]
    check(r["kind"] == "data_parallel" and r["strategy"] != "no_shard",
          f"13B on 64 H100s: a sharded data-parallel strategy, got {r['kind']} {r['label']}")
    check(len(r["reason"]) > 40 and "GB" in r["reason"], f"the reason states the numbers: {r['reason']!r}")
    text = flat(plan(bin_path, *args).stdout)
    check(f"Recommendation: {r['label']} at N = 64" in text, "the table names the recommendation")
    check("why: " + r["reason"] in text, "the table states the reason")
    # The h100 profile plans NCCL's in-place reduce-scatter; --reduce-scatter-route all_to_all the
    # MPI/Gloo route, whose received blocks raise full_shard's peak (docs/planner.md, "Peak").
    check(doc["inputs"]["reduce_scatter_route"] == "in_place", f"h100: in place, got {doc['inputs']}")
    check("reduce-scatter: in place" in text, "the table names the reduce-scatter's route")
    a2a = json.loads(plan(bin_path, *args, "--reduce-scatter-route", "all_to_all", "--json").stdout)
    check(a2a["inputs"]["reduce_scatter_route"] == "all_to_all", "--reduce-scatter-route all_to_all is taken")
    fs = by_strategy(doc)["full_shard"]["peak"]["peak_bytes"]
    fs_a2a = by_strategy(a2a)["full_shard"]["peak"]["peak_bytes"]
    check(fs < fs_a2a, f"full_shard's peak in place {fs} below all-to-all's {fs_a2a}")
    p = plan(bin_path, *args, "--reduce-scatter-route", "ring", expect_rc=2)
    check("--reduce-scatter-route: ring not in" in p.stderr, f"an unknown route refused: {p.stderr!r}")


def llama3_8b_on_h100s(bin_path):
    """The README's GPU example (issue 32): torchtitan's Llama 3.1 8B FSDP run on 8 and 128 H100s.
    The plan runs the matmuls at the h100 curve's published 34.4% of the bf16 peak at width 4096, so
    HFU stays below 0.344 and above MFU (the recompute counts in HFU only); the report's compute
    line says so; --compute-efficiency replaces the figure; --checkpoint-every needs
    --activation-checkpointing."""
    args = ["--model", "llama2-7b", "--n-kv-head", "8", "--ffn-hidden", "14336", "--vocab-size", "128256",
            "--block-size", "8192", "--seq-len", "8192", "--micro-batch-size", "2", "--ranks-per-node", "8",
            "--strategy", "full_shard", "--mixed-precision", "bf16", "--activation-checkpointing", "--profile", "h100",
            "--memory-per-rank", "96GB", "--json"]
    for n in ("8", "128"):
        t = json.loads(plan(bin_path, *args, "--world-size", n).stdout)["strategies"][0]["time"]
        check(t["matmul_efficiency"] == 0.344, f"N = {n}: the published figure at width 4096: {t['matmul_efficiency']}")
        check(0 < t["mfu"] < t["hfu"] < 0.344, f"N = {n}: MFU {t['mfu']} < HFU {t['hfu']} < 0.344")
        check(abs(t["hfu"] / t["mfu"] - t["flops"] / t["model_flops"]) < 1e-9, f"N = {n}: HFU / MFU = recompute ratio")
    text = flat(plan(bin_path, *args[:-1], "--world-size", "8").stdout)
    check("compute: bf16 matmuls at 34.4% of the 989.5 TFLOP/s peak (the profile's achieved efficiency for width 4096;"
          in text, f"the report names the figure it used: {text[:600]!r}")
    check("activation checkpointing profile" in text, "every block recomputed")
    every2 = flat(plan(bin_path, *args[:-1], "--world-size", "8", "--checkpoint-every", "2").stdout)
    check("activation checkpointing of every 2nd block" in every2, "the header's ordinal")
    given = flat(plan(bin_path, *args[:-1], "--world-size", "8", "--compute-efficiency", "1").stdout)
    check("compute: bf16 matmuls at 100.0% of the 989.5 TFLOP/s peak (--compute-efficiency)" in given,
          "the user's figure is named as the user's, 1 included")
    between = flat(plan(bin_path, "--model", "llama2-13b", "--world-size", "64", "--mixed-precision", "bf16",
                        "--profile", "a100").stdout)
    check("at 58.0% of the 312 TFLOP/s peak (width 5120, between the profile's achieved efficiencies for widths 4096 "
          "and 8192" in between, "an interpolated figure is called one")
    p = plan(bin_path, *args[:-1], "--world-size", "8", "--compute-efficiency", "nan", expect_rc=2)
    check("--compute-efficiency: 'nan' is not a finite number (expected one in [0.01, 1])" in p.stderr,
          f"nan refused: {p.stderr!r}")
    full = json.loads(plan(bin_path, *args, "--world-size", "8", "--compute-efficiency", "1").stdout)
    check(full["strategies"][0]["time"]["matmul_efficiency"] == 1.0 and full["strategies"][0]["time"]["hfu"] > 0.344,
          "--compute-efficiency 1 replaces the published figure")
    p = plan(bin_path, "--model", "micro", "--checkpoint-every", "2", expect_rc=2)
    check("needs --activation-checkpointing" in p.stderr, f"--checkpoint-every alone refused: {p.stderr!r}")


def first_hour(bin_path):
    """What a new user reads: realistic defaults, a note where a default decided, 100 columns.
    * no --profile: the plan says it plans the built-in h100 and how to calibrate CPU ranks;
      with --profile h100 it does not;
    * fp32 on the h100 profile is not planned at its bare peak (the MFU stays below bf16's 34%);
    * every line of the report, LoRA's included, fits 100 columns;
    * --lora-rank: the trainable share and the frozen base's bytes (4 B per parameter)."""
    text = flat(plan(bin_path, "--model", "llama2-7b", "--world-size", "8").stdout)
    check("note: no --profile given, so this plans GPUs of the built-in h100; for CPU ranks measure your machine" in text,
          "no --profile: the default is named")
    check("no --profile" not in plan(bin_path, "--model", "llama2-7b", "--world-size", "8", "--profile", "h100").stdout,
          "--profile h100 given: no note")
    for args in (["--model", "llama2-13b", "--world-size", "64", "--mixed-precision", "bf16"],
                 ["--model", "gpt2-xl", "--world-size", "4", "--lora-rank", "8", "--activation-checkpointing"],
                 ["--model", "nano", "--world-size", "2", "--profile", "a100"]):
        wide = [l for l in plan(bin_path, *args).stdout.splitlines() if len(l) > 100]
        check(not wide, f"fsdp-plan {' '.join(args)}: {len(wide)} line(s) over 100 columns, e.g. {wide[:1]}")
    doc = json.loads(plan(bin_path, "--model", "llama2-7b", "--world-size", "8", "--json").stdout)
    mfu = [s["time"]["mfu"] for s in doc["strategies"]]
    check(max(mfu) < 0.344, f"fp32 on h100 below bf16's published 34.4% MFU, not at the peak: {mfu}")
    full = by_strategy(json.loads(plan(bin_path, "--model", "llama2-7b", "--world-size", "2", "--strategy",
                                       "full_shard", "--json").stdout))["full_shard"]
    lora_text = flat(plan(bin_path, "--model", "llama2-7b", "--world-size", "2", "--strategy", "full_shard",
                          "--lora-rank", "8").stdout)
    lora = by_strategy(json.loads(plan(bin_path, "--model", "llama2-7b", "--world-size", "2", "--strategy",
                                       "full_shard", "--lora-rank", "8", "--json").stdout))["full_shard"]
    trainable = 32 * 2 * 8 * (4096 + 4096)  # q_proj and v_proj of 32 blocks: r (in + out) each
    check(f"trainable: {trainable:,} params" in lora_text, "the trainable share is named: %r" % lora_text[:600])
    check(lora["model_state"]["optim_state_bytes"] == 8 * trainable // 2 and
          lora["model_state"]["sharded_grad_bytes"] == 4 * trainable // 2,
          f"LoRA: optimizer state and grads of the adapters only: {lora['model_state']}")
    check(lora["model_state"]["sharded_param_bytes"] > full["model_state"]["sharded_param_bytes"],
          "the frozen base keeps its fp32 rows (plus the adapters')")
    same = json.loads(plan(bin_path, "--model", "llama2-7b", "--world-size", "2", "--strategy", "full_shard",
                           "--lora-rank", "8", "--lora-alpha", "16", "--lora-dropout", "0.1", "--json").stdout)
    check(by_strategy(same)["full_shard"]["model_state"] == lora["model_state"],
          "fsdp-train's --lora-alpha and --lora-dropout are taken and change no byte")
    p = plan(bin_path, "--model", "llama2-7b", "--lora-rank", "8", "--lora-target-modules", "c_attn", expect_rc=2)
    check("LoRA target 'c_attn' names no Linear layer of llama2-7b" in p.stderr, f"a wrong target: {p.stderr!r}")


def usage_errors(bin_path):
    for args in (["--world-size", "0"], ["--strategy", "zero9"], ["--model", "gpt5"],
                 ["--memory-per-rank", "eighty"], ["--strategy", "full_shard", "--hybrid-shard-group-size", "2"],
                 ["--checkpoint-every", "0"], ["--nics-per-node", "0"]):
        p = plan(bin_path, *args, expect_rc=2)
        lines = p.stderr.strip().splitlines()
        check(len(lines) == 1 and lines[0].startswith("fsdp-plan: error:"),
              f"{args}: one error line on stderr, got {p.stderr!r}")
    p = plan(bin_path, "--forward-prefetch", "maybe", expect_rc=2)
    check("--forward-prefetch: 'maybe' is not true or false" in p.stderr,
          f"a bool flag's bad value named in words: {p.stderr!r}")
    # Numbers in words with readable bounds (fsdp-train's validators), and an empty value (an unset
    # shell variable) refused, not read as the option left out.
    for args, says in ((["--nics-per-node", "0"], "--nics-per-node: 0 is outside [1, 1099511627776]"),
                       (["--checkpoint-every", "0"], "--checkpoint-every: 0 is outside [1, 1099511627776]"),
                       (["--world-size", "2.5"], "--world-size: '2.5' is not an integer in [1, 1048576]"),
                       (["--headroom", "nan"], "--headroom: 'nan' is not a finite number (expected one in [0, 0.99])"),
                       (["--memory-per-rank", ""], "--memory-per-rank: is empty (an unset shell variable?)"),
                       (["--profile", ""], "--profile: is empty"),
                       (["--memory-per-rank=", "--json"], "--memory-per-rank: is empty"),
                       (["--inter-node-bandwidth", "1bit"], "--inter-node-bandwidth '1bit' is 0 B/s each direction, outside [1 B/s, 1e18 B/s]"),
                       (["--inter-node-bandwidth", "200"],
                        "--inter-node-bandwidth '200' is not a link rate like 200Mbit, 10Gbit/s, 25Gbps or 3GB/s")):
        p = plan(bin_path, "--model", "micro", *args, expect_rc=2)
        check(says in p.stderr and len(p.stderr) < 300, f"{args}: {says!r} in {p.stderr!r}")


def wire_codecs(bin_path):
    """--all-gather-codec int8: each all-gather carries one byte per element and a 4-byte scale per
    256 (1.0156 of 1 B against fp32's 4 B), nothing else changes; refused with no_shard."""
    base = ["--model", "gpt2", "--world-size", "4", "--ranks-per-node", "2", "--json"]
    exact = by_strategy(json.loads(plan(bin_path, *base).stdout))
    int8 = by_strategy(json.loads(plan(bin_path, *base, "--all-gather-codec", "int8").stdout))
    for label in ("full_shard", "shard_grad_op", "zero1", "hybrid_shard(G=2)"):
        a, b = exact[label]["traffic"], int8[label]["traffic"]
        ratio = b["all_gather"]["logical_bytes"] / a["all_gather"]["logical_bytes"]
        check(abs(ratio - 1.015625 / 4) < 1e-3 and b["all_gather"]["calls"] == a["all_gather"]["calls"],
              f"{label}: int8 all-gathers carry 1.0156/4 of fp32's bytes, got {ratio}")
        check(b["reduce_scatter"] == a["reduce_scatter"] and exact[label]["model_state"] == int8[label]["model_state"],
              f"{label}: gradients and model state unchanged by the all-gather codec")
    check(exact["no_shard"]["traffic"] == int8["no_shard"]["traffic"], "no_shard gathers nothing to encode")
    # --reshard-after-forward host (2 ranks per node of 4): full_shard's backward gathers go to the
    # node group, the same bytes over 2 ranks; applied where it divides the shard group only.
    hpz_doc = json.loads(plan(bin_path, *base, "--all-gather-codec", "int8", "--reshard-after-forward", "host").stdout)
    check(hpz_doc["inputs"]["all_gather_codec"] == "int8" and hpz_doc["inputs"]["reshard_after_forward_group_size"] == -1,
          f"the options are in the JSON's inputs: {hpz_doc['inputs']}")
    hpz = by_strategy(json.loads(plan(bin_path, *base, "--reshard-after-forward", "host").stdout))
    check("full_shard(node=2)" in hpz and "full_shard" not in hpz and "hybrid_shard(G=2)" in hpz
          and hpz["full_shard(node=2)"]["reshard_after_forward_group_size"] == 2,
          f"labels with the node-local reshard where it applies: {sorted(hpz)}")
    fs, node = exact["full_shard"]["traffic"]["all_gather"], hpz["full_shard(node=2)"]["traffic"]["all_gather"]
    check(node["calls"] == fs["calls"] and node["wire_bytes"] < fs["wire_bytes"],
          f"the backward's gathers over 2 ranks instead of 4: {node} vs {fs}")
    for args, says in ((["--strategy", "zero1", "--reshard-after-forward", "2"], "applies to --strategy full_shard or hybrid_shard"),
                       (["--world-size", "4", "--strategy", "full_shard", "--reshard-after-forward", "3"],
                        "--reshard-after-forward (reshard_after_forward_group_size) 3 must divide the shard group size 4")):
        p = plan(bin_path, *args, expect_rc=2)
        check(says in p.stderr, f"{args}: {p.stderr!r}")
    p = plan(bin_path, "--strategy", "no_shard", "--all-gather-codec", "int8", expect_rc=2)
    check("--all-gather-codec int8 applies to strategies that all-gather params, not no_shard" in p.stderr,
          f"int8 with no_shard refused in one line: {p.stderr!r}")
    # --host-aware-collectives host (2 ranks per node of 4): every gather and reduction of full_shard
    # is two calls, and the bytes in collectives that cross nodes fall by half (2 ranks per host);
    # --reduce-scatter-codec int8 then sends the cross-node stage as an all-to-all of int8 payloads.
    host_doc = json.loads(plan(bin_path, *base, "--host-aware-collectives", "host", "--reduce-scatter-codec", "int8").stdout)
    check(host_doc["inputs"]["collective_host_size"] == -1 and host_doc["inputs"]["reduce_scatter_codec"] == "int8",
          f"the options are in the JSON's inputs: {host_doc['inputs']}")
    host = by_strategy(json.loads(plan(bin_path, *base, "--host-aware-collectives", "host").stdout))
    check("full_shard(host=2)" in host and "no_shard" in host and "hybrid_shard(G=2)" in host,
          f"labels with host-aware collectives where they apply: {sorted(host)}")
    fs, ha = exact["full_shard"]["traffic"], host["full_shard(host=2)"]["traffic"]
    check(ha["all_gather"]["calls"] == 2 * fs["all_gather"]["calls"]
          and ha["reduce_scatter"]["calls"] == 2 * fs["reduce_scatter"]["calls"],
          f"two stages per collective: {ha} vs {fs}")
    qgz = by_strategy(host_doc)["full_shard(host=2)"]["traffic"]
    check(qgz["all_to_all"]["calls"] == fs["reduce_scatter"]["calls"]
          and qgz["reduce_scatter"]["calls"] == fs["reduce_scatter"]["calls"]
          and abs(qgz["all_to_all"]["logical_bytes"] / (fs["reduce_scatter"]["logical_bytes"] / 2) - 1.015625 / 4) < 2e-3,
          f"the cross-host stage as int8 payloads of 2 of the 4 blocks: {qgz}")
    for args, says in ((["--strategy", "no_shard", "--reduce-scatter-codec", "int8"],
                        "--reduce-scatter-codec int8 applies to strategies that reduce-scatter gradients, not no_shard"),
                       (["--world-size", "4", "--strategy", "full_shard", "--host-aware-collectives", "3"],
                        "--host-aware-collectives (collective_host_size) 3 must divide the shard group size 4")):
        p = plan(bin_path, *args, expect_rc=2)
        check(says in p.stderr, f"{args}: {p.stderr!r}")


def two_ranks(mpirun_flags=()):
    """The command that starts 2 ranks of the program that follows it: mpirun, or torchrun over Gloo
    when FSDP_E2E_LAUNCHER=torchrun (a build without MPI); None when mpirun is wanted and missing."""
    if launcher() == "torchrun":
        return torchrun_prefix(2)
    mpirun = shutil.which("mpirun")
    return [mpirun, "--allow-run-as-root", "--oversubscribe", *mpirun_flags, "-n", "2"] if mpirun else None


def run_calibration(prefix, bin_path, out, threads, timeout=180):
    """2 ranks (`prefix`) of fsdp-plan --calibrate of a one-layer nano at micro-batch 2 x 64 into `out`."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return subprocess.run([*prefix, bin_path,
                           "--calibrate", "--threads", str(threads), "--out", out, "--model", "nano", "--n-layer", "1",
                           "--micro-batch-size", "2", "--seq-len", "64"], capture_output=True, text=True,
                          timeout=timeout, env=env)


def calibrate(bin_path, tmp):
    prefix = two_ranks()
    if not prefix:
        print("calibrate: skipped (no mpirun)")
        return
    out = os.path.join(tmp, "profile.json")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = run_calibration(prefix, bin_path, out, 1)
    check(p.returncode == 0, f"--calibrate: exit {p.returncode}; {p.stderr.strip()}")
    if p.returncode != 0:
        return
    with open(out) as f:
        prof = json.load(f)
    check(prof["calibration"]["world_size"] == 2, "the profile records the calibrated world size")
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        link = prof["collectives"][kind]["intra_node"]
        check(link["bandwidth_bytes_per_s"] > 1e6, f"{kind}: a measured bandwidth, got {link}")
    check(prof["matmul_flops_per_s"]["fp32"] > 1e8, f"a measured fp32 rate: {prof['matmul_flops_per_s']}")
    mf = prof["model_flops_per_s"]
    check(mf["fp32"] > 1e8 and mf["bf16"] > 1e8 and mf["fp16"] == 0,
          f"measured model rates, fp32 and bf16 (fp16 only when asked): {mf}")
    up = prof["step_update_s_per_elem"]
    check(all(up[k] > 0 for k in ("adamw", "sgd-momentum", "sgd")), f"measured step-update times: {up}")
    pts = prof["step_update_points_numel_seconds"]
    for k in ("adamw", "sgd-momentum", "sgd"):
        sizes = [e for e, _ in pts[k]]
        check(sizes == [1 << b for b in range(10, 25, 2)] and all(s > 0 for _, s in pts[k]),
              f"{k}: seconds per tensor measured at 1k..16M elements: {pts[k]}")
        # The per-element rate above the points is the largest's. (No test compares two measured
        # times: on a busy machine any two timings may come out in either order.)
        check(abs(up[k] - pts[k][-1][1] / pts[k][-1][0]) <= 1e-12 * up[k] + 1e-18,
              f"{k}: step_update_s_per_elem is the largest point's rate: {up[k]} vs {pts[k][-1]}")
    st_one = json.loads(plan(bin_path, "--model", "nano", "--world-size", "1", "--profile", out, "--json",
                             "--strategy", "no_shard").stdout)["strategies"][0]["time"]
    check(st_one["update_s"] > 0, f"an update time from the calibrated points: {st_one}")
    check(prof["comm_overlaps_compute"] == (2 * 2 <= os.cpu_count()),
          f"2 ranks x (1 + 1) threads overlap only on >= 4 cores: {prof['comm_overlaps_compute']}")
    check(1e8 < prof["memory_copy_bytes_per_s"] < 1e13, f"a measured copy rate: {prof['memory_copy_bytes_per_s']}")
    factors = {k: prof["collectives"][k]["shared_core_factor"] for k in ("all_gather", "reduce_scatter", "all_reduce")}
    if prof["comm_overlaps_compute"]:
        check(all(f == 1.0 for f in factors.values()), f"overlapping cores: no shared-core factor measured: {factors}")
    else:
        # Measured beside a training pass: at least 1 (a step waits for its collectives), bounded;
        # at least 0.1 where the compute threads alone oversubscribe the cores.
        over = 2 * 1 > os.cpu_count()
        check(prof["compute_oversubscribed"] == over, f"2 ranks x 1 thread oversubscribe {os.cpu_count()} cores: {over}")
        low = 0.1 if over else 1.0
        check(all(f >= low for f in factors.values()), f"shared-core factors, clamped at {low}: {factors}")
        check(any(s.startswith("shared_core_factor: per kind") for s in prof["sources"]),
              f"the profile says how the factors were measured: {prof['sources']}")
    check(st_one["copy_s"] > 0, f"the engine's copies timed at the measured rate: {st_one}")
    doc = json.loads(plan(bin_path, "--model", "nano", "--world-size", "2", "--profile", out, "--json").stdout)
    check(doc["profile"]["name"] == prof["name"], "--profile reads the calibrated file back")
    check(all(s["time"]["step_s"] > 0 for s in doc["strategies"]), "a step time from the calibrated rates")
    st = doc["strategies"][0]["time"]
    check(abs(st["compute_s"] - st["flops"] / mf["fp32"]) <= 1e-9 * st["compute_s"],
          "compute time = FLOPs / the measured model rate")
    check(st["matmul_efficiency"] == 0.0, "a measured model rate: no efficiency applied")
    text = plan(bin_path, "--model", "nano", "--world-size", "2", "--profile", out).stdout
    check("compute: fp32 at the profile's measured model rate" in text, f"the compute line names the measured rate: "
          f"{[l for l in text.splitlines() if 'compute:' in l]}")
    # 4 ranks on a profile calibrated on one node of 2: the node size is the profile's, and said so.
    text = flat(plan(bin_path, "--model", "nano", "--world-size", "4", "--profile", out).stdout)
    check("note: 4 ranks span 2 nodes because the profile's node holds 2 ranks; --ranks-per-node says" in text,
          f"the node size a default decided is named: {text[:800]}")
    text = plan(bin_path, "--model", "nano", "--world-size", "4", "--profile", out, "--ranks-per-node", "4").stdout
    check("nodes because" not in text, "--ranks-per-node given: no note")
    # --inter-node-bandwidth: the link between the calibrated nodes, named in the profile's sources;
    # the same plan's collectives across nodes take longer on a slower link (two computed figures).
    def crossing(rate):
        d = json.loads(plan(bin_path, "--model", "nano", "--world-size", "4", "--ranks-per-node", "2",
                            "--strategy", "full_shard", "--profile", out, "--json",
                            "--inter-node-bandwidth", rate).stdout)
        return d["strategies"][0]["time"]["comm_s"], d["profile"]
    slow, slow_profile = crossing("200Mbit")
    fast, _ = crossing("100Gbit")
    check(slow > fast > 0, f"comm_s at 200 Mbit/s {slow} above 100 Gbit/s {fast}")
    check(any("--inter-node-bandwidth" in s and "25.0 MB/s" in s for s in slow_profile.get("sources", [])),
          f"the sources name the link: {slow_profile.get('sources')}")
    text = plan(bin_path, "--model", "nano", "--world-size", "4", "--ranks-per-node", "2", "--profile", out,
                "--inter-node-bandwidth", "200Mbit").stdout
    check("link between nodes 200Mbit (25.0 MB/s each direction): --inter-node-bandwidth" in text,
          f"the report names the link: {text[:600]}")
    # --compute-efficiency scales a datasheet peak, not a measured step.
    p = plan(bin_path, "--model", "nano", "--world-size", "2", "--profile", out, "--compute-efficiency", "0.5",
             expect_rc=2)
    check("already what a step reaches" in p.stderr, f"--compute-efficiency with a measured rate refused: {p.stderr!r}")
    # One rank: a profile without collectives, for N = 1 only.
    one = os.path.join(tmp, "profile1.json")
    p = subprocess.run([bin_path, "--calibrate", "--out", one, "--model", "nano", "--n-layer", "1",
                        "--micro-batch-size", "2", "--seq-len", "64"], capture_output=True, text=True,
                       timeout=180, env=env)
    check(p.returncode == 0, f"--calibrate on one rank: exit {p.returncode}; {p.stderr.strip()[-300:]}")
    if p.returncode == 0:
        with open(one) as f:
            check(json.load(f)["collectives"] is None, "a one-rank profile has no collectives")
        plan(bin_path, "--model", "nano", "--world-size", "1", "--profile", one)
        p = plan(bin_path, "--model", "nano", "--world-size", "2", "--profile", one, expect_rc=2)
        check("calibrated on one rank" in p.stderr, f"planning N = 2 with it is refused: {p.stderr!r}")
        p = plan(bin_path, "--model", "nano", "--profile", one, "--inter-node-bandwidth", "1Gbit", expect_rc=2)
        check("has no collective figures" in p.stderr, f"a link rate for a one-rank profile refused: {p.stderr!r}")


def calibrate_oversubscribed(bin_path, tmp):
    """Compute that oversubscribes the cores, on any machine: 2 ranks x 2 intra-op threads where
    mpirun binds each rank to one core (the default for 2 ranks) need 4 cores of the 2 the ranks may
    use. The profile says so; the collectives' shared-core factors are at least 0.1; the step update
    is timed to each rank's own end, mean over ranks; the plan uses the profile."""
    if launcher() == "torchrun":
        print("calibrate_oversubscribed: skipped (binding ranks to cores is mpirun's)")
        return
    prefix = two_ranks(("--bind-to", "core"))
    if not prefix:
        print("calibrate_oversubscribed: skipped (no mpirun)")
        return
    out = os.path.join(tmp, "profile_over.json")
    p = run_calibration(prefix, bin_path, out, 2, timeout=240)
    check(p.returncode == 0, f"--calibrate --threads 2: exit {p.returncode}; {p.stderr.strip()[-400:]}")
    if p.returncode != 0:
        return
    with open(out) as f:
        prof = json.load(f)
    check(prof["compute_oversubscribed"] and not prof["comm_overlaps_compute"],
          f"2 ranks x 2 threads on 2 bound cores oversubscribe them: {prof['compute_oversubscribed']}")
    factors = {k: prof["collectives"][k]["shared_core_factor"] for k in ("all_gather", "reduce_scatter", "all_reduce")}
    check(all(f >= 0.1 for f in factors.values()), f"shared-core factors, clamped at 0.1: {factors}")
    check(any(s.startswith("step_update_points") and "mean over ranks" in s for s in prof["sources"]),
          f"the update timed to each rank's own end, mean over ranks: {prof['sources']}")
    doc = json.loads(plan(bin_path, "--model", "nano", "--world-size", "2", "--profile", out, "--json",
                          "--strategy", "full_shard").stdout)
    t = doc["strategies"][0]["time"]
    check(t["step_s"] >= t["compute_s"] + t["update_s"] + t["copy_s"],
          f"a time-shared step is at least its compute, update and copies: {t}")


def under_mpirun(bin_path):
    """Planning runs no collective: under mpirun only rank 0 prints the plan, or the error."""
    prefix = two_ranks()
    if not prefix:
        print("under_mpirun: skipped (no mpirun)")
        return
    base = [*prefix, bin_path]
    p = subprocess.run(base + ["--model", "micro", "--world-size", "2"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and p.stdout.count("Recommendation:") == 1,
          f"mpirun -n 2 fsdp-plan prints the plan once: rc {p.returncode}, {p.stdout.count('Recommendation:')} plans")
    for args in (["--model", "gpt5"], ["--world-size", "3", "--strategy", "hybrid_shard", "--hybrid-shard-group-size", "2"]):
        p = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        check(p.returncode != 0 and p.stderr.count("fsdp-plan: error:") == 1,
              f"mpirun -n 2 fsdp-plan {args}: one error line, got {p.stderr.count('fsdp-plan: error:')}")


def dry_run_vocab(bin_path, train_bin):
    """fsdp-train --dry-run of a gpt2 preset: GPT-2's 50257 tokens unless --vocab-size is given,
    then the same model as fsdp-plan's at that vocabulary, byte for byte; gpt2-xl, llama-tiny and
    llama2-7b have the same parameter count in both (the preset's own vocabulary)."""
    if not train_bin:
        return

    def dry(*args):
        p = subprocess.run([train_bin, "--dry-run", "--world-size", "8", "--model", "gpt2", *args],
                           capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"dry run {args}: exit {p.returncode}; {p.stderr.strip()[-300:]}")
        params = re.search(r"\((\d+) params", p.stdout)
        shard = re.search(r"^\s*params\s.*?(\d+) bytes$", p.stdout, re.M)
        return int(params.group(1)) if params else -1, int(shard.group(1)) if shard else -1

    n_default, _ = dry()
    check(n_default == 124439808, f"gpt2 dry run at GPT-2's vocabulary: {n_default} params (want 124,439,808)")
    # One table of presets: fsdp-plan and the dry run take each preset at the same vocabulary.
    for preset, want in (("gpt2-xl", 1557611200), ("llama-tiny", 1139520), ("llama2-7b", 6738415616)):
        d = subprocess.run([train_bin, "--dry-run", "--world-size", "8", "--model", preset], capture_output=True,
                           text=True, timeout=120)
        got = re.search(r"\((\d+) params", d.stdout)
        doc = json.loads(plan(bin_path, "--model", preset, "--world-size", "8", "--json").stdout)
        check(got and int(got.group(1)) == want == doc["model"]["num_params"],
              f"{preset}: dry run {got and got.group(1)} params, fsdp-plan {doc['model']['num_params']}, want {want}")
    n, shard_bytes = dry("--vocab-size", "8192")
    doc = json.loads(plan(bin_path, "--model", "gpt2", "--vocab-size", "8192", "--world-size", "8",
                          "--strategy", "full_shard", "--json").stdout)
    check(n == doc["model"]["num_params"], f"--vocab-size 8192: {n} params, fsdp-plan {doc['model']['num_params']}")
    want = doc["strategies"][0]["model_state"]["sharded_param_bytes"]
    check(shard_bytes == want, f"--vocab-size 8192: params {shard_bytes} bytes per rank, fsdp-plan {want}")
    # The slow-link options wrap the model as training does (the int8 codec on meta tensors too).
    n_int8, shard_int8 = dry("--vocab-size", "8192", "--all-gather-codec", "int8", "--reshard-after-forward", "2",
                             "--host-aware-collectives", "2", "--reduce-scatter-codec", "int8")
    check((n_int8, shard_int8) == (n, shard_bytes), f"dry run with the slow-link options: {n_int8}, {shard_int8}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--train-bin", default="", help="fsdp-train, for the dry-run checks")
    a = ap.parse_args()
    headline(a.bin)
    llama13b_on_64_h100(a.bin)
    llama3_8b_on_h100s(a.bin)
    first_hour(a.bin)
    usage_errors(a.bin)
    wire_codecs(a.bin)
    under_mpirun(a.bin)
    dry_run_vocab(a.bin, a.train_bin)
    with tempfile.TemporaryDirectory() as tmp:
        calibrate(a.bin, tmp)
        calibrate_oversubscribed(a.bin, tmp)
    print(f"{len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
