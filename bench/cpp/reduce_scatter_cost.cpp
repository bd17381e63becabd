// What a reduce-scatter costs over the world group's backend, and what its alternatives would:
//   reduce_scatter  ProcessGroup::reduce_scatter_tensor (MPI and Gloo: an all-to-all and a local sum
//                   in rank order, [Note: all-to-all reductions])
//   all_reduce      the all-reduce route: all_reduce of the whole input, then this rank's block
//   all_to_all      the all-to-all alone (the reduce-scatter without its local sum)
// The three run interleaved, in rounds that rotate their order, so that a drift of a shared
// machine hits all alike; rank 0 prints the median per op in milliseconds and the bus bandwidth
// (input bytes x (N-1)/N per op) for each input size.
//
//   torchrun --no-python --standalone --nproc-per-node 2 build/bin/fsdp-reduce-scatter-cost [iters=20]
//   mpirun -n 2 build/bin/fsdp-reduce-scatter-cost [iters=20]
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fsdp/comm/world.h"

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  fsdp::comm::init_launcher();
  auto g = fsdp::comm::world_from_env("auto");
  at::set_num_threads(1);
  const int n = g->size();
  const char* names[3] = {"reduce_scatter", "all_reduce", "all_to_all"};
  if (g->rank() == 0) {
    std::printf("backend %s, %d ranks, float32, median of %d rounds of %d\n", g->backend_name().c_str(), n, 6,
                std::max(1, iters / 6));
    std::printf("| input MiB | op | ms | bus GB/s |\n|---|---|---|---|\n");
  }
  for (int64_t mib : {1, 4, 16, 64}) {
    const int64_t numel = mib * (1 << 20) / 4 / n * n;
    at::Tensor in = at::rand({numel});
    at::Tensor out = at::empty({numel / n});
    at::Tensor scratch = at::empty({numel});
    std::vector<double> ms[3];
    for (int round = 0; round < 6; ++round) {
      for (int k = 0; k < 3; ++k) {
        const int which = (round + k) % 3;
        g->barrier()->wait();
        const double t0 = fsdp::comm::now_s();
        const int reps = std::max(1, iters / 6);
        for (int i = 0; i < reps; ++i) {
          if (which == 0) g->reduce_scatter_tensor(out, in)->wait();
          if (which == 1) {
            scratch.copy_(in);
            g->all_reduce(scratch)->wait();
            out.copy_(scratch.narrow(0, g->rank() * (numel / n), numel / n));
          }
          if (which == 2) g->all_to_all(scratch, in)->wait();
        }
        ms[which].push_back((fsdp::comm::now_s() - t0) * 1e3 / reps);
      }
    }
    for (int k = 0; k < 3; ++k) {
      std::sort(ms[k].begin(), ms[k].end());
      const double med = ms[k][ms[k].size() / 2];
      const double bus = static_cast<double>(numel) * 4 * (n - 1) / n / (med * 1e-3) / 1e9;
      if (g->rank() == 0) std::printf("| %lld | %s | %.3f | %.2f |\n", static_cast<long long>(mib), names[k], med, bus);
    }
  }
  return 0;
}
