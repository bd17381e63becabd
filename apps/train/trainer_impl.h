// The Trainer behind train() (trainer.h), private to fsdp-train: its set-up (trainer_setup.cpp),
// the measured part of a step and evaluation (trainer_step.cpp), and the step loop with its
// evaluations, checkpoints, sample and export (trainer.cpp). Collectives are issued in the same
// order on every rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/batch_sampler.h"
#include "data/tokenizer.h"
#include "fsdp/comm/exposed_wait.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/options.h"
#include "models/model_config.h"
#include "train/corpus.h"
#include "train/loss_scaling.h"
#include "train/model_setup.h"
#include "train/nonfinite.h"
#include "train/progress.h"
#include "train/reporting.h"
#include "train/train_config.h"

namespace apps::train {

/// Mean loss over `batches` global validation batches, micro sequences per forward. Collective
/// over group (the model's forwards, then one all-reduce); no grad.
double evaluate(const std::shared_ptr<models::CausalLMImpl>& model, const data::DistributedBatchSampler& val,
                int64_t batches, int64_t micro, fsdp::comm::ProcessGroup& group);

/// What the measured part of a step leaves on this rank.
struct StepResult {
  double local_loss = 0.0;  ///< mean over this rank's rows
  double grad_norm = 0.0;
  bool stepped = true;
  double loss_scale = 1.0;  ///< the scale this step's backward used
  StepMemory mem;           ///< this rank's; peak_bytes filled by the caller
  fsdp::comm::CommStats::Snapshot stats_before;
  std::array<double, fsdp::comm::kWaitPhaseCount> exposed_before{};  ///< fsdp::comm::exposed_wait_s()
  double step_time_s = 0.0;
};

/// One run: the set-up in the constructor (in the order of its collectives), then run().
class Trainer {
 public:
  Trainer(const TrainConfig& c, fsdp::comm::ProcessGroupPtr group, bool heap_retained);
  void run();

 private:
  StepResult train_step(const at::Tensor& batch, int64_t step);
  /// The counting allocator's bytes now, less the unsharded params alive (activation_bytes).
  int64_t held_for_activations() const;
  void eval_now(int64_t step);
  void save_now();
  // --on-output-error stop: the ranks agree (one all-reduce, only under stop) on whether any
  // rank's output failed (`failed_here`: this rank's); if one did, every rank throws the same
  // RunError naming them and `when`. The failing rank has said which file and why.
  void stop_if_output_failed(bool failed_here, const std::string& when);
  void sample();

  const TrainConfig cfg_;
  const fsdp::comm::ProcessGroupPtr group_;
  const int rank_, world_;
  Console console_;
  const BatchGeometry batch_;
  const fsdp::FullyShardOptions fsdp_options_, root_options_;
  LossScaling loss_scaling_;
  RunFacts facts_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  Corpus corpus_;
  std::optional<data::DistributedBatchSampler> train_sampler_, val_sampler_;
  int64_t eval_batches_ = 0;  ///< --eval-batches, at most the validation set once
  models::ModelConfig model_config_;
  std::shared_ptr<models::CausalLMImpl> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  TrainProgress progress_;
  std::optional<JsonLines> metrics_;
  TraceRecorder trace_;
  double last_val_ = NAN;
  std::string newest_checkpoint_;  ///< the newest complete checkpoint, for the interrupt line ("" none)
  std::optional<NonFiniteInjection> inject_nonfinite_;  ///< test only
};

}  // namespace apps::train
