#!/usr/bin/env python3
"""End-to-end tests of fsdp-train, run by ctest (apps/CMakeLists.txt) under mpirun.

  train_e2e.py parity  --bin build/bin/fsdp-train --data-dir ./data
      --mixed-precision fp32 --strategy full_shard: the losses of the first 20 steps at N = 1, 2
      and 4 agree within 1e-4 relative (issue 3).

  train_e2e.py meta_init  --bin ... --data-dir ...
      --meta-init (built on the meta device, each rank writes only its rows): 4 steps at N = 2 of
      full_shard and no_shard, fp32 and bf16, of zero1 and shard_grad_op in fp32, and of full_shard
      fp32 at N = 1, have the losses and gradient norms of the same run built normally, bit for
      bit (the shards are bitwise those of the normal build, and the training path is the same);
      --meta-init with --dry-run (which always builds on the meta device) is a usage error naming
      both flags (exit 2).

  train_e2e.py activations  --bin ... --plan build/bin/fsdp-plan --data-dir ...
      mem.activation_bytes of a step (what one micro-batch's forward leaves for its backward) is
      fsdp-plan's activations.total_saved_bytes for the same run within 0.1%, in fp32 and bf16,
      with and without --activation-checkpointing (N = 1), and checkpointing lowers it.

  train_e2e.py budget  --bin ... --data-dir ...
      --memory-budget: at N = 2 and 4 a model that --strategy no_shard cannot train under the budget
      fails on every rank with one error line (exit 1, no abort banner, no step, no checkpoint),
      and --strategy full_shard trains it under the same budget, its loss falling.

Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import check, error_line, events, launch, losses, max_rel, run_main  # noqa: E402


def test_parity(opts, tmp):
    runs, norms = {}, {}
    for n in (1, 2, 4):
        m = os.path.join(tmp, "p%d.jsonl" % n)
        launch(["--steps", "20", "--mixed-precision", "fp32", "--strategy", "full_shard",
                "--metrics", m], n, opts)
        runs[n] = losses(m)
        norms[n] = {e["step"]: e["grad_norm"] for e in events(m, "step")}
        check(sorted(runs[n]) == list(range(1, 21)), "N=%d has 20 steps" % n)
    steps = range(1, 21)
    for n in (2, 4):
        rel = max_rel(runs[1], runs[n], steps)
        check(rel <= 1e-4, "N=1 vs N=%d: max rel loss diff over 20 steps %.3g <= 1e-4" % (n, rel))
        # Step 1 starts from the same params: the printed gradient norm equals the single process's
        # to the data-parallel sum's rounding (the fp32 norms of the shards were 1e-5 off).
        rel = abs(norms[n][1] - norms[1][1]) / norms[1][1]
        check(rel <= 1e-7, "N=1 vs N=%d: step-1 grad norm %.10g vs %.10g, rel diff %.3g <= 1e-7"
              % (n, norms[n][1], norms[1][1], rel))
    check(runs[1][20] < runs[1][1], "loss decreases (%.4f -> %.4f)" % (runs[1][1], runs[1][20]))
    # Exposed communication: the blocked waits of a step, by phase, are a part of the step.
    parts = ("forward", "backward", "end_of_backward", "optimizer", "other")
    for e in events(os.path.join(tmp, "p2.jsonl"), "step"):
        x = e["comm"]["exposed_s"]
        check(sorted(x) == sorted(parts + ("total",)) and abs(sum(x[p] for p in parts) - x["total"]) < 1e-9 and
              0 <= x["total"] <= e["step_time_s"] and all(x[p] >= 0 for p in parts),
              "N=2 step %d: exposed communication %.4f s of %.4f s (%s)" %
              (e["step"], x["total"], e["step_time_s"], ", ".join("%s %.4f" % (p, x[p]) for p in parts)))

def test_meta_init(opts, tmp):
    runs = [(2, s, mp) for s in ("full_shard", "no_shard") for mp in ("fp32", "bf16")]
    runs += [(2, "zero1", "fp32"), (2, "shard_grad_op", "fp32"), (1, "full_shard", "fp32")]
    for n, strategy, mp in runs:
        got = {}
        for meta in (False, True):
            m = os.path.join(tmp, "mi-%d-%s-%s-%d.jsonl" % (n, strategy, mp, meta))
            launch(["--steps", "4", "--strategy", strategy, "--mixed-precision", mp, "--metrics", m] +
                   (["--meta-init"] if meta else []), n, opts)
            cfg = events(m, "config")
            check(len(cfg) == 1 and cfg[0]["meta_init"] == meta, "config event says meta_init %s" % meta)
            got[meta] = [(e["step"], e["loss"], e["grad_norm"]) for e in events(m, "step")]
            check(len(got[meta]) == 4, "N=%d %s %s meta_init=%s: 4 steps" % (n, strategy, mp, meta))
        check(got[True] == got[False],
              "N=%d %s %s: --meta-init losses and grad norms equal the normal build's bit for bit:\n"
              "  normal %r\n  meta   %r" % (n, strategy, mp, got[False], got[True]))
    p = subprocess.run([opts.bin, "--dry-run", "--world-size", "2", "--model", "micro", "--meta-init"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 2 and "--meta-init" in error_line(p) and "--dry-run" in error_line(p),
          "--meta-init --dry-run: exit %d (want 2), error %r" % (p.returncode, error_line(p)))


def planned_activations(opts, cfg, extra):
    """fsdp-plan's activations.total_saved_bytes for the run whose config event is `cfg` (N = 1)."""
    cmd = [opts.plan, "--json", "--model", cfg["model"], "--n-layer", str(cfg["n_layer"]),
           "--n-head", str(cfg["n_head"]), "--n-embd", str(cfg["n_embd"]),
           "--block-size", str(cfg["block_size"]), "--vocab-size", str(cfg["vocab_size"]),
           "--attention", cfg["attention"], "--world-size", "1", "--strategy", cfg["strategy"],
           "--global-batch-size", str(cfg["global_batch_size"]),
           "--micro-batch-size", str(cfg["micro_batch_size"]), "--seq-len", str(cfg["seq_len"])] + extra
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                                     text=True).stdout)["activations"]["total_saved_bytes"]


def test_activations(opts, tmp):
    check(opts.plan is not None, "--plan names fsdp-plan")
    got = {}
    for mp in ("fp32", "bf16"):
        for ck in (False, True):
            m = os.path.join(tmp, "act-%s-%d.jsonl" % (mp, ck))
            launch(["--steps", "2", "--mixed-precision", mp, "--metrics", m] +
                   (["--activation-checkpointing"] if ck else []), 1, opts)
            measured = max(e["mem"]["activation_bytes"] for e in events(m, "step"))
            planned = planned_activations(opts, events(m, "config")[0], ["--mixed-precision", mp] +
                                          (["--activation-checkpointing"] if ck else []))
            check(abs(planned - measured) <= 1e-3 * measured,
                  "%s checkpointing=%s: measured activation bytes %d, planner %d" % (mp, ck, measured, planned))
            got[(mp, ck)] = measured
        check(got[(mp, True)] < got[(mp, False)], "%s: checkpointing keeps less" % mp)
    # A LoRA fine-tune: a frozen layer keeps no input for a weight gradient, an adapter keeps its
    # A's output; the default targets (c_attn) and all-linear, fp32.
    for targets in ("c_attn", "all-linear"):
        m = os.path.join(tmp, "act-lora-%s.jsonl" % targets)
        lora = ["--lora-rank", "4", "--lora-target-modules", targets]
        launch(["--steps", "2", "--metrics", m] + lora, 1, opts)
        measured = max(e["mem"]["activation_bytes"] for e in events(m, "step"))
        planned = planned_activations(opts, events(m, "config")[0], lora)
        check(abs(planned - measured) <= 1e-3 * measured and measured < got[("fp32", False)],
              "LoRA %s: measured activation bytes %d (full fine-tune %d), planner %d" %
              (targets, measured, got[("fp32", False)], planned))


# The --memory-budget demo (apps/README.md): a model whose no_shard state (16 bytes/param on every
# rank) does not fit the budget while full_shard's (16/N bytes/param plus activations and the
# gathered units) does, at N = 2 and 4. Peaks measured on the dev machine are in apps/README.md.
BUDGET_MODEL = ["--model", "micro", "--n-layer", "6", "--n-embd", "384", "--global-batch-size", "8",
                "--seq-len", "64"]
BUDGET, BUDGET_BYTES = "210MB", 210e6


def plan_budget(opts, n):
    """fsdp-plan's prediction for the demo at N = n: {strategy: (fits, peak_bytes, reduce_in_flight_bytes)}."""
    plan_bin = os.path.join(os.path.dirname(opts.bin), "fsdp-plan")
    p = subprocess.run([plan_bin] + BUDGET_MODEL + ["--world-size", str(n), "--memory-per-rank", BUDGET,
                                                    "--headroom", "0", "--reduce-scatter-route", "all_to_all",
                                                    "--json"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "fsdp-plan for the demo at N=%d: exit %d %s" % (n, p.returncode, p.stderr[-300:]))
    return {s["strategy"]: (s["fits"], s["peak"]["peak_bytes"], s["peak"]["reduce_in_flight_bytes"])
            for s in json.loads(p.stdout)["strategies"]}


def test_budget(opts, tmp):
    for n in (2, 4):
        # fsdp-plan predicts both outcomes before anything runs.
        plan = plan_budget(opts, n)
        check(not plan["no_shard"][0] and plan["full_shard"][0],
              "N=%d fsdp-plan under %s: no_shard does not fit (peak %.1f MB), full_shard fits (%.1f MB)" %
              (n, BUDGET, plan["no_shard"][1] / 1e6, plan["full_shard"][1] / 1e6))
        ck = os.path.join(tmp, "ck%d" % n)
        m = os.path.join(tmp, "ns%d.jsonl" % n)
        p = launch(BUDGET_MODEL + ["--strategy", "no_shard", "--memory-budget", BUDGET, "--steps", "3",
                                   "--save", ck, "--metrics", m], n, opts, expect_ok=False)
        err = [l for l in p.stderr.splitlines() if l.startswith("fsdp-train") and "error:" in l]
        check(p.returncode == 1 and len(err) == 1 and
              ("out of memory on every rank (%d of %d)" % (n, n)) in err[0] and
              "memory budget of 210.0 MB exceeded" in err[0],
              "N=%d no_shard under %s: exit %d, one error line: %r" % (n, BUDGET, p.returncode,
                                                                       err[0][:200] if err else ""))
        check("MPI_ABORT" not in p.stdout + p.stderr and "Traceback" not in p.stderr and
              "terminate called" not in p.stderr, "N=%d no_shard: no abort banner or backtrace" % n)
        check(not events(m, "step") and not os.path.exists(os.path.join(ck, "latest")) and
              not [d for d in (os.listdir(ck) if os.path.isdir(ck) else []) if d.startswith("step-")],
              "N=%d no_shard: no step reported, no checkpoint written" % n)
        m = os.path.join(tmp, "fs%d.jsonl" % n)
        launch(BUDGET_MODEL + ["--strategy", "full_shard", "--memory-budget", BUDGET, "--steps", "4",
                               "--metrics", m], n, opts)
        steps = events(m, "step")
        peak = max(e["mem"]["peak_bytes"] for e in steps)
        check(len(steps) == 4 and steps[-1]["loss"] < steps[0]["loss"] and peak <= BUDGET_BYTES,
              "N=%d full_shard under %s trains 4 steps, loss %.3f -> %.3f, peak %.1f MB" %
              (n, BUDGET, steps[0]["loss"], steps[-1]["loss"], peak / 1e6))
        # The plan's peak is the worst case: the previous block's reduce-scatter still running during a
        # block's backward, with the blocks its all-to-all receives. Whether a step reaches it depends on
        # how soon the communication thread finishes (175.1-180.7 MB at N = 2 on the dev machine, 180.7
        # in every step with the received blocks held longer), so the measured peak lies between the
        # plan less those bytes, within 5%, and the plan.
        _, planned, in_flight = plan["full_shard"]
        check(in_flight > 0 and peak <= planned and planned - in_flight <= 1.05 * peak,
              "N=%d full_shard: measured peak %.1f MB at most fsdp-plan's %.1f MB, and the plan less the %.1f MB "
              "an all-to-all receives within 5%% of it" % (n, peak / 1e6, planned / 1e6, in_flight / 1e6))


def main():
    return run_main({"parity": test_parity, "budget": test_budget, "meta_init": test_meta_init, "activations": test_activations}, "fsdp-train-e2e-", plan=True)


if __name__ == "__main__":
    sys.exit(main())
