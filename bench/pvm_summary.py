"""Summary of a bench/plan_vs_measured.sh run, as docs/BENCHMARKS.md prints it.

    python3 bench/pvm_summary.py OUT_DIR

Prints the planner-vs-measured table (every row of the tables in OUT_DIR, in the script's order:
preset, N, strategy), how many rows are within 5% (peak) and 20% (step time), and one line per
preset and N of the calibrated profiles (the range of the measured model rate over the runs, the
medians of the rest).

With several passes (OUT_DIR/pass1, pass2, ...: each row calibrated and run once per pass), a row's
step time is compared as the mean of its passes' measured step times against the mean of their
planned ones (each pass planned from its own calibration), and the passes' figures are shown next to
it; the peak columns are the pass with the largest peak error. An OUT_DIR without pass folders (one
pass, as the script wrote before it had them) is read as one pass.
"""
import glob
import json
import os
import re
import statistics
import sys

STRATEGIES = ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"]
KINDS = ["all_gather", "reduce_scatter", "all_reduce"]


def pass_dirs(out):
    """The pass folders of a run (pass1, pass2, ... in order), or [out] for a one-pass run."""
    dirs = [d for d in glob.glob(os.path.join(out, "pass*")) if re.fullmatch(r"pass\d+", os.path.basename(d))]
    return sorted(dirs, key=lambda d: int(os.path.basename(d)[4:])) or [out]


def rows(out):
    """{(sort key): {pass index: cells of that row's line in that pass}} over the passes of out."""
    found = {}
    for i, d in enumerate(pass_dirs(out)):
        for path in glob.glob(os.path.join(d, "table_*_n*_*.md")):
            m = re.match(r"table_(\w+?)_n(\d+)_(\w+)\.md", os.path.basename(path))
            preset, n, strategy = m.group(1), int(m.group(2)), m.group(3)
            for line in open(path):
                if line.startswith(f"| {preset} |"):
                    key = (preset != "micro", n, STRATEGIES.index(strategy))
                    found.setdefault(key, {})[i] = line.rstrip("\n").split("|")[1:-1]
                    break
    return dict(sorted(found.items()))


def pct(cell):
    return float(cell.strip().rstrip("%"))


def failed(cells):
    """A row strategy_table.py could not run ("failed (see ...)")."""
    return cells[3].strip().startswith("failed")


def main():
    out = sys.argv[1]
    table = rows(out)
    passes = len(pass_dirs(out))
    if passes == 1:
        header = ("| preset | N | strategy | state bytes/rank | planner | DESIGN formula | peak bytes/rank | planner peak "
                  "| peak err | comm bytes/step | planner | step s | planner step s | step err |")
        columns = 14
    else:
        header = ("| preset | N | strategy | state bytes/rank | planner | DESIGN formula | peak bytes/rank | planner peak "
                  "| peak err | comm bytes/step | planner | step s per pass | planner step s per pass "
                  "| step err per pass | step s (mean) | planner step s (mean) | step err |")
        columns = 17
    print(header)
    print("|" + "---|" * columns)
    peak_ok = step_ok = 0
    pass_ok, pass_rows = [0] * passes, [0] * passes
    for by_pass in table.values():
        ran = {i: c for i, c in by_pass.items() if not failed(c)}
        for i in by_pass:
            pass_rows[i] += 1
            pass_ok[i] += i in ran and abs(pct(ran[i][13])) <= 20
        if not ran:  # every run of the row failed: not within, shown as strategy_table.py wrote it
            print("|" + "|".join(next(iter(by_pass.values()))) + "|")
            continue
        worst = max(ran.values(), key=lambda c: abs(pct(c[8])))
        peak_ok += len(ran) == len(by_pass) and abs(pct(worst[8])) <= 5
        if passes == 1:
            print("|" + "|".join(worst) + "|")
            step_ok += abs(pct(worst[13])) <= 20
            continue
        cell = lambda i, k: by_pass[i][k].strip() if i in ran else ("failed" if i in by_pass else "-")
        measured = [float(c[11]) for c in ran.values()]
        planned = [float(c[12]) for c in ran.values()]
        # One run: its own error (the table's step times are rounded to 1 ms); several: their means.
        err = (pct(next(iter(ran.values()))[13]) if len(ran) == 1 else
               100.0 * (statistics.mean(planned) - statistics.mean(measured)) / statistics.mean(measured))
        step_ok += len(ran) == len(by_pass) and abs(err) <= 20
        join = lambda k: " / ".join(cell(i, k) for i in range(passes))
        print("|" + "|".join(worst[:11]) + f"| {join(11)} | {join(12)} | {join(13)} | "
              f"{statistics.mean(measured):.3f} | {statistics.mean(planned):.3f} | {err:+.1f}% |")
    print(f"\npeak within 5%: {peak_ok} of {len(table)}; step time within 20%: {step_ok} of {len(table)}", end="")
    if passes > 1:
        print(" (the passes' means); each pass alone: "
              + ", ".join(f"{ok} of {n}" for ok, n in zip(pass_ok, pass_rows)), end="")
    print("\n")
    print("| preset | N | model fwd+bwd fp32 GFLOP/s per rank (runs) | step update AdamW ns/elem at 256k / 16M "
          "| copies GB/s | all-gather / reduce-scatter / all-reduce link GB/s | shared-core factor AG / RS / AR "
          "| overlap |")
    print("|---|---|---|---|---|---|---|---|")
    groups = {}
    for path in [p for d in pass_dirs(out) for p in glob.glob(os.path.join(d, "profile_*_n*_*.json"))]:
        m = re.match(r"profile_(\w+?)_n(\d+)_\w+\.json", os.path.basename(path))
        groups.setdefault((m.group(1) != "micro", int(m.group(2)), m.group(1)), []).append(json.load(open(path)))
    for (_, n, preset), profiles in sorted(groups.items()):
        med = lambda f: statistics.median(f(p) for p in profiles)
        rate = [p["model_flops_per_s"]["fp32"] * 1e-9 for p in profiles]

        def update_ns(p, numel):
            pts = dict((e, s) for e, s in p["step_update_points_numel_seconds"]["adamw"])
            return pts[numel] / numel * 1e9

        links = factors = "-"
        if profiles[0]["collectives"]:
            links = " / ".join(f"{med(lambda p: p['collectives'][k]['intra_node']['bandwidth_bytes_per_s']) * 1e-9:.2f}"
                               for k in KINDS)
            if not profiles[0]["comm_overlaps_compute"]:
                factors = " / ".join(f"{med(lambda p: p['collectives'][k]['shared_core_factor']):.2f}" for k in KINDS)
        print(f"| {preset} | {n} | {min(rate):.1f} - {max(rate):.1f} | {med(lambda p: update_ns(p, 1 << 18)):.2f} / "
              f"{med(lambda p: update_ns(p, 1 << 24)):.2f} | {med(lambda p: p['memory_copy_bytes_per_s']) * 1e-9:.1f} | "
              f"{links} | {factors} | {'yes' if profiles[0]['comm_overlaps_compute'] else 'no'} |")


if __name__ == "__main__":
    main()
