// Dynamic loss scaling for fp16 training over sharded gradients (torch.amp.GradScaler semantics,
// with FSDP's ShardedGradScaler rule: an inf/NaN in any rank's shard skips the step on all ranks).
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>

namespace fsdp {

/// Options of GradScaler (defaults of torch.amp.GradScaler).
struct GradScalerOptions {
  double init_scale = 65536.0;  ///< 2^16
  double growth_factor = 2.0;   ///< scale *= growth_factor after growth_interval good steps
  double backoff_factor = 0.5;  ///< scale *= backoff_factor after a step with inf/NaN
  int64_t growth_interval = 2000;
};

/// Usage per optimizer step, on every rank:
///   scaler.scale(loss).backward();      // once per micro-batch
///   scaler.unscale(model);              // optional, e.g. before fsdp::clip_grad_norm
///   bool stepped = scaler.step(optimizer, model);
///   scaler.update();
/// unscale() divides the sharded gradients of every unit under the model by the scale and finds
/// inf/NaN: one local pass (max |g| of every shard, one host sync), then all_reduce(MAX) of the flag
/// over the units' group, so that all ranks agree. step() skips optimizer.step() when any rank found one. update() backs the scale off after
/// a skipped step and grows it after growth_interval good steps in a row. unscale(), step() and
/// update() are collective over the units' groups and blocking; call them on all ranks in the same
/// order. Throws fsdp::Error when called out of order: step() twice without update() in between,
/// update() before unscale() or step().
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale (same dtype as loss). Not collective.
  at::Tensor scale(const at::Tensor& loss) const;
  /// Unscales the sharded grads under model in place; returns whether any rank found inf/NaN.
  /// Idempotent within a step (the second call returns the first result).
  bool unscale(const std::shared_ptr<torch::nn::Module>& model);
  /// Unscales if not yet done, then calls optimizer.step() unless inf/NaN was found. Returns true
  /// when the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::shared_ptr<torch::nn::Module>& model);
  /// Adjusts the scale from this step's result and starts a new step.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Restores state saved from get_scale()/growth_tracker() (checkpoint resume).
  void load_state(double scale, int64_t growth_tracker);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;  // unscale() ran since the last update()
  bool stepped_ = false;   // step() ran since the last update()
  bool found_inf_ = false;
};

}  // namespace fsdp
