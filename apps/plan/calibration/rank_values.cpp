#include "plan/calibration/rank_values.h"

#include <ATen/ops/tensor.h>

#include <algorithm>

namespace apps::plan::calibration {
namespace {

// Every entry all-reduced over the ranks by `op` (a double tensor). Blocking; collective.
std::vector<double> all_reduce_values(fsdp::comm::ProcessGroup& g, const std::vector<double>& v, fsdp::comm::ReduceOp op) {
  at::Tensor t = at::tensor(v, at::kDouble);
  g.all_reduce(t, op)->wait();
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + v.size());
}

}  // namespace

// The slowest rank's value of every entry (a max all-reduce); `min` for rates.
std::vector<double> across_ranks(fsdp::comm::ProcessGroup& g, std::vector<double> v, bool min) {
  if (!min) return all_reduce_values(g, v, fsdp::comm::ReduceOp::kMax);
  for (double& x : v) x = -x;
  std::vector<double> r = all_reduce_values(g, v, fsdp::comm::ReduceOp::kMax);
  for (double& x : r) x = -x;
  return r;
}

// The mean over ranks of every entry (an average all-reduce).
std::vector<double> mean_across_ranks(fsdp::comm::ProcessGroup& g, const std::vector<double>& v) {
  return all_reduce_values(g, v, fsdp::comm::ReduceOp::kAvg);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace apps::plan::calibration
