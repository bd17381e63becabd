#!/usr/bin/env python3
"""A stalled or diverged rank never hangs the job (run by ctest, apps/CMakeLists.txt).

  stall_e2e.py stall N --bin fsdp-train --diagnose fsdp-diagnose --data-dir ./data
      fsdp-train at N ranks with --collective-timeout 5; once it trains, rank N-1 is stopped with
      SIGSTOP (a rank that neither dies nor answers). Asserts: the job exits non-zero within
      timeout + 15 s of the stop (plus start-up slack), the output names the timed-out collective
      (number, op) and the stopped rank, and fsdp-diagnose on the flight-recorder dumps names the
      stopped rank as the one that left no dump while the others wait in one collective (an
      earlier job's dump of that rank, left in the directory first, is left out by both).
      Then a rank stalls inside a checkpoint save, and inside a resume's load (test-only
      FSDP_TRAIN_INJECT_STALL stops it as it enters the operation), rank 0 in one case and rank
      N-1 in the other: the job ends, each live rank's own error line names the operation and the
      collective, fsdp-train's diagnosis names the stalled rank (rank 0 included), and no
      checkpoint is published by the stalled save.
  stall_e2e.py diverge N --mpi-tests fsdp_mpi_tests --diagnose fsdp-diagnose
      The MPI test in which ranks route to different units (an fsdp::Error of kind mismatch on
      every rank) runs with FSDP_FLIGHT_RECORDER_DIR set; fsdp-diagnose on its dumps names the
      collective and the units each side ran.
  --launcher torchrun runs either under torchrun over Gloo (the stopped rank is killed once every
  live rank has ended, standing in for torchrun's fixed 30 s grace before its SIGKILL: wait_job).

Exit 0: pass; 77: skipped (no data / no launcher); anything else: fail.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 5
# The bound the issue sets (timeout + 15 s), plus the time to notice and reap the processes.
EXIT_BOUND_S = TIMEOUT_S + 15 + 5
LAUNCHER = "mpirun"


def launch_prefix(n):
    if LAUNCHER == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--no-python", "--standalone",
                "--nproc-per-node", str(n)]
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n)]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def rank_pids(marker):
    """{rank: pid} of the processes whose command line contains marker (OMPI_COMM_WORLD_RANK, or
    torchrun's RANK: the agent itself has none)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            if marker not in cmd or "mpirun" in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
            if "OMPI_COMM_WORLD_RANK" in env:
                out[int(env["OMPI_COMM_WORLD_RANK"])] = int(pid)
            elif "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                out[int(env["RANK"])] = int(pid)
        except (OSError, ValueError):
            continue
    return out


def is_stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def kill_all(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_job(p, marker, timeout_s):
    """Waits for the job p (TimeoutExpired past timeout_s). Under torchrun, once every rank process
    left (command line containing marker) is a stopped one, kills it: torchrun's agent, once a rank
    failed, sends the others SIGTERM and kills them 30 s later (torch 2.13 applies no
    --shutdown-timeout on that path), and a stopped process acts on SIGTERM only once continued. What
    is tested is that the live ranks end the job; the agent's fixed grace is left out of the bound."""
    end = time.time() + timeout_s
    while p.poll() is None:
        if time.time() > end:
            raise subprocess.TimeoutExpired(p.args, timeout_s)
        if LAUNCHER == "torchrun":
            pids = rank_pids(marker)
            if pids and all(is_stopped(pid) for pid in pids.values()):
                kill_all(pids.values())
        time.sleep(0.1)
    return p.returncode


def run_diagnose(opts, fr_dir, stale_rank=None):
    """fsdp-diagnose's paragraph (stdout). stale_rank: the rank of leave_stale_dump's dump, which
    its stderr must say it left out while the file is still there (a rank that runs again before
    the job ends may write its own over it)."""
    p = subprocess.run([opts.diagnose, fr_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=30)
    print("fsdp-diagnose:", p.stdout.strip(), p.stderr.strip())
    if stale_rank is not None:
        with open(os.path.join(fr_dir, f"rank-{stale_rank:05d}.json")) as f:
            still_stale = json.load(f).get("reason") == "an earlier job"
        if still_stale and f"rank {stale_rank}'s dump: from an earlier job" not in p.stderr:
            fail(f"fsdp-diagnose does not say it left out the earlier job's dump: {p.stderr}")
    return p.stdout


def leave_stale_dump(fr_dir, rank):
    """An earlier job's dump of `rank` in the directory, placing it in a collective it has long left:
    the diagnosis of this job must leave it out ([Note: stale dumps])."""
    os.makedirs(fr_dir, exist_ok=True)
    hour_ago = time.time() - 3600
    with open(os.path.join(fr_dir, f"rank-{rank:05d}.json"), "w") as f:
        json.dump({"rank": rank, "world_size": rank + 1, "reason": "an earlier job",
                   "process_started_unix_s": hour_ago - 60, "written_unix_s": hour_ago,
                   "records": [{"group": "world", "seq": 3, "kind": "all_gather", "dtype": "float",
                                "numel": 1, "bytes": 4, "unit": "stale", "phase": "forward",
                                "state": "timed out", "error": "an earlier job's timeout"}]}, f)


def test_stall(opts, n, tmp):
    fr_dir = os.path.join(tmp, "flight-recorder")
    metrics = os.path.join(tmp, "metrics.jsonl")
    leave_stale_dump(fr_dir, n - 1)  # the rank this test stops, which then writes none of its own
    cmd = launch_prefix(n) + [opts.bin, "--data-dir", opts.data_dir, "--model", "nano", "--n-layer", "2", "--n-embd", "64",
           "--global-batch-size", "4", "--seq-len", "32", "--eval-every", "0", "--progress", "lines",
           "--steps", "100000", "--collective-timeout", str(TIMEOUT_S), "--flight-recorder-dir", fr_dir,
           "--metrics", metrics]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(os.path.join(tmp, "out.txt"), "w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    stopped = None
    try:
        t0 = time.time()
        while time.time() - t0 < 120:  # wait for training (start-up under load can be slow)
            if p.poll() is not None:
                log.seek(0)
                fail(f"fsdp-train ended before the stall (rc {p.returncode}):\n{log.read()[-3000:]}")
            if os.path.exists(metrics) and '"event":"step"' in open(metrics).read():
                break
            time.sleep(0.2)
        else:
            fail("fsdp-train did not reach step 1 in 120 s")
        pids = rank_pids(fr_dir)
        if len(pids) != n:
            fail(f"found the processes of ranks {sorted(pids)}, expected {n}")
        victim = n - 1
        stopped = pids[victim]
        os.kill(stopped, signal.SIGSTOP)
        t_stop = time.time()
        try:
            wait_job(p, fr_dir, EXIT_BOUND_S + 30)
        except subprocess.TimeoutExpired:
            fail(f"the job still runs {EXIT_BOUND_S + 30} s after rank {victim} stopped: it hangs")
        took = time.time() - t_stop
        log.seek(0)
        out = log.read()
        print(f"N={n}: rank {victim} stopped; job exited with rc {p.returncode} after {took:.1f} s")
        if p.returncode == 0:
            fail("the job exited 0 after a rank stalled")
        if took > EXIT_BOUND_S:
            fail(f"the job took {took:.1f} s to end, bound {EXIT_BOUND_S} s")
        m = re.search(r"timed out[^\n]*#(\d+)", out) or re.search(r"#(\d+)[^\n]*timed out", out)
        if not m:
            fail(f"no message names the timed-out collective:\n{out[-3000:]}")
        if f"rank {victim} left no dump" not in out and f"ranks {victim} left no dump" not in out:
            fail(f"fsdp-train's diagnosis does not name rank {victim}:\n{out[-3000:]}")
        for bad in ("terminate called", "Exception raised from", "Segmentation fault"):
            if bad in out:
                fail(f"'{bad}' in the output:\n{out[-3000:]}")
        diag = run_diagnose(opts, fr_dir, stale_rank=n - 1)
        # When mpirun ends the job it sends SIGCONT before SIGTERM, so the stopped rank may run long
        # enough to write its own dump; it then says it was suspended.
        # Or it wrote a dump while still inside a collective its peers had completed (stopped right
        # after the data moved): it is behind.
        named = [f"rank {victim} left no dump", f"rank {victim} was suspended", f"rank {victim} is behind"]
        if not any(x in diag for x in named):
            fail(f"fsdp-diagnose does not name rank {victim}: {diag}")
        where = diag.split(f"rank {victim} ")[0]
        # Every live rank is placed in a collective: "rank 0 timed out in #27 (...)", or "ranks 0
        # and 1 timed out in #24 (...); rank 2 timed out in #25 (...)" when a ring step finished.
        placed = set()
        for clause in where.split(";"):
            m = re.match(r"\s*ranks? ([\d, and]+) (?:timed out|waits?) in #\d+", clause)
            if m:
                placed |= {int(x) for x in re.findall(r"\d+", m.group(1))}
        if placed != set(range(n - 1)):
            fail(f"fsdp-diagnose places ranks {sorted(placed)} in a collective, expected 0..{n - 2}: {diag}")
    finally:
        if stopped is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                kill_all([stopped], sig)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_checkpoint_stall(opts, n, tmp, phase, victim):
    fr_dir = os.path.join(tmp, "fr-" + phase)
    ck = os.path.join(tmp, "ck-" + phase)
    mpirun = launch_prefix(n) + [opts.bin]
    base = ["--data-dir", opts.data_dir, "--model", "nano", "--n-layer", "2", "--n-embd", "64",
            "--global-batch-size", "4", "--seq-len", "32", "--eval-every", "0", "--progress", "lines",
            "--collective-timeout", str(TIMEOUT_S), "--save", ck]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if phase == "load":
        p = subprocess.run(mpirun + base + ["--steps", "2", "--save-every", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
        if p.returncode != 0:
            fail(f"the run that saves the checkpoint to resume failed (rc {p.returncode}):\n{p.stdout[-2000:]}")
        args = base + ["--steps", "4", "--resume", "latest"]
    else:
        args = base + ["--steps", "4", "--save-every", "2"]
    args += ["--flight-recorder-dir", fr_dir]
    t0 = time.time()
    log = open(os.path.join(tmp, f"out-{phase}.txt"), "w+")
    p = subprocess.Popen(mpirun + args, stdout=log, stderr=subprocess.STDOUT, text=True,
                         env=dict(env, FSDP_TRAIN_INJECT_STALL=f"{phase}:{victim}"))
    try:
        wait_job(p, fr_dir, EXIT_BOUND_S + 90)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"N={n}: rank {victim} stalled in the {phase}: the job still runs after {EXIT_BOUND_S + 90} s")
    finally:
        kill_all(rank_pids(fr_dir).values())
    log.seek(0)
    out = log.read()
    print(f"N={n}: rank {victim} stalled in the checkpoint {phase}; job exited with rc {p.returncode} "
          f"after {time.time() - t0:.1f} s")
    if p.returncode == 0:
        fail(f"the job exited 0 after rank {victim} stalled in the {phase}")
    flag = "--save" if phase == "save" else "--resume"
    lines = [l for l in out.splitlines() if l.startswith("fsdp-train [rank") and "error:" in l]
    named = [l for l in lines if flag in l and re.search(r"collective #\d+ [^\n]*did not complete", l)]
    if not named:
        fail(f"no rank's error line names {flag} and the timed-out collective:\n{out[-3000:]}")
    if f"rank {victim} was stopped" not in out and not any(
            f"rank {victim} {x}" in out for x in ("left no dump", "was suspended", "is behind")):
        fail(f"fsdp-train's own output does not name the stalled rank {victim}:\n{out[-3000:]}")
    for bad in ("terminate called", "Exception raised from", "Segmentation fault"):
        if bad in out:
            fail(f"'{bad}' in the output:\n{out[-3000:]}")
    if phase == "save":
        published = [d for d in os.listdir(ck) if d.startswith("step-")] if os.path.isdir(ck) else []
        if published or os.path.exists(os.path.join(ck, "latest")):
            fail(f"the stalled save published {published} (latest: {os.path.exists(os.path.join(ck, 'latest'))})")


def test_diverge(opts, n, tmp):
    fr_dir = os.path.join(tmp, "flight-recorder")
    env = dict(os.environ, OMP_NUM_THREADS="1", FSDP_FLIGHT_RECORDER_DIR=fr_dir)
    if LAUNCHER == "torchrun":
        env["FSDP_TEST_BACKEND"] = "gloo"
    cmd = launch_prefix(n) + [opts.mpi_tests,
           "--gtest_filter=Correctness.RanksCallingDifferentUnitsAreNamedNotPaired"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    if p.returncode != 0:
        fail(f"the mismatch test failed (rc {p.returncode}):\n{p.stdout[-3000:]}")
    dumps = sorted(os.listdir(fr_dir)) if os.path.isdir(fr_dir) else []
    if len(dumps) != n:
        fail(f"expected {n} flight-recorder dumps, found {dumps}")
    diag = run_diagnose(opts, fr_dir)
    for want in ("disagreed at", "unit 'e0', forward", "unit 'e1', forward", "from rank 0", "#"):
        if want not in diag:
            fail(f"fsdp-diagnose does not say '{want}': {diag}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["stall", "diverge"])
    ap.add_argument("n", type=int)
    ap.add_argument("--bin")
    ap.add_argument("--mpi-tests")
    ap.add_argument("--diagnose", required=True)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--launcher", choices=["mpirun", "torchrun"], default="mpirun",
                    help="torchrun: the ranks over Gloo")
    opts = ap.parse_args()
    global LAUNCHER
    LAUNCHER = opts.launcher
    if shutil.which(LAUNCHER) is None:
        print(f"SKIP: {LAUNCHER} not found")
        return 77
    if opts.mode == "stall" and not os.path.exists(os.path.join(opts.data_dir, "spm_8192.model")):
        print(f"SKIP: no prepared data in {opts.data_dir} (scripts/prepare_data.sh)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        if opts.mode == "stall":
            test_stall(opts, opts.n, tmp)
            # Rank 0 stalls in one phase and rank N-1 in the other, the pairing swapped between N.
            first, last = (0, opts.n - 1) if opts.n == 2 else (opts.n - 1, 0)
            test_checkpoint_stall(opts, opts.n, tmp, "save", first)
            test_checkpoint_stall(opts, opts.n, tmp, "load", last)
        else:
            test_diverge(opts, opts.n, tmp)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
