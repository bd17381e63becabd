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
  // Sharded grads are summed over the group; a unit over a group of one rank holds the whole
  // gradient on every rank of the caller's world, so it is added after the reduction, once.
  comm::ProcessGroupPtr group;
  double sharded = 0.0, replicated = 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& u : units) {
    double local = 0.0;
    for (const auto& p : u->params()) {
      const at::Tensor& g = p.sharded_param.grad();
      if (!g.defined() || g.numel() == 0) continue;
      grads.push_back(g);
      at::Tensor g64 = g.to(at::kDouble);
      double v = inf ? g64.abs().max().item<double>() : g64.pow(2).sum().item<double>();
      local = inf ? std::max(local, v) : local + v;
    }
    if (u->group()->size() == 1) {
      replicated = inf ? std::max(replicated, local) : replicated + local;
    } else {
      FSDP_CHECK(!group || group == u->group(), "[fsdp rank ", u->group()->rank(),
                 "] clip_grad_norm: units under one root use different process groups ('",
                 u->name(), "'); this build clips over one group");
      group = u->group();
      sharded = inf ? std::max(sharded, local) : sharded + local;
    }
  }
  if (group) {
    at::Tensor t = at::tensor({sharded}, at::kDouble);
    group->all_reduce(t, inf ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)->wait();
    sharded = t.item<double>();
  }
  double total = inf ? std::max(sharded, replicated) : std::sqrt(sharded + replicated);
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
