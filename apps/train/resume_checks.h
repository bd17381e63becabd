// What fsdp-train takes from a checkpoint's TrainState after fsdp::checkpoint::load_sharded has
// validated the files ([Note: manifest validation] in src/checkpoint/manifest_check.cpp): the
// counters of [Note: checkpoint contents] (checkpointing.h) are checked for range and for
// consistency with each other, with the optimizer's steps and with this run's flags before any is
// used. The checkpoint is the same file on every rank, so every rank reaches the same verdict.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>

#include "fsdp/checkpoint/checkpoint.h"
#include "train/progress.h"
#include "train/train_config.h"

namespace apps::train {

/// The progress recorded in `st`, loaded from checkpoint `path`. Rules: "step", "lr_step" and
/// "sampler_pos" present and >= 0; lr_step == step (both advance once per step); sampler_pos ==
/// step x --global-batch-size; every parameter's optimizer step in [0, step] (a skipped step does
/// not count); with fp16 state, grad_scale finite and > 0 and growth_tracker >= 0; the "rng"
/// tensor, when present, a uint8 tensor of the CPU generator's state size.
/// Throws UsageError when sampler_pos says another --global-batch-size (naming it), and
/// CheckpointError ("--resume PATH: ...", expected vs actual) for anything else. No collective.
TrainProgress validated_progress(const TrainConfig& c, const std::string& path,
                                 const fsdp::checkpoint::TrainState& st,
                                 const torch::optim::Optimizer& optimizer,
                                 const std::shared_ptr<torch::nn::Module>& model);

/// The AdamW options a resumed optimizer took from checkpoint `path` (load_sharded restores each
/// group's options, as torch's Optimizer::load_state_dict does) against this run's flags: --beta1,
/// --beta2 and --weight-decay (the decay group's; the other group's is 0) must equal the
/// checkpoint's, or the flags would be ignored silently (the learning rate follows the schedule
/// of --lr each step and may change). Throws UsageError naming the flag, the checkpoint's value
/// and this run's. No collective.
void check_resumed_optimizer_options(const TrainConfig& c, const std::string& path,
                                     const torch::optim::Optimizer& optimizer);

}  // namespace apps::train
