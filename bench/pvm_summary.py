"""Summary of a bench/plan_vs_measured.sh run, as docs/BENCHMARKS.md prints it.

    python3 bench/pvm_summary.py OUT_DIR

Prints the planner-vs-measured table (every row of OUT_DIR/table_*.md, in the script's order:
preset, N, strategy), how many rows are within 5% (peak) and 20% (step time), and one line per
preset and N of the calibrated profiles (the range of the measured model rate over the runs, the
medians of the rest).
"""
import glob
import json
import os
import re
import statistics
import sys

STRATEGIES = ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"]
KINDS = ["all_gather", "reduce_scatter", "all_reduce"]


def rows(out):
    found = []
    for path in glob.glob(os.path.join(out, "table_*_n*_*.md")):
        m = re.match(r"table_(\w+?)_n(\d+)_(\w+)\.md", os.path.basename(path))
        preset, n, strategy = m.group(1), int(m.group(2)), m.group(3)
        for line in open(path):
            if line.startswith(f"| {preset} |"):
                found.append(((preset != "micro", n, STRATEGIES.index(strategy)), line.rstrip("\n"), preset, n))
                break
    found.sort()
    return found


def pct(cell):
    return float(cell.strip().rstrip("%"))


def main():
    out = sys.argv[1]
    table = rows(out)
    header = ("| preset | N | strategy | state bytes/rank | planner | DESIGN formula | peak bytes/rank | planner peak "
              "| peak err | comm bytes/step | planner | step s | planner step s | step err |")
    print(header)
    print("|" + "---|" * 14)
    peak_ok = step_ok = 0
    for _, line, _, _ in table:
        print(line)
        cells = line.split("|")[1:-1]
        peak_ok += abs(pct(cells[8])) <= 5
        step_ok += abs(pct(cells[13])) <= 20
    print(f"\npeak within 5%: {peak_ok} of {len(table)}; step time within 20%: {step_ok} of {len(table)}\n")
    print("| preset | N | model fwd+bwd fp32 GFLOP/s per rank (runs) | step update AdamW ns/elem at 256k / 16M "
          "| copies GB/s | all-gather / reduce-scatter / all-reduce link GB/s | shared-core factor AG / RS / AR "
          "| overlap |")
    print("|---|---|---|---|---|---|---|---|")
    groups = {}
    for path in glob.glob(os.path.join(out, "profile_*_n*_*.json")):
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
