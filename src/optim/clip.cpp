#include "fsdp/optim/clip.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp {

double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm,
                      double norm_type) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  FSDP_CHECK(inf || norm_type == 2.0, "[fsdp] clip_grad_norm: norm_type ", norm_type,
             " is not supported (2 or inf)");
  auto units = units_of(root);
  wait_for_pending(root);
  // Each rank adds its shards' sum of squares divided by how many ranks hold the same shard
  // (1 when sharded, the world size when replicated), and one all-reduce over the data-parallel
  // group sums the distinct shards: a replicated gradient is counted once, not once per rank.
  comm::ProcessGroupPtr group;
  double local = 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& u : units) {
    FSDP_CHECK(!group || group == u->group(), "[fsdp rank ", u->group()->rank(),
               "] clip_grad_norm: unit '", u->name(),
               "' trains over another process group than the other units under this root");
    group = u->group();
    for (const auto& p : u->params()) {
      const at::Tensor& g = p.sharded_param.grad();
      if (!g.defined() || g.numel() == 0) continue;
      grads.push_back(g);
      at::Tensor g64 = g.to(at::kDouble);
      if (inf) {
        local = std::max(local, g64.abs().max().item<double>());
      } else {
        local += g64.pow(2).sum().item<double>() / static_cast<double>(u->num_replicas());
      }
    }
  }
  double reduced = local;
  if (group) {
    at::Tensor t = at::tensor({local}, at::kDouble);
    group->all_reduce(t, inf ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)->wait();
    reduced = t.item<double>();
  }
  double total = inf ? reduced : std::sqrt(reduced);
  if (max_norm > 0) {
    double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      at::NoGradGuard no_grad;
      for (auto& g : grads) g.mul_(coef);
    }
  }
  return total;
}

}  // namespace fsdp
