#!/usr/bin/env python3
"""One picture of one or more fsdp-train runs, from their --metrics files.

    python3 scripts/report.py out/a.jsonl [out/b.jsonl ...] [-o report.png]

Four panels over the optimizer steps, one colour per run (the file's name is its label):
  1. training loss, and validation loss at its evaluations (dashed, markers);
  2. tokens per second of each step (the training part: forward, backward, optimizer);
  3. memory per rank by kind (MAX over ranks, MiB, log scale so that small kinds stay visible):
     sharded params, grads, optimizer state, unsharded params, saved activations, and the counting
     allocator's peak; here the colour and marker are the kind, the line style the run, and a
     kind's zero values are not drawn (a log axis has no 0);
  4. communication per step (this rank's, ms): the communication thread's busy time (all
     collectives) against the exposed part, the time compute was blocked waiting for a collective,
     stacked by phase (forward, backward, end of backward, optimizer; one bar per run and step).
A step written twice (a resumed run appends to its file) counts by its last record. Writes a PNG
(default: the first file's name with .png). Needs matplotlib (scripts/setup.sh installs it).
"""
import argparse
import json
import os
import sys

PHASES = ("forward", "backward", "end_of_backward", "optimizer", "other")
# Memory kinds: (key in the step's "mem", label, colour, marker). The colour and marker name the kind.
MEM = (("param_shard_bytes", "params", "tab:blue", "o"),
       ("grad_shard_bytes", "grads", "tab:orange", "s"),
       ("optim_state_bytes", "optimizer state", "tab:green", "^"),
       ("unsharded_param_bytes", "unsharded params", "tab:purple", "D"),
       ("activation_bytes", "activations", "tab:brown", "v"),
       ("peak_bytes", "peak (allocator)", "black", "*"))
RUN_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 3)))  # memory panel: one per run


def read(path):
    steps, evals = {}, {}  # by step: a resumed run's file repeats steps, the last record counts
    try:
        with open(path) as f:
            lines = f.readlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                if n == len(lines) and not line.endswith("\n"):  # a run still writing, or one cut off
                    print("report.py: %s: its last line is incomplete; left out" % path, file=sys.stderr)
                    continue
                sys.exit("report.py: %s line %d is not JSON: %s" % (path, n, err))
            if e.get("event") == "step":
                steps[e["step"]] = e
            elif e.get("event") == "eval":
                evals[e["step"]] = e
    except OSError as err:
        sys.exit("report.py: cannot read %s: %s" % (path, err.strerror or err))
    if not steps:
        sys.exit("report.py: %s holds no step events (an fsdp-train --metrics file?)" % path)
    return [steps[k] for k in sorted(steps)], [evals[k] for k in sorted(evals)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="fsdp-train --metrics files (JSON lines), one run each")
    ap.add_argument("-o", "--out", default=None, help="the PNG to write (default: the first file's name with .png)")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        sys.exit("report.py needs matplotlib (scripts/setup.sh installs it; or: python3 -m pip install matplotlib)")
    runs = [(os.path.splitext(os.path.basename(p))[0], *read(p)) for p in a.metrics]
    out = a.out or os.path.splitext(a.metrics[0])[0] + ".png"
    fig, ax = plt.subplots(2, 2, figsize=(17, 9), layout="constrained")
    colors = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:olive", "tab:cyan")  # one per run
    phase_colors = ("#9ecae1", "#3182bd", "#08519c", "#fd8d3c", "#bdbdbd")  # exposed time, by phase
    mem_drawn = set()
    for i, (label, steps, evals) in enumerate(runs):
        c = colors[i % len(colors)]
        x = [e["step"] for e in steps]
        ax[0][0].plot(x, [e["loss"] for e in steps], color=c, label=label + " train")
        if evals:
            ax[0][0].plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o--", color=c,
                          label=label + " val")
        ax[0][1].plot(x, [e["tokens_per_s"] for e in steps], color=c, label=label)
        every = max(1, len(x) // 15)  # markers at most ~15 per line
        for k, (key, name, kc, marker) in enumerate(MEM):
            vals = [e["mem"].get(key) or 0 for e in steps]
            if any(vals):
                mem_drawn.add(key)
                # Kinds often coincide (fp32 params and grads have the same bytes): each kind's line
                # and hollow marker are thinner and smaller than the one before, so both stay visible.
                ax[1][0].plot(x, [v / 2**20 if v > 0 else float("nan") for v in vals], color=kc,
                              linestyle=RUN_STYLES[i % len(RUN_STYLES)], linewidth=3.2 - 0.4 * k, marker=marker,
                              markevery=every, markersize=12 - 1.4 * k, markerfacecolor="none", markeredgewidth=1.5)
        comm = [e.get("comm") or {} for e in steps]
        busy = [sum(v for k, v in cm.items() if k.endswith("_busy_s")) * 1e3 for cm in comm]
        ax[1][1].plot(x, busy, color=c, marker=".", markevery=every, label=label + " busy (communication thread)")
        if all("exposed_s" in cm for cm in comm):
            bottom = [0.0] * len(x)
            width = 0.8 / len(runs)
            offs = [xi - 0.4 + width * (i + 0.5) for xi in x]
            for ph, pc in zip(PHASES, phase_colors):
                h = [cm["exposed_s"].get(ph, 0.0) * 1e3 for cm in comm]
                ax[1][1].bar(offs, h, width, bottom=bottom, color=pc, edgecolor=c, linewidth=1.2,
                             label=("exposed: " + ph.replace("_", " ")) if i == 0 else None)
                bottom = [b + v for b, v in zip(bottom, h)]
    # The memory panel's legend: the kinds (colour, marker), then the runs (line style) when several.
    mem_handles = [Line2D([], [], color=kc, marker=marker, markerfacecolor="none", label=name)
                   for key, name, kc, marker in MEM if key in mem_drawn]
    if len(runs) > 1:
        mem_handles += [Line2D([], [], color="gray", linestyle=RUN_STYLES[i % len(RUN_STYLES)], label="run: " + label)
                        for i, (label, _, _) in enumerate(runs)]
    if mem_drawn:
        ax[1][0].set_yscale("log")
    titles = (("loss", "loss"), ("tokens / s", "tokens/s"),
              ("memory per rank by kind (MAX over ranks)", "MiB (log scale)"),
              ("communication per step: busy vs exposed (this rank)", "ms"))
    for axis, (title, unit) in zip([ax[0][0], ax[0][1], ax[1][0], ax[1][1]], titles):
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.set_ylabel(unit)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3, which="both" if axis is ax[1][0] else "major")
        # Outside the axes, on the right: no legend hides a line.
        axis.legend(handles=mem_handles if axis is ax[1][0] else None, fontsize=8, loc="upper left",
                    bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.suptitle(", ".join(label for label, _, _ in runs))
    fig.savefig(out, dpi=110)
    print("wrote " + out)


if __name__ == "__main__":
    sys.exit(main())
