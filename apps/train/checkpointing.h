// Checkpoints of fsdp-train: what a checkpoint's TrainState holds, --resume, --save, --export,
// --import and --import-optimizer (their paths are checked before training by preflight.h). Every
// call here is collective over the group and turns the library's fsdp::Error into a CheckpointError.
//
// [Note: checkpoint contents]
// A checkpoint (fsdp::checkpoint::save_sharded) holds the model shards, the AdamW state
// (exp_avg, exp_avg_sq, step) and a TrainState with ints "step" (optimizer steps done), "lr_step"
// (schedule position), "sampler_pos" (sequences consumed: the next global batch is
// sampler_pos / --global-batch-size), the tensor "rng" (CPU generator state) and, for fp16, the
// double "grad_scale" and the int "growth_tracker" (LossScaling::save_state), and the model's
// settings no parameter shape shows: doubles "model.norm_eps" and, for Llama, "model.rope_theta". A run resumed at
// the same world size repeats the uninterrupted run's losses bit for bit (fp32); at another world
// size the global batches are the same and only reduction order differs.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/comm/process_group.h"
#include "models/model_config.h"
#include "train/loss_scaling.h"
#include "train/progress.h"
#include "train/train_config.h"

namespace apps::train {

/// What --resume loaded.
struct Resumed {
  TrainProgress progress;  ///< all zero without --resume
  std::string path;        ///< the checkpoint directory loaded ("" without --resume)
  double load_s = 0.0;     ///< seconds of fsdp::checkpoint::load_sharded
};

/// --resume auto resolved: "latest" when --save DIR (`save_dir`) holds a complete checkpoint,
/// "" (a fresh start) when it holds none or does not exist; any other `resume` is returned as is.
/// Every rank must get the same answer: ranks that disagree (a --save that is not one shared
/// directory) are refused with CheckpointError naming the ranks that found one, since one rank
/// starting afresh while another resumes would train two different models. Collective over group
/// (one all-gather); call it before anything reads --resume.
std::string resolve_auto_resume(const std::string& resume, const std::string& save_dir,
                                fsdp::comm::ProcessGroup& group);

/// --resume PATH ("latest": --save DIR; "auto" must be resolved first by resolve_auto_resume): loads the model shards, the optimizer state, the CPU
/// generator and the loss scaler state, and returns the progress. Without --resume, and only
/// then (the two are exclusive), --import-optimizer PATH: the optimizer state of a plain libtorch
/// run (fsdp::checkpoint::import_optimizer), whose AdamW was built like make_optimizer builds
/// fsdp-train's (a decay group, then a no-decay group, each in the model's parameter order; the
/// group options come from the file, the schedule then sets lr each step); the progress stays
/// zero. Call it right after building the optimizer (after --import). Collective and blocking over
/// group. Throws CheckpointError when the checkpoint or the optimizer file cannot be loaded
/// (missing, incomplete, corrupt, another model or optimizer) or its TrainState is not consistent
/// (resume_checks.h), and UsageError when the checkpoint was written with another --global-batch-size
/// or for a model of other settings than model_config (its norm epsilon, Llama's rope_theta).
Resumed resume(const TrainConfig& c, const models::ModelConfig& model_config,
               const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
               LossScaling& loss_scaling, const fsdp::comm::ProcessGroupPtr& group);

/// A checkpoint written by save().
struct Saved {
  std::string path;     ///< --save DIR / the checkpoint's directory name
  double save_s = 0.0;  ///< seconds of fsdp::checkpoint::save_sharded
};

/// Writes the checkpoint of `progress` and model_config's settings into --save DIR (keeping the
/// newest --keep). Collective and blocking over group, after the optimizer step. Throws
/// CheckpointError when the write fails (the previous checkpoint stays valid).
Saved save(const TrainConfig& c, const TrainProgress& progress, const models::ModelConfig& model_config,
           const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
           const LossScaling& loss_scaling, const fsdp::comm::ProcessGroupPtr& group);

/// --import PATH: full weights (an --export file, or a Python torch.save of a dict of tensors)
/// into the sharded model; returns the seconds it took (0, and nothing done, without --import).
/// Collective and blocking over group. Throws CheckpointError when the file is unreadable or holds
/// another model.
double import_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group);

/// --init-from-hf: the Hugging Face directory's weights straight into the shards
/// (fsdp::checkpoint::import_safetensors with the family's models::hf_import_options); seconds
/// taken, 0 without the flag or with --resume (the checkpoint holds the weights; the directory
/// gives the model's config). The model was built from its config.json (resolve_model: model_config).
/// Collective; throws as import_weights does.
double import_hf_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                         const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group);
/// Files of an --export-hf past this many bytes are split (model-0000k-of-0000n.safetensors and an
/// index), as save_pretrained's default max_shard_size "5GB" does.
constexpr int64_t kHfMaxFileBytes = 5'000'000'000;
/// --export-hf: the model as a Hugging Face directory of model_config's family (GPT2LMHeadModel
/// or LlamaForCausalLM: config.json, safetensors streamed unit by unit, in --export-hf-dtype cast
/// from the fp32 master weights, split past kHfMaxFileBytes; a LoRA fine-tune's adapters merged
/// into their layers' weights); seconds taken. Collective; throws as
/// export_weights does.
double export_hf_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                         const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group);
/// --export-adapter: a LoRA fine-tune's adapters alone as PEFT's adapter_model.safetensors and
/// adapter_config.json (models::peft_export_options; base_model_name_or_path --init-from-hf's
/// directory); seconds taken. Collective; throws as export_weights does.
double export_adapter_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                              const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group);
/// --export PATH: the full state dict, written by rank 0 (torch.load-able); returns the seconds
/// it took. Call only with --export set. Collective and blocking over group. Throws
/// CheckpointError when the write fails.
double export_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group);

}  // namespace apps::train
