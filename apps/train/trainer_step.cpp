// The measured part of a step and evaluation (trainer_impl.h).
#include "train/trainer_impl.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "fsdp/accounting/memory.h"
#include "fsdp/runtime/model_state.h"
#include "fsdp/common/activity.h"
#include "fsdp/optim/clip.h"
#include "fsdp/runtime/fully_shard.h"
#include "models/gpt.h"
#include "train/errors.h"

namespace apps::train {

double evaluate(const std::shared_ptr<models::CausalLMImpl>& model, const data::DistributedBatchSampler& val, int64_t batches,
                int64_t micro, fsdp::comm::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  const int64_t T = val.seq_len();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor batch = val.eval_batch(b);  // (G/N, T+1)
    for (int64_t r = 0; r < batch.size(0); r += micro) {
      at::Tensor mb = batch.slice(0, r, std::min(r + micro, batch.size(0)));
      at::Tensor logits = fsdp::call(model, mb.slice(1, 0, T));
      sum += models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1)).item<double>();
      ++count;
    }
  }
  at::Tensor mean = at::tensor(std::vector<double>{sum / count}, at::kDouble);
  group.all_reduce(mean, fsdp::comm::ReduceOp::kAvg)->wait();
  return mean.item<double>();
}

int64_t Trainer::held_for_activations() const {
  return fsdp::accounting::current_bytes() -
         fsdp::accounting::model_state_bytes(model_).unsharded_param_bytes;
}

StepResult Trainer::train_step(const at::Tensor& batch, int64_t step) {
  // The measured part of the step: [Note: measurement rules] in reporting.h.
  StepResult r;
  const int64_t T = cfg_.seq_len, micro = batch_.micro, accum = batch_.accum;
  fsdp::accounting::reset_peak_bytes();
  r.stats_before = group_->stats().snapshot();
  r.exposed_before = fsdp::comm::exposed_wait_s();
  const auto t0 = Clock::now();
  try {
  for (int64_t k = 0; k < accum; ++k) {
    fsdp::set_requires_gradient_sync(model_, k == accum - 1);
    at::Tensor mb = batch.slice(0, k * micro, (k + 1) * micro);  // (micro, T+1)
    at::Tensor loss;
    const int64_t held_before = held_for_activations();
    {
      TraceScope s(trace_, "forward mb" + std::to_string(k));
      at::Tensor logits = fsdp::call(model_, mb.slice(1, 0, T));  // (micro, T, V)
      const fsdp::ActivityScope activity(nullptr, "loss");
      loss = models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1));
      if (inject_nonfinite_ && inject_nonfinite_->step == step && inject_nonfinite_->rank == rank_) {
        loss = loss * std::numeric_limits<double>::quiet_NaN();  // test only
      }
    }
    // [Note: measurement rules] What the forward and the loss left for backward.
    r.mem.activation_bytes = std::max(r.mem.activation_bytes, held_for_activations() - held_before);
    {
      TraceScope s(trace_, "backward mb" + std::to_string(k));
      const fsdp::ActivityScope activity(nullptr, "backward");
      loss_scaling_.scale(loss / static_cast<double>(accum)).backward();
    }
    r.local_loss += loss.item<double>() / static_cast<double>(accum);
  }
  } catch (...) {
    // A failure between the forward and the backward (the loss refused by --memory-budget) on
    // this rank: its peers may be in that backward; they fail their step too and the ranks agree
    // on the report (failures.h). Failures inside forward or backward are settled there.
    fsdp::abandon_step(model_);
    throw;
  }
  fsdp::accounting::ModelStateBytes state;
  r.loss_scale = loss_scaling_.current_scale();
  {
    TraceScope s(trace_, "optimizer step (clip + AdamW)");
    const fsdp::ActivityScope activity(nullptr, "optimizer step");
    loss_scaling_.unscale(model_);
    r.grad_norm = fsdp::clip_grad_norm(model_, cfg_.grad_clip);
    const std::string nonfinite = nonfinite_report(step, r.local_loss, r.grad_norm,
                                                   !loss_scaling_.enabled(), model_, *group_);
    if (!nonfinite.empty() && cfg_.on_nonfinite == "stop") {
      throw RunError(nonfinite + "; stopped before the optimizer step, no checkpoint of this step "
                     "(--on-nonfinite skip drops such steps instead)");
    }
    if (!nonfinite.empty()) {
      r.stepped = false;  // --on-nonfinite skip: the update is dropped, as the fp16 scaler does
      loss_scaling_.skip_step();
      console_.line(nonfinite + "; update skipped (--on-nonfinite skip)");
    } else {
      r.stepped = loss_scaling_.step(*optimizer_, model_);
    }
    state = fsdp::accounting::model_state_bytes(model_, optimizer_.get());
    optimizer_->zero_grad();
  }
  r.step_time_s = seconds_since(t0);
  const int64_t activation_bytes = r.mem.activation_bytes;
  r.mem = {state.sharded_param_bytes, state.sharded_grad_bytes, state.optim_state_bytes,
           state.unsharded_param_bytes, state.resident_bytes(), 0, activation_bytes};
  return r;
}

}  // namespace apps::train
