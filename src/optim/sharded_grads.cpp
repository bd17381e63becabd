#include "sharded_grads.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "fsdp/common/check.h"
#include "fsdp/optim/clip.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::detail {

ShardedGrads sharded_grads(const std::shared_ptr<torch::nn::Module>& root, const char* op) {
  ShardedGrads out;
  wait_for_pending(root);
  for (const auto& u : units_of(root)) {
    FSDP_CHECK(!out.group || out.group == u->group(), ErrorKind::kInvalidArgument, u->where(op),
               "the unit trains over another process group than the other units under this root");
    out.group = u->group();
    for (const auto& p : u->params()) {
      const at::Tensor& g = p.sharded_param.grad();
      if (!g.defined() || g.numel() == 0) continue;
      out.grads.push_back(g);
      out.num_replicas.push_back(u->num_replicas());
    }
  }
  return out;
}

double local_norm_part(const ShardedGrads& g, bool inf) {
  if (g.grads.empty()) return 0.0;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  parts.reserve(g.grads.size());
  for (size_t i = 0; i < g.grads.size(); ++i) {
    // inf: a max is exact in any dtype. 2: fsdp::sum_of_squares sums in double ([Note: gradient
    // norm accuracy]), so the shards' parts add up to the full gradient's.
    parts.push_back(inf ? at::linalg_vector_norm(g.grads[i], INFINITY).to(at::kDouble)
                        : at::scalar_tensor(sum_of_squares(g.grads[i]) / static_cast<double>(g.num_replicas[i]),
                                            at::kDouble));
  }
  at::Tensor all = at::stack(parts);
  // max() and sum() propagate NaN: a NaN gradient gives a NaN result, never a dropped one.
  return (inf ? all.max() : all.sum()).item<double>();
}

}  // namespace fsdp::detail
