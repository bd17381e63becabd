#!/usr/bin/env python3
"""fsdp-cpp (fsdp-train, MPI) vs stock PyTorch (bench/peer_train.py, gloo) training-step speed.

    python3 bench/compare.py            # full: nano + micro, N = 1, 2, 2 repetitions  (~12 min on 2 cores)
    python3 bench/compare.py --quick    # nano only, N = 1, 2, 2 repetitions            (~3 min)

Implementations (same GPT, same global batch G, seq len T, micro-batch = G/N, steps, precision,
AdamW, grad clip 1.0, 1 intra-op thread per rank):
  ours-full_shard   mpirun -n N fsdp-train --strategy full_shard
  ours-no_shard     mpirun -n N fsdp-train --strategy no_shard  (probed first; skipped with a note when
                    the engine rejects it)
  fsdp2             torchrun peer_train.py --impl fsdp2  (fully_shard per Block + root)
  ddp               torchrun peer_train.py --impl ddp
  (--peers fsdp2,ddp,zero adds ZeroRedundancyOptimizer; --peers ...,deepspeed adds DeepSpeed ZeRO
   stages 1, 2 and 3 (ds1, ds2, ds3; each can be named alone), installed by bench/setup.sh;
   --ours full_shard,full_shard@yield adds a run of fsdp-train under Open MPI's --mca
   mpi_yield_when_idle 1; --backend gloo adds, for each strategy S, ours-S@gloo: fsdp-train under
   torchrun over the Gloo backend, beside its mpirun run over MPI;
   full_shard@libtorch-adamw runs fsdp-train with --adamw-kernel libtorch; full_shard@bind under
   mpirun --bind-to core, each rank's threads on one core, instead of --bind-to none)
  plain             --peers ...,plain: N independent processes of the plain libtorch loop
                    (bench/cpp/plain_loop.cpp: same model and AdamW, no FSDP; fp32), G/N sequences
                    each, their tokens/s added: at N = 1 the loop fsdp-train should cost what it costs
  indep             --peers ...,indep: N independent single-rank fsdp-train full_shard processes,
                    G/N sequences each, tokens/s added: the independent-process limit of N ranks on
                    this machine (what N = 2 should reach when communication is free)

--mixed-precision bf16 (default fp32) runs fsdp-train --mixed-precision bf16 (bf16 unsharded params,
all-gathers and gradient reduction, fp32 master weights and AdamW state) against the matching
PyTorch policy: FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, root
output_dtype=fp32), DDP and ZeRO under torch.autocast("cpu", dtype=torch.bfloat16), DeepSpeed in its
bf16 mode (bf16 params and gradients, fp32 master weights and Adam state).

Method: for each (preset, N) the implementations run back to back; each repetition reverses the
order of the previous one (A B C D, D C B A, ...), so slow drifts of the shared machine hit all
alike. The first --warmup steps of every run are dropped; the statistics pool the remaining steps of
all repetitions (median step time), and the ratio column is the median over repetitions of the
paired ratio (ours tokens/s / peer tokens/s in the same repetition; > 1 = ours faster).
A run that fails is left out of the table, except a PyTorch peer that wrote every step and its end
event before dying in its own teardown (Gloo at interpreter exit): its steps count and a note says so.
Memory per rank: model state (params + grads + optimizer state of this rank, from the metrics),
peak RSS (ru_maxrss of every rank process, MAX over ranks; peers include the Python interpreter),
and for ours the counting allocator's peak (tensor bytes live at once during the step).
Ours also reports the communication thread's busy time per step (CommStats, median).

Raw metrics go to --out (default out/bench/<timestamp>/); the markdown table goes to stdout and to
<out>/table.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import textwrap
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Peers that are N independent single-rank processes (G/N sequences each), not one job of N ranks.
INDEPENDENT = ("plain", "indep")
ROOT = os.path.dirname(HERE)


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_rss(d):
    """(MAX over ranks of peak RSS bytes, per-rank CPU seconds list) from rusage_exec.py files."""
    vals, cpu = [], []
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if name.startswith("rss_rank"):
                with open(os.path.join(d, name)) as f:
                    j = json.load(f)
                vals.append(j["maxrss_bytes"])
                cpu.append(j.get("utime_s", 0) + j.get("stime_s", 0))
    return (max(vals) if vals else None), cpu


class Runner:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
                        PYTHONUNBUFFERED="1", DS_ACCELERATOR="cpu")
        self.env.pop("TORCHELASTIC_ERROR_FILE", None)

    def common(self, preset, n):
        a = self.a
        return dict(model=preset, G=a.global_batch_size, T=a.seq_len, steps=a.steps, threads=a.threads)

    def cmd(self, impl, preset, n, run_dir):
        a = self.a
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if impl.startswith("ours-"):
            strategy, _, variant = impl[len("ours-"):].partition("@")
            mca, extra, bind = [], [], "none"
            if variant == "yield":  # Open MPI: blocking calls sched_yield() while they poll
                mca = ["--mca", "mpi_yield_when_idle", "1"]
            elif variant == "bind":  # each rank (compute and communication threads) on one core
                bind = "core"
            elif variant == "libtorch-adamw":  # torch::optim::AdamW instead of the fused kernel
                extra = ["--adamw-kernel", "libtorch"]
            elif variant and variant != "gloo":
                raise SystemExit(f"unknown variant @{variant} (known: @yield, @bind, @gloo, @libtorch-adamw)")
            if variant == "gloo":  # torchrun, fsdp-train over Gloo (--backend auto picks it)
                launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                          "--master_port", str(29500 + (os.getpid() % 500))]
            else:
                launch = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", bind, *mca,
                          "-x", "OMP_NUM_THREADS", "-x", "MKL_NUM_THREADS", "-n", str(n), sys.executable]
            return [*launch, os.path.join(HERE, "rusage_exec.py"), run_dir, "--",
                    a.binary, "--model", preset, "--strategy", strategy,
                    "--global-batch-size", str(a.global_batch_size), "--seq-len", str(a.seq_len),
                    "--steps", str(a.steps), "--threads", str(a.threads),
                    "--warmup-steps", "20", "--eval-every", "0", "--eval-batches", "1",
                    "--data-dir", a.data_dir, "--progress", "lines", "--metrics", metrics,
                    "--mixed-precision", a.mixed_precision, *extra]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                "--master_port", str(29500 + (os.getpid() % 500)),
                os.path.join(HERE, "peer_train.py"), "--impl", impl, "--model", preset,
                "--global-batch-size", str(a.global_batch_size), "--seq-len", str(a.seq_len),
                "--steps", str(a.steps), "--threads", str(a.threads), "--warmup-steps", "20",
                "--quiet", "--metrics", metrics, "--mixed-precision", a.mixed_precision,
                *(["--ds-defaults"] if a.ds_defaults and impl.startswith("ds") else [])]

    def independent_cmd(self, impl, preset, n, i, run_dir):
        """Process i of the N independent single-rank processes of `plain` or `indep` (G/N each)."""
        a = self.a
        metrics = os.path.join(run_dir, f"metrics_{i}.jsonl")
        g = str(a.global_batch_size // n)
        wrap = [sys.executable, os.path.join(HERE, "rusage_exec.py"), run_dir, "--"]
        if impl == "plain":
            return wrap + [a.plain_binary, "--model", preset, "--global-batch-size", g,
                           "--seq-len", str(a.seq_len), "--steps", str(a.steps),
                           "--threads", str(a.threads), "--metrics", metrics, "--seed", str(1337 + i)]
        # The wrapper outside mpirun: wait4's ru_maxrss is then the largest of its descendants
        # (fsdp-train), and BENCH_PROCESS=i names its file.
        return wrap + [a.mpirun, "--allow-run-as-root", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
                "-x", "MKL_NUM_THREADS", "-n", "1", a.binary, "--model", preset,
                "--strategy", "full_shard", "--global-batch-size", g, "--seq-len", str(a.seq_len),
                "--steps", str(a.steps), "--threads", str(a.threads), "--warmup-steps", "20",
                "--eval-every", "0", "--eval-batches", "1", "--data-dir", a.data_dir,
                "--progress", "lines", "--metrics", metrics, "--mixed-precision", a.mixed_precision,
                "--seed", str(1337 + i)]

    def run_independent(self, impl, preset, n, run_dir):
        """N processes at once, G/N sequences each; their step k counts as one step of G
        sequences taking G*T / (sum over processes of tokens / step_time_s): the aggregate
        tokens/s of the independent-process limit. Writes run_dir/metrics.jsonl in fsdp-train's
        format; returns (exit code, combined log)."""
        env = [dict(self.env, BENCH_PROCESS=str(i)) for i in range(n)]
        cmds = [self.independent_cmd(impl, preset, n, i, run_dir) for i in range(n)]
        with open(os.path.join(run_dir, "cmd.txt"), "w") as f:
            f.write("".join(" ".join(c) + " &\n" for c in cmds))
        procs = [subprocess.Popen(c, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for c, e in zip(cmds, env)]
        outs, rc = [], 0
        for p in procs:
            try:
                out, _ = p.communicate(timeout=self.a.run_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outs.append(out)
            rc = rc or p.returncode
        per = []
        for i in range(n):
            path = os.path.join(run_dir, f"metrics_{i}.jsonl")
            per.append([e for e in read_jsonl(path) if e.get("event") == "step"] if os.path.exists(path) else [])
        steps = []
        for k in range(min(len(s) for s in per)):
            rate = sum(s[k]["tokens"] / s[k]["step_time_s"] for s in per)
            tokens = sum(s[k]["tokens"] for s in per)
            mem = {key: sum(s[k]["mem"].get(key) or 0 for s in per) for key in per[0][k]["mem"]
                   if isinstance(per[0][k]["mem"].get(key), (int, float))}
            steps.append({"event": "step", "step": per[0][k]["step"], "tokens": tokens,
                          "step_time_s": tokens / rate, "mem": mem,
                          "loss": statistics.mean(s[k]["loss"] for s in per)})
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in steps + [{"event": "end"}])
        return rc, "".join(f"--- process {i}\n{o}" for i, o in enumerate(outs))

    def run(self, impl, preset, n, rep):
        run_dir = os.path.join(self.a.out, f"{preset}_n{n}_{impl}_r{rep}")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        t0 = time.time()
        if impl in INDEPENDENT:
            rc, stdout = self.run_independent(impl, preset, n, run_dir)
            p = subprocess.CompletedProcess([], rc, stdout)
        else:
            cmd = self.cmd(impl, preset, n, run_dir)
            with open(os.path.join(run_dir, "cmd.txt"), "w") as f:
                f.write(" ".join(cmd) + "\n")
            p = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=self.a.run_timeout)
        with open(os.path.join(run_dir, "log.txt"), "w") as f:
            f.write(p.stdout)
        wall = time.time() - t0
        ev = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        steps = [e for e in ev if e.get("event") == "step"]
        end = [e for e in ev if e.get("event") == "end"]
        # A PyTorch peer that wrote every step and its end event, then died in its own teardown
        # (Gloo's threads at interpreter exit: "terminate called without an active exception"),
        # measured all it was asked to: its steps are kept and the table's notes say so. Ours
        # never gets this pass: a crash of fsdp-train at exit is a defect.
        teardown_rc = 0
        if p.returncode != 0 and end and len(steps) >= self.a.steps and not impl.startswith("ours-") \
                and impl not in INDEPENDENT:
            teardown_rc = p.returncode
        elif p.returncode != 0 or len(steps) < self.a.steps:
            return {"ok": False, "rc": p.returncode, "log": p.stdout[-2000:], "wall": wall}
        kept = [e for e in steps if e["step"] > self.a.warmup]
        rss, cpu = read_rss(run_dir)
        if rss is None:  # peer: its own getrusage, MAX over ranks, reported per step
            rss = max(e["mem"].get("rss_peak_bytes") or 0 for e in steps) or None
        comm = []
        for e in kept:
            c = e.get("comm") or {}
            if c:
                comm.append(sum(v for k, v in c.items() if k.endswith("_busy_s")))
        last = steps[-1]["mem"]
        state = sum(last.get(k) or 0 for k in ("param_shard_bytes", "grad_shard_bytes",
                                               "optim_state_bytes"))
        peaks = [e["mem"].get("peak_bytes") for e in kept if e["mem"].get("peak_bytes")]
        return {"ok": True, "wall": wall, "times": [e["step_time_s"] for e in kept],
                "tokens": steps[0]["tokens"], "rss": rss, "state": state,
                "alloc_peak": max(peaks) if peaks else None, "comm_busy": comm, "cpu_s": cpu,
                "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"], "teardown_rc": teardown_rc}


def cpu_name():
    """The CPU model and its bf16/fp16 units, from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = val.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    units = [u for u in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16") if u in flags]
    isa = "AVX512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{model} ({isa}; {', '.join(units) if units else 'no bf16/fp16 units'})"


def bar_chart(rows, impls, path, title):
    """Tokens/s of every implementation, grouped by (preset, N), as a PNG; what was written (or why not)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no bar chart: matplotlib is not installed (bench/setup.sh)"
    groups = sorted({(r["preset"], r["n"]) for r in rows}, key=lambda g: (g[0], g[1]))
    if not groups:
        return "no bar chart: no run succeeded"
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) * len(impls) / 3), 4.5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        vals = [next((r["tokens_per_s"] for r in rows if (r["preset"], r["n"]) == g and r["impl"] == impl), 0)
                for g in groups]
        xs = [k - 0.4 + width * (i + 0.5) for k in range(len(groups))]
        ax.bar(xs, vals, width, label=impl)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{p} N={n}" for p, n in groups])
    ax.set_ylabel("tokens / s (median step)")
    # The run's setup and CPU, wrapped to the figure's width (one line ran off the picture).
    parts = [t.strip() for t in title.split(";") if not t.strip().startswith("total")]
    ax.set_title(textwrap.fill("; ".join(parts), width=int(fig.get_figwidth() * 17)), fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return "wrote " + path


def fmt_mib(b):
    return "-" if not b else f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="nano only, 2 repetitions, fewer steps (~3 min)")
    ap.add_argument("--presets", default=None, help="comma list (default nano,micro; --quick: nano)")
    ap.add_argument("--ranks", default="1,2", help="comma list of N")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 10; --quick: 7)")
    ap.add_argument("--warmup", type=int, default=3, help="first steps of each run left out")
    ap.add_argument("--global-batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--mixed-precision", choices=["fp32", "bf16"], default="fp32",
                    help="precision of every implementation (see above)")
    ap.add_argument("--peers", default="fsdp2,ddp", help="peer impls: fsdp2,ddp,zero,deepspeed (= ds1,ds2,ds3),plain,indep")
    ap.add_argument("--ds-defaults", action="store_true",
                    help="DeepSpeed peers with the ZeRO stage alone (DeepSpeed's defaults) instead of the "
                         "settings its ZeRO tutorial recommends (bench/peer_train.py DS_RECOMMENDED)")
    ap.add_argument("--ours", default="full_shard,no_shard",
                    help="fsdp-train strategies; STRATEGY@yield adds --mca mpi_yield_when_idle 1")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build-bench", "bin", "fsdp-train"))
    ap.add_argument("--plain-binary", default=os.path.join(ROOT, "build-bench", "bin", "fsdp-plain-loop"))
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--backend", choices=["mpi", "gloo"], default="mpi",
                    help="gloo: each fsdp-train strategy also runs under torchrun over Gloo (STRATEGY@gloo), "
                         "beside its mpirun run over MPI")
    ap.add_argument("--out", default=None)
    ap.add_argument("--run-timeout", type=int, default=300)
    a = ap.parse_args()
    a.presets = (a.presets or ("nano" if a.quick else "nano,micro")).split(",")
    a.reps = a.reps or 2
    a.steps = a.steps or (7 if a.quick else 10)
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    a.out = a.out or os.path.join(ROOT, "out", "bench", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(a.out, exist_ok=True)
    ranks = [int(x) for x in a.ranks.split(",")]
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"no fsdp-train at {a.binary} (build it: see docs/BENCHMARKS.md)")

    runner = Runner(a)
    notes = []
    ours = []
    for s in a.ours.split(","):
        if not s:
            continue
        if "@" in s:  # a launch variant of a strategy probed on its own
            ours.append("ours-" + s)
            continue
        # Probe: 1 step of nano on 1 rank; exit code 2 = rejected setting (e.g. strategy unsupported).
        probe_dir = os.path.join(a.out, f"probe_{s}")
        os.makedirs(probe_dir, exist_ok=True)
        cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "1", a.binary, "--model", "nano",
               "--strategy", s, "--steps", "1", "--global-batch-size", "2", "--seq-len", "16",
               "--eval-every", "0", "--eval-batches", "1", "--data-dir", a.data_dir, "--progress", "lines"]
        p = subprocess.run(cmd, cwd=ROOT, env=runner.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        if p.returncode == 0:
            ours.append("ours-" + s)
            if a.backend == "gloo":
                ours.append("ours-" + s + "@gloo")
        else:
            msg = next((l for l in p.stdout.splitlines() if "error" in l), p.stdout.strip()[-300:])
            notes.append(f"`--strategy {s}` skipped: fsdp-train exited {p.returncode}: {msg.strip()}")
            log(notes[-1])
    peer_list = []
    for x in a.peers.split(","):
        peer_list += ["ds1", "ds2", "ds3"] if x == "deepspeed" else ([x] if x else [])
    if "plain" in peer_list and a.mixed_precision != "fp32":
        peer_list.remove("plain")
        notes.append("plain skipped: the plain libtorch loop is fp32 only (bench/cpp/plain_loop.cpp)")
    if "plain" in peer_list and not os.access(a.plain_binary, os.X_OK):
        sys.exit(f"--peers plain: no fsdp-plain-loop at {a.plain_binary} (build the target fsdp-plain-loop)")
    if any(p.startswith("ds") for p in peer_list):
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            sys.exit("--peers with DeepSpeed: not installed (run bench/setup.sh)")
    impls = ours + peer_list
    log(f"impls {impls}, presets {a.presets}, N {ranks}, reps {a.reps}, steps {a.steps} "
        f"(first {a.warmup} dropped), G={a.global_batch_size}, T={a.seq_len}, threads/rank {a.threads}")

    results = {}  # (preset, n, impl) -> list of run dicts (one per rep)
    t_start = time.time()
    for preset in a.presets:
        for n in ranks:
            if a.global_batch_size % n:
                notes.append(f"N={n} skipped: G={a.global_batch_size} not divisible")
                continue
            for rep in range(a.reps):
                order = impls if rep % 2 == 0 else impls[::-1]
                for impl in order:
                    r = runner.run(impl, preset, n, rep)
                    results.setdefault((preset, n, impl), []).append(r)
                    if r["ok"]:
                        log(f"{preset} N={n} {impl} rep {rep}: median "
                            f"{statistics.median(r['times']) * 1e3:.0f} ms/step (run {r['wall']:.0f} s)")
                        if r["teardown_rc"]:
                            notes.append(f"{preset} N={n} {impl} rep {rep} exited {r['teardown_rc']} after its "
                                         "last step and end event (PyTorch's own teardown); its steps are kept")
                            log(notes[-1])
                    else:
                        log(f"{preset} N={n} {impl} rep {rep}: FAILED rc={r['rc']}\n{r['log']}")
    total = time.time() - t_start

    # Table
    peers = [i for i in impls if not i.startswith("ours-")]
    head = ["impl", "preset", "N", "median step ms", "min-max of rep medians", "tokens/s"]
    head += [f"ours/{p} tok/s" for p in peers]
    head += ["state MiB/rank", "peak RSS MiB/rank", "alloc peak MiB/rank", "comm busy ms/step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = []
    for preset in a.presets:
        for n in ranks:
            for impl in impls:
                runs = [r for r in results.get((preset, n, impl), []) if r["ok"]]
                if not runs:
                    if (preset, n, impl) in results:
                        lines.append(f"| {impl} | {preset} | {n} | failed |" + " |" * (len(head) - 4))
                    continue
                times = [t for r in runs for t in r["times"]]
                med = statistics.median(times)
                rep_meds = [statistics.median(r["times"]) for r in runs]
                tps = runs[0]["tokens"] / med
                row = [impl, preset, str(n), f"{med * 1e3:.0f}",
                       f"{min(rep_meds) * 1e3:.0f}-{max(rep_meds) * 1e3:.0f}", f"{tps:,.0f}"]
                for p in peers:
                    if not impl.startswith("ours-"):
                        row.append("")
                        continue
                    pr = results.get((preset, n, p), [])
                    paired = [statistics.median(pp["times"]) / statistics.median(o["times"])
                              for o, pp in zip(results[(preset, n, impl)], pr) if o["ok"] and pp["ok"]]
                    row.append(f"{statistics.median(paired):.2f}" if paired else "-")
                comm = [c for r in runs for c in r["comm_busy"]]
                row += [fmt_mib(runs[-1]["state"]), fmt_mib(max(r["rss"] or 0 for r in runs)),
                        fmt_mib(max(r["alloc_peak"] or 0 for r in runs)),
                        f"{statistics.median(comm) * 1e3:.0f}" if comm else "-"]
                lines.append("| " + " | ".join(row) + " |")
                summary.append({"impl": impl, "preset": preset, "n": n, "median_step_s": med,
                                "rep_median_step_s": rep_meds, "tokens_per_s": tps,
                                "state_bytes": runs[-1]["state"],
                                "rss_bytes": max(r["rss"] or 0 for r in runs),
                                "alloc_peak_bytes": max(r["alloc_peak"] or 0 for r in runs),
                                "comm_busy_s_median": statistics.median(comm) if comm else None,
                                "loss_first": runs[0]["loss_first"], "loss_last": runs[0]["loss_last"]})
    cfg = (f"G={a.global_batch_size} sequences x T={a.seq_len} tokens per step, micro-batch G/N, "
           f"{a.steps} steps per run (first {a.warmup} dropped), {a.reps} repetitions, "
           f"{a.threads} thread(s) per rank, {a.mixed_precision}; total {total:.0f} s; "
           f"CPU: {cpu_name()}")
    table = "\n".join(lines)
    text = cfg + "\n\n" + table + "\n" + "".join(f"\nNote: {x}" for x in notes) + "\n"
    print(text)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"config": vars(a), "notes": notes, "rows": summary, "total_s": total}, f, indent=1)
    log(f"wrote {a.out}/table.md and summary.json")
    chart = bar_chart(summary, impls, os.path.join(a.out, "table.png"), cfg)
    if chart:
        log(chart)


if __name__ == "__main__":
    main()
