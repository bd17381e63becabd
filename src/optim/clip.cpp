#include "fsdp/optim/clip.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fsdp/comm/comm_context.h"
#include "fsdp/common/check.h"
#include "sharded_grads.h"

namespace fsdp {

// [Note: gradient norm accuracy] docs/architecture.md.
double sum_of_squares(const at::Tensor& t) {
  if (t.numel() == 0) return 0.0;
  at::NoGradGuard no_grad;
  constexpr int64_t kChunkNumel = int64_t{1} << 18;
  const at::Tensor flat = t.reshape({-1});
  double total = 0.0;
  for (int64_t begin = 0; begin < flat.numel(); begin += kChunkNumel) {
    const at::Tensor chunk = flat.slice(0, begin, std::min(begin + kChunkNumel, flat.numel())).to(at::kFloat);
    total += at::sum(chunk * chunk, at::kDouble).item<double>();
  }
  return total;
}

double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm,
                      double norm_type) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  FSDP_CHECK(inf || norm_type == 2.0, ErrorKind::kUnsupported, (ErrorContext{-1, "", "clip_grad_norm"}),
             expected_actual("norm_type", "2 or inf", norm_type));
  // Each rank adds its shards' sum of squares divided by how many ranks hold the same shard
  // (1 when sharded, the world size when replicated), and one all-reduce over the data-parallel
  // group sums the distinct shards: a replicated gradient is counted once, not once per rank.
  detail::ShardedGrads sg = detail::sharded_grads(root, "clip_grad_norm");
  const double local = detail::local_norm_part(sg, inf);
  double total = local;
  if (sg.group) {
    // inf: MPI's MAX may drop a NaN operand, so a NaN travels as a separate flag.
    at::Tensor t = at::tensor({std::isnan(local) ? 0.0 : local, std::isnan(local) ? 1.0 : 0.0}, at::kDouble)
                       .to(comm::CommContext::for_group(*sg.group).flag_device);
    sg.group->all_reduce(t, inf ? comm::ReduceOp::kMax : comm::ReduceOp::kSum, comm::OpTag{"", "clip_grad_norm"})->wait();
    total = t[1].item<double>() > 0 ? std::numeric_limits<double>::quiet_NaN() : t[0].item<double>();
  }
  if (!inf) total = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      at::NoGradGuard no_grad;
      for (auto& g : sg.grads) g.mul_(coef);
    }
  }
  return total;
}

}  // namespace fsdp
