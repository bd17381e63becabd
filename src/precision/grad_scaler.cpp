#include "fsdp/precision/grad_scaler.h"

#include <ATen/ATen.h>

#include <cmath>

#include "fsdp/comm/comm_context.h"
#include "fsdp/common/check.h"
#include "../optim/sharded_grads.h"

namespace fsdp {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  FSDP_CHECK(options_.init_scale > 0 && options_.growth_factor > 1.0 &&
                 options_.backoff_factor > 0 && options_.backoff_factor < 1.0 &&
                 options_.growth_interval >= 1,
             ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "GradScaler"}),
             "invalid options: init_scale ", options_.init_scale, " (expected > 0), growth_factor ",
             options_.growth_factor, " (> 1), backoff_factor ", options_.backoff_factor,
             " (in (0, 1)), growth_interval ", options_.growth_interval, " (>= 1)");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

bool GradScaler::unscale(const std::shared_ptr<torch::nn::Module>& model) {
  if (unscaled_) return found_inf_;
  detail::ShardedGrads sg = detail::sharded_grads(model, "GradScaler::unscale");
  {
    at::NoGradGuard no_grad;
    for (auto& g : sg.grads) g.mul_(1.0 / scale_);
  }
  // max |g| is inf or NaN exactly when some gradient element is.
  const bool local_inf = !std::isfinite(detail::local_norm_part(sg, /*inf=*/true));
  at::Tensor flag = at::tensor({static_cast<int64_t>(local_inf)}, at::kLong);
  if (sg.group) {
    flag = flag.to(comm::CommContext::for_group(*sg.group).flag_device);
    sg.group->all_reduce(flag, comm::ReduceOp::kMax, comm::OpTag{"", "grad_scaler"})->wait();
  }
  found_inf_ = flag.item<int64_t>() != 0;
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer,
                      const std::shared_ptr<torch::nn::Module>& model) {
  FSDP_CHECK(!stepped_, ErrorKind::kState, (ErrorContext{-1, "", "GradScaler::step"}),
             "called twice since the last update(); call update() after each step()");
  bool inf = unscale(model);
  if (!inf) optimizer.step();
  stepped_ = true;
  return !inf;
}

void GradScaler::update() {
  FSDP_CHECK(unscaled_, ErrorKind::kState, (ErrorContext{-1, "", "GradScaler::update"}),
             "called before unscale() or step() in this step");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  stepped_ = false;
  found_inf_ = false;
}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  FSDP_CHECK(scale > 0, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "GradScaler::load_state"}),
             expected_actual("scale", "> 0", scale));
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  unscaled_ = false;
  stepped_ = false;
  found_inf_ = false;
}

}  // namespace fsdp
