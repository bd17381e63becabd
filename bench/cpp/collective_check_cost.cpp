// The cost of ProcessGroup's collective check ([Note: collective check]). The check adds one
// all-gather of a 120-byte signature per rank before each op; this measures, in one run with the
// three cases interleaved: that all-gather alone through the MPI backend (the added work), an
// all-reduce of `elements` float32 through the backend alone, and the same all-reduce through
// ProcessGroup (check + queue + op). Run under mpirun -n N; rank 0 prints medians in microseconds.
// The check's share of a training step = check_us x collectives per step / step time.
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
  at::Tensor sig = at::zeros({120}, at::kByte);
  at::Tensor sigs = at::zeros({120 * group->size()}, at::kByte);
  std::vector<double> us[3];
  for (int round = 0; round < 12; ++round) {
    for (int k = 0; k < 3; ++k) {
      const int which = (round + k) % 3;
      raw.barrier();
      const double t0 = fsdp::comm::now_s();
      for (int i = 0; i < iters / 12; ++i) {
        if (which == 0) raw.all_gather(sigs, sig);
        if (which == 1) raw.all_reduce(t, fsdp::comm::ReduceOp::kSum);
        if (which == 2) group->all_reduce(t)->wait();
      }
      us[which].push_back((fsdp::comm::now_s() - t0) * 1e6 / (iters / 12));
    }
  }
  for (auto& v : us) std::sort(v.begin(), v.end());
  if (group->rank() == 0) {
    std::printf("N=%d: signature all-gather (the check) %.1f us; all_reduce of %lld float32: backend %.1f us, "
                "ProcessGroup %.1f us\n",
                group->size(), us[0][6], static_cast<long long>(n), us[1][6], us[2][6]);
  }
  return 0;
}
