// Dynamic loss scaling of fsdp-train's fp16 runs (fsdp::GradScaler), a pass-through for fp32 and
// bf16, and the scaler's part of a checkpoint's TrainState.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>

#include "fsdp/checkpoint/checkpoint.h"

// fp16 needs dynamic loss scaling; builds of fsdp-cpp without fsdp::GradScaler reject fp16.
#if __has_include("fsdp/precision/grad_scaler.h")
#include "fsdp/precision/grad_scaler.h"
#define FSDP_TRAIN_HAS_GRAD_SCALER 1
#else
#define FSDP_TRAIN_HAS_GRAD_SCALER 0
#endif

namespace apps::train {

/// fsdp::GradScaler when enabled (fp16): scale the loss, unscale the sharded gradients before
/// clipping, skip the optimizer step on every rank when any rank found inf/NaN. Disabled, every
/// call is the identity (scale 1, the optimizer always steps). Not thread-safe.
class LossScaling {
 public:
  /// Throws UsageError when enabled and this build of fsdp-cpp has no fsdp::GradScaler.
  explicit LossScaling(bool enabled);
  bool enabled() const;
  /// The loss times the current scale (the loss itself when disabled). Not collective.
  at::Tensor scale(const at::Tensor& loss) const;
  /// Unscales the sharded gradients of model (before clipping). Collective over the model's
  /// groups when enabled (one all-reduce of the inf/NaN verdict); nothing when disabled.
  void unscale(const std::shared_ptr<torch::nn::Module>& model);
  /// optimizer.step() unless a rank found inf/NaN gradients, then the scale update; returns
  /// whether the optimizer stepped. Collective when enabled.
  bool step(torch::optim::Optimizer& optimizer, const std::shared_ptr<torch::nn::Module>& model);
  /// Ends the step without an optimizer step (--on-nonfinite skip): the scale update only (after
  /// unscale). Not collective; nothing when disabled.
  void skip_step();
  /// The scale the next backward uses (1 when disabled).
  double current_scale() const;
  /// Writes the scaler state into a checkpoint's TrainState: doubles "grad_scale", ints
  /// "growth_tracker" (nothing when disabled).
  void save_state(fsdp::checkpoint::TrainState& state) const;
  /// Restores what save_state wrote. A TrainState without scaler state (a checkpoint of an fp32 or
  /// bf16 run) leaves the default scale.
  void load_state(const fsdp::checkpoint::TrainState& state);

 private:
#if FSDP_TRAIN_HAS_GRAD_SCALER
  std::optional<fsdp::GradScaler> scaler_;
#endif
};

}  // namespace apps::train
