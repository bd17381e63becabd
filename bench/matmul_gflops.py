"""fp32 (and bf16) GEMM throughput of this torch build: C = A @ B, n x n, 1 and 2 intra-op threads.

    python3 bench/matmul_gflops.py [--n 1024] [--reps 20]

torch.mm from Python calls the same libtorch (libtorch_cpu.so, the wheel's MKL/oneDNN) that
fsdp-train links; the Python overhead per call is ~10 us against ~10-100 ms of work at n = 1024.
GFLOP/s = 2 n^3 / median wall time (also: best wall time, and per CPU-second of the process,
which is what an uncontended core gives when other jobs share the machine). Prints one line per (dtype, threads) and the BLAS configuration.
"""
import argparse
import statistics
import time

import torch


def bench(n, dtype, threads, reps):
    torch.set_num_threads(threads)
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=c)
    ts, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        torch.mm(a, b, out=c)
        ts.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    flop = 2 * n ** 3
    # per CPU-second: what one fully owned core delivers (insensitive to other load on the machine)
    return flop / statistics.median(ts) / 1e9, flop / min(ts) / 1e9, flop / statistics.median(cpu) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bf16", action="store_true", help="also time bfloat16")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}, "
          f"oneDNN {torch.backends.mkldnn.is_available()}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    for dtype in [torch.float32] + ([torch.bfloat16] if a.bf16 else []):
        for threads in (1, 2):
            med, best, per_cpu = bench(a.n, dtype, threads, a.reps if dtype == torch.float32 else 2)
            print(f"{str(dtype).replace('torch.', ''):9s} n={a.n} threads={threads}: "
                  f"{med:7.1f} GFLOP/s median (wall), {best:7.1f} best (wall), "
                  f"{per_cpu:7.1f} per CPU-second", flush=True)


if __name__ == "__main__":
    main()
