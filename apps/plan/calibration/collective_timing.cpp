#include "plan/calibration/collective_timing.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>

#include "fsdp/planner/memory.h"
#include "fsdp/planner/time_model.h"

namespace apps::plan::calibration {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;

fsdp::comm::WorkPtr issue_collective(fsdp::comm::ProcessGroup& g, CollectiveKind kind, const at::Tensor& big,
                                     const at::Tensor& small) {
  constexpr fsdp::comm::ReduceOp kAvg = fsdp::comm::ReduceOp::kAvg;
  if (kind == CollectiveKind::kAllGather) return g.all_gather_into_tensor(big, small);
  if (kind == CollectiveKind::kReduceScatter) return g.reduce_scatter_tensor(small, big, kAvg);
  return g.all_reduce(big, kAvg);
}

// Seconds of one collective of `bytes` logical bytes (fp32), measured `reps` times after a warm-up.
std::vector<double> time_collective(fsdp::comm::ProcessGroup& g, CollectiveKind kind, int64_t bytes, int reps) {
  const int64_t n = g.size(), elems = std::max<int64_t>(n, bytes / 4 / n * n);
  at::Tensor big = at::zeros({elems}, at::kFloat), small = at::zeros({elems / n}, at::kFloat);
  auto run = [&] { issue_collective(g, kind, big, small)->wait(); };
  run();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    g.barrier()->wait();
    const double t0 = now_s();
    run();
    t.push_back(now_s() - t0);
  }
  return t;
}

std::vector<int64_t> collective_sizes(const fp::ModelSpec& m, const fp::StepSetup& step, int64_t n) {
  constexpr int64_t kMaxCollectiveBytes = int64_t{256} << 20;
  std::vector<int64_t> sizes{4 << 10, 64 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20};
  const int64_t pb = fp::param_bytes_per_elem(step.precision), rb = fp::reduce_bytes_per_elem(step.precision);
  std::vector<int64_t> messages;
  for (const fp::UnitSpec& u : m.units) {
    const fp::UnitNumbers un = fp::unit_numbers(u, n, 0);
    messages.push_back(pb * un.gathered_numel);
    messages.push_back(rb * un.reduce_numel);
    for (int64_t b : fp::ddp_bucket_numels(u, step.bucket_cap_bytes, rb)) messages.push_back(rb * b);
  }
  // As timed: whole fp32 elements, a multiple of n of them (time_collective).
  const auto timed = [n](int64_t b) { return std::max<int64_t>(n, b / 4 / n * n) * 4; };
  for (int64_t& x : sizes) x = timed(x);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int64_t m : messages) {
    if (m < (4 << 10) || m > kMaxCollectiveBytes) continue;
    const int64_t b = timed(m);
    const bool near = std::any_of(sizes.begin(), sizes.end(), [b](int64_t x) {
      return std::abs(static_cast<double>(b - x)) <= 0.05 * static_cast<double>(x);
    });
    if (!near) sizes.push_back(b);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

}  // namespace apps::plan::calibration
