// LossScaling (loss_scaling.h): fsdp::GradScaler where the build has it, the identity otherwise.
#include "train/loss_scaling.h"

#include "train/errors.h"

namespace apps::train {

LossScaling::LossScaling(bool enabled) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (enabled) scaler_.emplace();
#else
  if (enabled) {
    throw UsageError("--mixed-precision fp16 needs loss scaling, and this build of fsdp-cpp has no "
                     "fsdp::GradScaler: use bf16 or fp32");
  }
#endif
}

bool LossScaling::enabled() const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  return scaler_.has_value();
#else
  return false;
#endif
}

at::Tensor LossScaling::scale(const at::Tensor& loss) const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) return scaler_->scale(loss);
#endif
  return loss;
}

void LossScaling::unscale(const std::shared_ptr<torch::nn::Module>& model) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) scaler_->unscale(model);
#endif
}

bool LossScaling::step(torch::optim::Optimizer& optimizer,
                       const std::shared_ptr<torch::nn::Module>& model) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) {
    bool stepped = scaler_->step(optimizer, model);
    scaler_->update();
    return stepped;
  }
#endif
  optimizer.step();
  return true;
}

void LossScaling::skip_step() {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) scaler_->update();
#endif
}

double LossScaling::current_scale() const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) return scaler_->get_scale();
#endif
  return 1.0;
}

void LossScaling::save_state(fsdp::checkpoint::TrainState& state) const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (scaler_) {
    state.doubles["grad_scale"] = scaler_->get_scale();
    state.ints["growth_tracker"] = scaler_->growth_tracker();
  }
#endif
}

void LossScaling::load_state(const fsdp::checkpoint::TrainState& state) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
  if (!scaler_) return;
  auto s = state.doubles.find("grad_scale");
  auto g = state.ints.find("growth_tracker");
  // A checkpoint of an fp32/bf16 run has no scaler state: fp16 then starts at the default scale.
  if (s != state.doubles.end() && g != state.ints.end()) scaler_->load_state(s->second, g->second);
#endif
}

}  // namespace apps::train
