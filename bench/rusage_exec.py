"""Runs a command as a child and records the child's peak resident set size (wait4 ru_maxrss).

    mpirun -n N python3 bench/rusage_exec.py DIR -- build-bench/bin/fsdp-train ...

Writes DIR/rss_rank<R>.json = {"rank": R, "maxrss_bytes", "utime_s", "stime_s", "rc"}, R from
BENCH_PROCESS (compare.py's independent processes),
OMPI_COMM_WORLD_RANK or RANK (0 if none), and exits with the child's exit status. The wrapper
itself only waits (no CPU while the child runs); the child's ru_maxrss is its own, not the wrapper's.
"""
import json
import os
import sys


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, cmd = sys.argv[1], sys.argv[3:]
    rank = int(os.environ.get("BENCH_PROCESS", os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))))
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rss_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "maxrss_bytes": ru.ru_maxrss * 1024, "utime_s": ru.ru_utime,
                   "stime_s": ru.ru_stime, "rc": rc}, f)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
