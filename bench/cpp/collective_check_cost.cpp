// The cost of ProcessGroup's collective check ([Note: collective check]): the latency of a small
// all-reduce through ProcessGroup (check + op) and through the MPI backend alone (op), measured in
// one run, alternating. Run under mpirun -n N; rank 0 prints the per-collective overhead.
//
//   mpirun -n 2 build/bin/fsdp-collective-check-cost [iterations=2000] [elements=1024]
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fsdp/comm/mpi_backend.h"

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 1024;
  auto group = fsdp::comm::mpi_world();
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  fsdp::comm::MpiBackend raw(dup);
  at::Tensor t = at::ones({n});
  std::vector<double> with_check, without;
  for (int round = 0; round < 10; ++round) {
    for (int which = 0; which < 2; ++which) {
      const bool checked = (round + which) % 2 == 0;
      raw.barrier();
      const double t0 = fsdp::comm::now_s();
      for (int i = 0; i < iters / 10; ++i) {
        if (checked) {
          group->all_reduce(t)->wait();
        } else {
          raw.all_reduce(t, fsdp::comm::ReduceOp::kSum);
        }
      }
      const double us = (fsdp::comm::now_s() - t0) * 1e6 / (iters / 10);
      (checked ? with_check : without).push_back(us);
    }
  }
  std::sort(with_check.begin(), with_check.end());
  std::sort(without.begin(), without.end());
  if (group->rank() == 0) {
    const double a = with_check[with_check.size() / 2], b = without[without.size() / 2];
    std::printf("all_reduce of %lld float32 at N=%d: %.1f us through ProcessGroup (check + queue + op), "
                "%.1f us through the backend alone: %.1f us per collective for the check and the queue\n",
                static_cast<long long>(n), group->size(), a, b, a - b);
  }
  return 0;
}
