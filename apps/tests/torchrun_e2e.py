#!/usr/bin/env python3
"""fsdp-train under torchrun over Gloo, run by ctest (apps/CMakeLists.txt).

  torchrun_e2e.py parity --bin build/bin/fsdp-train --data-dir ./data
      `torchrun --no-python --standalone --nproc-per-node 2 fsdp-train ...` trains one job of 2
      ranks (the summary says "2 rank(s)", one metrics file) whose losses and gradient norms
      equal those of `mpirun -n 2` bit for bit, in fp32 and bf16; --backend mpi under torchrun is
      refused with one error line.

  torchrun_e2e.py restart --bin build/bin/fsdp-train --data-dir ./data
      Elastic restart: a job under `torchrun --max-restarts 1` with --save-every and
      --resume auto loses a rank to SIGKILL after a checkpoint; torchrun restarts the job, which
      resumes from the newest complete checkpoint, and its losses from there to the end equal an
      uninterrupted run's bit for bit (N = 2). The checkpoint also continues at N = 1 and 4 with
      losses within 1e-4 relative of the uninterrupted run. First, ranks started by hand with
      different MASTER_PORTs end by themselves at FSDP_RENDEZVOUS_TIMEOUT_S, one line each, no
      backtrace.

Exit 0: pass; 77: skipped (no data / no torchrun / no mpirun); anything else: fail.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (TINY, check, events, launch, launch_prefix, losses, max_rel, run_main,  # noqa: E402
                         torchrun_child_exit_code, torchrun_prefix)


def torchrun_cmd(n, opts, args, extra=()):
    return (torchrun_prefix(n) + list(extra) +
            [opts.bin, "--data-dir", opts.data_dir] + TINY + args)


def torchrun(n, opts, args, extra=(), expect_ok=True):
    cmd = torchrun_cmd(n, opts, args, extra)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    if expect_ok and p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit("FAIL: exit %d: %s" % (p.returncode, " ".join(cmd)))
    print("  torchrun n=%d %.1fs rc=%d: %s" % (n, time.time() - t0, p.returncode, " ".join(args)), flush=True)
    return p


def norms(path):
    return {e["step"]: e["grad_norm"] for e in events(path, "step")}


def test_parity(opts, tmp):
    if shutil.which("mpirun") is None or os.environ.get("FSDP_BUILD_WITH_MPI") == "0":
        print("SKIP: no mpirun, or a build without MPI: nothing to compare with")
        sys.exit(77)
    for precision in ("fp32", "bf16"):
        flags = ["--steps", "6", "--mixed-precision", precision, "--strategy", "full_shard"]
        m_mpi, m_gloo = os.path.join(tmp, "mpi.jsonl"), os.path.join(tmp, "gloo.jsonl")
        launch(flags + ["--metrics", m_mpi], 2, opts)
        p = torchrun(2, opts, flags + ["--metrics", m_gloo])
        out = p.stdout + p.stderr
        check("2 rank(s) over gloo" in out and "1 rank(s)" not in out, "%s: torchrun runs one job of 2 ranks" % precision)
        a, b = losses(m_mpi), losses(m_gloo)
        check(sorted(b) == list(range(1, 7)), "%s: 6 steps over gloo" % precision)
        check(a == b, "%s: losses over gloo equal mpirun's bit for bit: %r" % (precision, [b[s] for s in sorted(b)]))
        check(norms(m_mpi) == norms(m_gloo), "%s: gradient norms equal bit for bit" % precision)
    p = torchrun(2, opts, ["--steps", "2", "--backend", "mpi"], expect_ok=False)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if "fsdp-train" in l and "error:" in l]
    check(p.returncode != 0 and lines and "torchrun" in lines[0], "--backend mpi under torchrun fails: %r"
          % (lines[0][:200] if lines else ""))
    code = torchrun_child_exit_code(p)
    check(code == 2, "--backend mpi under torchrun: the ranks exit 2, a launch error (got %d)" % code)
    # mpirun with torchrun's variables left in the environment and --backend gloo: every rank would
    # claim RANK 0 of a Gloo world; refused at once on each, exit 2, no MPI_ABORT (it used to wait
    # in the rendezvous until the outer timeout).
    env = dict(os.environ, OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29731")
    t0 = time.time()
    prefix = launch_prefix(2)
    prefix.insert(1, "--tag-output")  # each piece a rank writes is tagged: an error line must be one piece
    p = subprocess.run(prefix + [opts.bin, "--data-dir", opts.data_dir] + TINY +
                       ["--steps", "2", "--backend", "gloo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=env, timeout=120)
    out = p.stdout + p.stderr
    print("  mpirun n=2 --backend gloo with RANK set: %.1fs rc=%d" % (time.time() - t0, p.returncode))
    check(p.returncode == 2 and "started by an MPI launcher" in out and "MPI_ABORT" not in out
          and "Exception raised from" not in out,
          "--backend gloo under mpirun with RANK and WORLD_SIZE set is refused (exit 2): %s" % out[-1500:])
    errors = [l for l in p.stderr.splitlines() if "error:" in l]
    check(len(errors) == 2 and all(re.match(r"\[1,(\d)\]<stderr>:fsdp-train \[rank \1\]: error: "
                                            r"gloo rendezvous: .*launch with torchrun$", l) for l in errors),
          "each rank's error line comes out whole, once, naming its rank once: %r" % errors)


def by_hand_with_ports(opts, ports, timeout_s=5):
    """Two ranks started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), rank 1 first, each
    with its own MASTER_PORT from `ports`; FSDP_RENDEZVOUS_TIMEOUT_S=timeout_s. Returns
    [(exit code, stderr, seconds)] by rank."""
    procs, t0 = [], time.time()
    for r in (1, 0):
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(ports[r]), FSDP_RENDEZVOUS_TIMEOUT_S=str(timeout_s))
        procs.append((r, subprocess.Popen([opts.bin, "--data-dir", opts.data_dir] + TINY + ["--steps", "1"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = {}
    for r, p in procs:
        err = p.communicate(timeout=120)[1]
        out[r] = (p.returncode, err, time.time() - t0)
    return [out[0], out[1]]


def test_rendezvous_faults(opts):
    """Ranks given different MASTER_PORTs, and a store nobody serves: every rank ends by itself at
    the rendezvous timeout (FSDP_RENDEZVOUS_TIMEOUT_S, 5 s here), each with one error line naming
    what it waited for, no libtorch backtrace, no flight-recorder diagnosis."""
    (rc0, err0, t0), (rc1, err1, t1) = by_hand_with_ports(opts, {0: 29741, 1: 29742})
    e0 = [l for l in err0.splitlines() if "error:" in l]
    e1 = [l for l in err1.splitlines() if "error:" in l]
    check(rc0 == 1 and len(e0) == 1 and "rank 1 did not join the rendezvous" in e0[0] and t0 < 60,
          "other MASTER_PORTs, rank 0: exit %d after %.0f s: %r" % (rc0, t0, e0))
    check(rc1 == 1 and len(e1) == 1 and "nothing answered at the TCP store 127.0.0.1:29742" in e1[0] and
          "give every rank the same MASTER_ADDR and MASTER_PORT" in e1[0] and t1 < 60,
          "other MASTER_PORTs, rank 1: exit %d after %.0f s: %r" % (rc1, t1, e1))
    check(all("Exception raised from" not in e and "frame #" not in e and "no diagnosis" not in e for e in (err0, err1)),
          "no libtorch backtrace, no diagnosis of a rendezvous: %s" % (err0 + err1)[-800:])


def rank_pids(marker):
    """{rank: pid} of torchrun's ranks whose command line contains marker (the agent has no RANK)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if marker not in f.read().decode(errors="replace"):
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
            if "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                out[int(env["RANK"])] = int(pid)
        except (OSError, ValueError):
            continue
    return out


def test_restart(opts, tmp):
    test_rendezvous_faults(opts)
    steps = 24
    flags = ["--steps", str(steps), "--mixed-precision", "fp32", "--strategy", "full_shard",
             "--save-every", "4", "--resume", "auto"]
    ref = os.path.join(tmp, "ref.jsonl")
    torchrun(2, opts, flags + ["--save", os.path.join(tmp, "ref-ckpt"), "--metrics", ref])
    want = losses(ref)
    check(sorted(want) == list(range(1, steps + 1)), "uninterrupted run: %d steps" % steps)

    save, m = os.path.join(tmp, "ckpt"), os.path.join(tmp, "run.jsonl")
    cmd = torchrun_cmd(2, opts, flags + ["--save", save, "--metrics", m], ["--max-restarts", "1"])
    log = open(os.path.join(tmp, "torchrun.log"), "w+")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    killed = None
    deadline = time.time() + 240
    while job.poll() is None and time.time() < deadline:
        done = sorted(losses(m))
        if killed is None and done and done[-1] >= 9:  # the checkpoint of step 8 is written
            pids = rank_pids(m)
            if 1 in pids:
                killed = (pids[1], done[-1])
                os.kill(pids[1], signal.SIGKILL)
        time.sleep(0.05)
    if job.poll() is None:
        job.kill()
    log.seek(0)
    text = log.read()
    if job.returncode != 0:
        sys.stderr.write(text[-4000:])
    check(killed is not None, "rank 1 (pid %s) was killed after step %s" % killed if killed else "rank 1 was killed")
    check(job.returncode == 0, "torchrun restarted the job and it finished (exit %s)" % job.returncode)
    # The restarted attempt appends to --metrics: the events after its config line are its own,
    # and the first attempt's steps stay before them.
    with open(m) as f:
        all_events = [json.loads(line) for line in f if line.strip()]
    starts = [i for i, e in enumerate(all_events) if e.get("event") == "config"]
    check(len(starts) == 2, "the metrics file holds both attempts (config lines at %s)" % starts)
    first = {e["step"]: e["loss"] for e in all_events[:starts[-1]] if e.get("event") == "step"}
    check(sorted(first)[:killed[1]] == list(range(1, killed[1] + 1)) and
          all(first[s] == want[s] for s in first),
          "the first attempt's steps 1..%d are kept, equal to the uninterrupted run's" % killed[1])
    got = {e["step"]: e["loss"] for e in all_events[starts[-1]:] if e.get("event") == "step"}
    resumed_from = min(got) - 1
    check(resumed_from >= 8 and resumed_from % 4 == 0 and resumed_from <= killed[1],
          "the restart resumed from the checkpoint of step %d (killed at step %d)" % (resumed_from, killed[1]))
    check(sorted(got) == list(range(resumed_from + 1, steps + 1)), "steps %d..%d after the restart"
          % (resumed_from + 1, steps))
    check(all(got[s] == want[s] for s in got), "losses after the restart equal the uninterrupted run's bit for bit")
    check("(steps %d-%d, resumed at step %d)" % (resumed_from + 1, steps, resumed_from) in text,
          "the restarted attempt's closing line says which steps it trained")

    # A restart before the first checkpoint: --resume auto starts fresh and still appends, so the
    # earlier attempt's events (here one step record standing for them) stay in --metrics.
    early, me = os.path.join(tmp, "ckpt-empty"), os.path.join(tmp, "early.jsonl")
    with open(me, "w") as f:
        f.write(json.dumps({"event": "step", "step": 1, "loss": 1.0, "attempt": "earlier"}) + "\n")
    torchrun(2, opts, ["--steps", "2", "--resume", "auto", "--save", early, "--metrics", me])
    with open(me) as f:
        kept = [json.loads(line) for line in f if line.strip()]
    fresh = [e for e in kept if e.get("event") == "config"]
    check(kept[0].get("attempt") == "earlier" and len(fresh) == 1 and fresh[0].get("resume") == "" and
          fresh[0].get("resume_asked") == "auto",
          "a fresh start under --resume auto appends to --metrics (earlier attempt kept; config says "
          "resume '', resume_asked 'auto')")

    # The same checkpoint continues at other world sizes (a copy: --resume auto takes the newest).
    for n in (1, 4):  # the tests' global batch of 4 sequences divides among 1, 2 and 4 ranks
        ck, mn = os.path.join(tmp, "ckpt-n%d" % n), os.path.join(tmp, "n%d.jsonl" % n)
        name = "step-%09d" % resumed_from  # the checkpoint's directory (src/checkpoint/save.cpp)
        shutil.copytree(os.path.join(save, name), os.path.join(ck, name))
        torchrun(n, opts, flags + ["--save", ck, "--metrics", mn])
        cont = losses(mn)
        rest = range(resumed_from + 1, steps + 1)
        check(sorted(cont) == list(rest), "N=%d continues at step %d" % (n, resumed_from + 1))
        rel = max_rel(want, cont, rest)
        check(rel <= 1e-4, "N=%d after the checkpoint: max rel loss diff %.3g <= 1e-4" % (n, rel))


if __name__ == "__main__":
    sys.exit(run_main({"parity": test_parity, "restart": test_restart}, "fsdp-torchrun-"))
