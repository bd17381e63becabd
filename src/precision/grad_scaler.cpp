#include "fsdp/precision/grad_scaler.h"

#include <ATen/ATen.h>

#include <set>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  FSDP_CHECK(options_.init_scale > 0 && options_.growth_factor > 1.0 &&
                 options_.backoff_factor > 0 && options_.backoff_factor < 1.0 &&
                 options_.growth_interval >= 1,
             "[fsdp] GradScaler: invalid options (init_scale ", options_.init_scale,
             ", growth_factor ", options_.growth_factor, ", backoff_factor ",
             options_.backoff_factor, ", growth_interval ", options_.growth_interval, ")");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

bool GradScaler::unscale(const std::shared_ptr<torch::nn::Module>& model) {
  if (unscaled_) return found_inf_;
  wait_for_pending(model);
  at::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  bool local_inf = false;
  std::set<comm::ProcessGroup*> groups;
  std::vector<comm::ProcessGroupPtr> group_list;
  for (const auto& u : units_of(model)) {
    if (groups.insert(u->group().get()).second) group_list.push_back(u->group());
    for (const auto& p : u->params()) {
      const at::Tensor& g = p.sharded_param.grad();
      if (!g.defined() || g.numel() == 0) continue;
      g.mul_(inv);
      if (!local_inf && !at::isfinite(g).all().item<bool>()) local_inf = true;
    }
  }
  at::Tensor flag = at::tensor({static_cast<int64_t>(local_inf)}, at::kLong);
  for (const auto& g : group_list) g->all_reduce(flag, comm::ReduceOp::kMax)->wait();
  found_inf_ = flag.item<int64_t>() != 0;
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer,
                      const std::shared_ptr<torch::nn::Module>& model) {
  bool inf = unscale(model);
  if (!inf) optimizer.step();
  return !inf;
}

void GradScaler::update() {
  FSDP_CHECK(unscaled_, "[fsdp] GradScaler::update called before unscale/step in this step");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  FSDP_CHECK(scale > 0, "[fsdp] GradScaler::load_state: scale must be > 0, got ", scale);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace fsdp
