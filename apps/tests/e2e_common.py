"""What the end-to-end tests of fsdp-train share (train_e2e.py, train_checkpoint_e2e.py,
train_hf_e2e.py, train_inputs.py, train_files_e2e.py): the tiny run's flags, launching it under
mpirun (or torchrun over Gloo when FSDP_E2E_LAUNCHER=torchrun), reading its metrics, and the
checks."""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time


# mpirun (Open MPI) ends a job whose rank exited non-zero by sending the others SIGTERM, then waits
# odls_base_sigkill_timeout (1 s, twice: 2 s a job) before SIGKILL. Most runs here are refusals that
# exit at once on every rank, so the wait is most of their time (50 of the 120 s of train_inputs.py
# were it); fsdp-train ends on SIGTERM at once. Tests that check what a rank does on mpirun's
# SIGTERM (train_files_e2e.py's interrupt) take the default back (mpirun_default_teardown).
FAST_TEARDOWN = "OMPI_MCA_odls_base_sigkill_timeout"
os.environ.setdefault(FAST_TEARDOWN, "0")


def mpirun_default_teardown(env):
    """env without FAST_TEARDOWN: mpirun's own SIGTERM-to-SIGKILL grace."""
    return {k: v for k, v in env.items() if k != FAST_TEARDOWN}


TINY = ["--model", "nano", "--n-layer", "2", "--n-embd", "64", "--global-batch-size", "4",
        "--seq-len", "32", "--eval-every", "0", "--eval-batches", "1", "--progress", "lines",
        "--warmup-steps", "2"]


def launcher():
    """"mpirun" (default) or "torchrun" (FSDP_E2E_LAUNCHER): how the tests start their ranks."""
    name = os.environ.get("FSDP_E2E_LAUNCHER", "mpirun")
    if name not in ("mpirun", "torchrun"):
        raise SystemExit("FSDP_E2E_LAUNCHER=%r: expected mpirun or torchrun" % name)
    return name


def torchrun_prefix(n):
    """torchrun starting n ranks of the program that follows it, through this interpreter (the one
    with torch: no torchrun script on PATH needed)."""
    return [sys.executable, "-m", "torch.distributed.run", "--no-python", "--standalone", "--nproc-per-node", str(n)]


def single_rank_cases_ran_under_mpirun():
    """True in a torchrun variant of a test whose mpirun variant also runs (CMake sets
    FSDP_E2E_BESIDE_MPIRUN=1 there): its one-rank cases, which start no group and read no launcher
    variable a second process would, already ran, and are left out (each torchrun launch costs
    about 2.5 s of interpreter start)."""
    return launcher() == "torchrun" and os.environ.get("FSDP_E2E_BESIDE_MPIRUN") == "1"


def launch_prefix(n, name=None):
    """The command that starts n ranks of the program that follows it: launcher() or `name`."""
    if (name or launcher()) == "torchrun":
        return torchrun_prefix(n)
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n)]


def mpmd_command(groups):
    """One job whose ranks run different command lines (as a wrong hostfile, a per-node config
    file or a stale environment makes them): `groups` is [(count, argv, working_dir or None)], the
    first `count` ranks run the first argv, the next ones the second, and so on. mpirun's own MPMD
    form (`-n k [-wdir d] argv : ...`), or under torchrun one bash per rank that picks its command
    line by $RANK."""
    if launcher() == "mpirun":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
        for i, (count, argv, wdir) in enumerate(groups):
            cmd += ([":"] if i else []) + ["-n", str(count)] + (["-wdir", wdir] if wdir else []) + list(argv)
        return cmd
    script, first = [], 0
    for count, argv, wdir in groups:
        line = ("cd %s && " % shlex.quote(wdir) if wdir else "") + "exec " + " ".join(map(shlex.quote, argv))
        script.append("if [ \"$RANK\" -lt %d ]; then %s; fi" % (first + count, line))
        first += count
    return torchrun_prefix(first) + ["bash", "-c", "\n".join(script) + "\nexit 99"]


def torchrun_child_exit_code(p):
    """The exit code of the rank that failed first, from torchrun's report (torchrun itself exits
    1 for any failed rank), so that checks of fsdp-train's exit codes hold under either launcher."""
    m = re.search(r"Root Cause \(first observed failure\):.*?exitcode\s*:\s*(-?\d+)", p.stdout + p.stderr, re.S)
    return int(m.group(1)) if m else p.returncode


def torchrun_report_start(text):
    """Where torchrun's own closing failure report begins in `text` (its traceback ending in
    ChildFailedError and the table naming the failed rank), or None when it has none. The ranks
    have exited by the time torchrun prints it, so everything from there on is torchrun's."""
    m = re.search(r"^Traceback \(most recent call last\):$(?=.*ChildFailedError)", text, re.M | re.S)
    return m.start() if m else None


def as_the_ranks_ended(p):
    """A finished launch `p` (subprocess.CompletedProcess) as the ranks ended it, under either
    launcher: under torchrun its exit code becomes the first failed rank's and torchrun's failure
    report leaves stderr (kept in p.launcher_report), so that the checks of what the ranks printed
    (one error line, no traceback) hold as under mpirun. Returns p."""
    p.launcher_report = ""
    if launcher() == "torchrun" and p.returncode != 0:
        p.returncode = torchrun_child_exit_code(p)
        cut = torchrun_report_start(p.stderr)
        if cut is not None:
            p.stderr, p.launcher_report = p.stderr[:cut], p.stderr[cut:]
    return p


def launch(args, n, opts, expect_ok=True):
    cmd = launch_prefix(n) + [opts.bin, "--data-dir", opts.data_dir] + TINY + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=300)
    dt = time.time() - t0
    as_the_ranks_ended(p)
    if expect_ok and p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("FAIL: exit %d: %s" % (p.returncode, " ".join(cmd)))
    print("  n=%d %.1fs rc=%d: %s" % (n, dt, p.returncode, " ".join(args)), flush=True)
    return p


def events(path, kind):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [e for e in map(json.loads, f) if e.get("event") == kind]


def losses(path):
    return {e["step"]: e["loss"] for e in events(path, "step")}


def error_line(p):
    lines = [l for l in p.stderr.splitlines() if "fsdp-train: error:" in l]
    return lines[0][:240] if lines else ""


def max_rel(a, b, steps):
    return max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)


def check(cond, msg):
    if not cond:
        raise SystemExit("FAIL: " + msg)
    print("  ok: " + msg, flush=True)


def write_manifest(path, man):
    """Writes manifest dict `man` (without its seal) to path, sealed as a save does: the first
    member "manifest_crc32" holds the CRC-32 of the rest ([Note: manifest seal], docs/checkpoints.md)."""
    import zlib
    body = json.dumps({k: v for k, v in man.items() if k != "manifest_crc32"}, indent=1)
    with open(path, "w") as f:
        f.write('{"manifest_crc32": "0x%08x",' % zlib.crc32(body.encode()) + body[1:])


def run(args, n, opts, env=None):
    cmd = launch_prefix(n) + [opts.bin, "--data-dir", opts.data_dir] + TINY + args
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                       timeout=300)
    as_the_ranks_ended(p)
    print("  n=%d %.1fs rc=%d: %s" % (n, time.time() - t0, p.returncode, " ".join(args)), flush=True)
    return p


def expect_error(p, code, *needles):
    """Exit `code`, exactly one error line containing every needle, no abort banner or backtrace."""
    out = p.stdout + p.stderr
    lines = [l for l in out.splitlines() if "error" in l.lower()]
    ok = (p.returncode == code and len(lines) == 1 and all(n in lines[0] for n in needles) and
          "MPI_ABORT" not in out and "Exception raised from" not in out and "frame #" not in out
          and len(lines[0]) < 600)
    if not ok:
        sys.stderr.write(out[-3000:])
    check(ok, "exit %d, one line with %s: %r" % (p.returncode, needles, lines[0][:300] if lines else ""))


def run_main(tests, prefix, plan=False):
    """The scripts' main: parses --bin, --data-dir (and --plan), and a mode naming one of `tests`
    ({mode: fn(opts, tmp)}) when there are several; skips (77) without mpirun or the prepared data;
    runs the test in a fresh temporary folder, removed afterwards. Returns the exit code."""
    ap = argparse.ArgumentParser()
    if len(tests) > 1:
        ap.add_argument("mode", choices=list(tests))
    ap.add_argument("--bin", required=True)
    if plan:
        ap.add_argument("--plan", help="fsdp-plan")
    ap.add_argument("--data-dir", required=True)
    opts = ap.parse_args()
    if launcher() == "mpirun" and shutil.which("mpirun") is None:
        print("SKIP: no mpirun")
        return 77
    if not os.path.isfile(os.path.join(opts.data_dir, "spm_8192.model")):
        print("SKIP: no data in %s (run scripts/prepare_data.sh %s)" % (opts.data_dir, opts.data_dir))
        return 77
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        t0 = time.time()
        (tests[opts.mode] if len(tests) > 1 else next(iter(tests.values())))(opts, tmp)
        print("PASS (%.1f s)" % (time.time() - t0))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
