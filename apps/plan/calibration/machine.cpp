#include "plan/calibration/machine.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {

double memory_copy_rate(WorkTimer& timer) {
  fsdp::comm::ProcessGroup& g = timer.group();
  const int64_t elems = int64_t{1} << 22;
  at::Tensor src = at::randn({elems}), dst = at::empty({elems}), flush = at::empty({int64_t{1} << 25});
  g.barrier()->wait();
  dst.copy_(src);
  // Four copies a run (there and back twice): long enough beside a barrier's own interval.
  constexpr int kCopies = 4;
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    flush.fill_(1.0f);
    t.push_back(timer.seconds([&] {
      for (int c = 0; c < kCopies; ++c) (c % 2 ? src.copy_(dst) : dst.copy_(src));
    }));
  }
  return across_ranks(g, {kCopies * 2.0 * 4.0 * static_cast<double>(elems) / median(t)}, /*min=*/true)[0];
}

int64_t cores_available(fsdp::comm::ProcessGroup& g) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  at::Tensor mask = at::zeros({CPU_SETSIZE}, at::kFloat);  // (CPU_SETSIZE,): 1 where this rank may run
  float* m = mask.data_ptr<float>();
  for (int c = 0; c < CPU_SETSIZE; ++c) m[c] = CPU_ISSET(c, &set) ? 1.0f : 0.0f;
  g.all_reduce(mask, fsdp::comm::ReduceOp::kMax)->wait();
  return std::max<int64_t>(1, mask.sum().item<int64_t>());
}

int64_t ranks_on_this_node(int64_t world) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {  // mpirun, torchrun
    if (const char* s = std::getenv(var)) return std::max(1, std::atoi(s));
  }
  return world;
}

}  // namespace apps::plan::calibration
