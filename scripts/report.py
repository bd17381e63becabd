#!/usr/bin/env python3
"""One picture of one or more fsdp-train runs, from their --metrics files.

    python3 scripts/report.py out/a.jsonl [out/b.jsonl ...] [-o report.png]

Four panels over the optimizer steps, one line per run (the file's name is its label):
  1. training loss, and validation loss at its evaluations (dashed, markers);
  2. tokens per second of each step (the training part: forward, backward, optimizer);
  3. memory per rank by kind (MAX over ranks, MiB): sharded params, grads, optimizer state,
     unsharded params, saved activations, and the counting allocator's peak;
  4. communication per step (this rank's, ms): the communication thread's busy time (all
     collectives) against the exposed part, the time compute was blocked waiting for a collective,
     stacked by phase (forward, backward, end of backward, optimizer).
Writes a PNG (default: the first file's name with .png). Needs matplotlib (bench/setup.sh installs it).
"""
import argparse
import json
import os
import sys

PHASES = ("forward", "backward", "end_of_backward", "optimizer", "other")
MEM = (("param_shard_bytes", "params"), ("grad_shard_bytes", "grads"), ("optim_state_bytes", "optimizer state"),
       ("unsharded_param_bytes", "unsharded params"), ("activation_bytes", "activations"), ("peak_bytes", "peak"))


def read(path):
    steps, evals = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                sys.exit("report.py: %s line %d is not JSON: %s" % (path, n, err))
            if e.get("event") == "step":
                steps.append(e)
            elif e.get("event") == "eval":
                evals.append(e)
    if not steps:
        sys.exit("report.py: %s holds no step events (an fsdp-train --metrics file?)" % path)
    return steps, evals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("report.py needs matplotlib (bench/setup.sh installs it)")
    runs = [(os.path.splitext(os.path.basename(p))[0], *read(p)) for p in a.metrics]
    out = a.out or os.path.splitext(a.metrics[0])[0] + ".png"
    fig, ax = plt.subplots(2, 2, figsize=(14, 9))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, steps, evals) in enumerate(runs):
        c = colors[i % len(colors)]
        x = [e["step"] for e in steps]
        ax[0][0].plot(x, [e["loss"] for e in steps], color=c, label=label + " train")
        if evals:
            ax[0][0].plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o--", color=c,
                          label=label + " val")
        ax[0][1].plot(x, [e["tokens_per_s"] for e in steps], color=c, label=label)
        styles = ["-", "--", ":", "-.", (0, (1, 1)), (0, (5, 1))]
        for (key, name), ls in zip(MEM, styles):
            vals = [e["mem"].get(key) for e in steps]
            if any(v for v in vals):
                ax[1][0].plot(x, [(v or 0) / 2**20 for v in vals], linestyle=ls, color=c,
                              label="%s %s" % (label, name) if len(runs) > 1 else name)
        comm = [e.get("comm") or {} for e in steps]
        busy = [sum(v for k, v in cm.items() if k.endswith("_busy_s")) * 1e3 for cm in comm]
        ax[1][1].plot(x, busy, color=c, label=label + " busy (communication thread)")
        if all("exposed_s" in cm for cm in comm):
            bottom = [0.0] * len(x)
            width = 0.8 / len(runs)
            offs = [xi - 0.4 + width * (i + 0.5) for xi in x]
            for j, ph in enumerate(PHASES):
                h = [cm["exposed_s"][ph] * 1e3 for cm in comm]
                ax[1][1].bar(offs, h, width, bottom=bottom, color=colors[(j + 3) % len(colors)],
                             alpha=0.8, label=("exposed: " + ph.replace("_", " ")) if i == 0 else None)
                bottom = [b + v for b, v in zip(bottom, h)]
    titles = (("loss", "loss"), ("tokens / s", "tokens/s"), ("memory per rank (MAX over ranks)", "MiB"),
              ("communication per step: busy vs exposed (this rank)", "ms"))
    for axis, (title, unit) in zip([ax[0][0], ax[0][1], ax[1][0], ax[1][1]], titles):
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.set_ylabel(unit)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.suptitle(", ".join(label for label, _, _ in runs))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote " + out)


if __name__ == "__main__":
    sys.exit(main())
