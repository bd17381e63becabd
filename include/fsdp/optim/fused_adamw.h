// FusedAdamW: torch::optim::AdamW whose step is one vectorised pass per tensor (libtorch's fused
// AdamW kernel) instead of libtorch's chain of element-wise ops.
#pragma once

#include <torch/optim/adamw.h>

#include <vector>

namespace fsdp::optim {

/// A torch::optim::AdamW (same options, param groups, per-param state, torch::save archives, and
/// accepted wherever one is: checkpoints, the optimizer-state adapter, import_optimizer) whose
/// step() updates each param with at::_fused_adamw_: one pass reading the param, its gradient and
/// both moments once and writing them once, vectorised by libtorch for the CPU it runs on (the
/// kernel torch.optim.AdamW(fused=True) runs). libtorch's AdamW::step makes about eight passes
/// over each tensor (decay, two moment updates, sqrt, division, add, addcdiv).
///
/// The update is AdamW's (Loshchilov & Hutter 2019, algorithm 2, with the bias corrections of
/// Kingma & Ba 2015): p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
/// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps) (amsgrad: v replaced by its running max).
/// The result equals libtorch's AdamW to rounding (the kernel orders the same arithmetic
/// differently; within 2e-6 relative after 30 fp32 steps in the tests). Params of any floating dtype with gradients of the same dtype, dense; on the CPU or a device
/// with the kernel. Not collective (each rank steps its own shards). Throws c10::Error for a sparse
/// gradient or a gradient whose dtype or device differs from its param's.
class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      torch::optim::AdamWOptions defaults = {})
      : AdamW(std::move(param_groups), defaults) {}
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : AdamW(std::move(params), defaults) {}

  /// One AdamW step of every param with a gradient (state created on its first step, as AdamW
  /// does). Blocking; returns the closure's loss (undefined without a closure).
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fsdp::optim
