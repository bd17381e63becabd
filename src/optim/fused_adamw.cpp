#include "fsdp/optim/fused_adamw.h"

#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>

namespace fsdp::optim {

at::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      TORCH_CHECK(p.grad().scalar_type() == p.scalar_type() && p.grad().device() == p.device(),
                  "FusedAdamW: a gradient of dtype ", p.grad().scalar_type(), " on ", p.grad().device(),
                  " for a param of dtype ", p.scalar_type(), " on ", p.device(), " (expected the same)");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {  // the state AdamW creates on a param's first step
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) st->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
      // The kernel reads the step count from a float tensor (as torch.optim keeps it).
      steps.push_back(at::scalar_tensor(static_cast<double>(st.step()), at::TensorOptions().dtype(at::kFloat).device(p.device())));
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, o.lr(), std::get<0>(o.betas()),
                      std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
  }
  return loss;
}

}  // namespace fsdp::optim
