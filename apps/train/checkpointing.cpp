// fsdp-train's checkpoint calls (checkpointing.h) over fsdp::checkpoint.
#include "train/checkpointing.h"

#include <ATen/ops/tensor.h>
#include <algorithm>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/import_optimizer.h"
#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "fsdp/runtime/fully_shard.h"
#include "train/errors.h"
#include "train/reporting.h"
#include "train/resume_checks.h"

namespace apps::train {
namespace {

/// Runs a collective checkpoint call, turning its fsdp::Error into a CheckpointError.
template <typename F>
auto checkpoint_call(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const fsdp::Error& e) {
    throw CheckpointError(what + ": " + e.what());
  }
}

}  // namespace

Resumed resume(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
               torch::optim::Optimizer& optimizer, LossScaling& loss_scaling,
               const fsdp::comm::ProcessGroupPtr& group) {
  Resumed r;
  if (c.resume.empty()) {
    if (!c.import_optimizer_path.empty()) {
      checkpoint_call("--import-optimizer " + c.import_optimizer_path, [&] {
        fsdp::checkpoint::ImportOptimizerOptions io;
        io.param_names = fsdp::checkpoint::optimizer_param_names(model, optimizer);
        fsdp::checkpoint::import_optimizer(c.import_optimizer_path, model, optimizer, group, io);
      });
      for (const auto& sp : fsdp::sharded_parameters(model)) {
        if (const auto state = fsdp::optim::get_param_state(optimizer, sp.tensor)) {
          r.progress.optimizer_step_offset = std::max(r.progress.optimizer_step_offset, state->step);
        }
      }
    }
    return r;
  }
  const std::string path = c.resume == "latest" ? c.save : c.resume;
  fsdp::checkpoint::TrainState st;
  const auto t0 = Clock::now();
  const std::string what = c.resume == "latest" ? "--resume latest (the newest in --save " + c.save + ")"
                                                : "--resume " + path;
  r.path = checkpoint_call(what, [&] {
    return fsdp::checkpoint::load_sharded(path, model, &optimizer, &st, group);
  });
  r.load_s = seconds_since(t0);
  r.progress = validated_progress(c, r.path, st, optimizer, model);
  check_resumed_optimizer_options(c, r.path, optimizer);
  if (auto it = st.tensors.find("rng"); it != st.tensors.end()) {
    fsdp::checkpoint::set_cpu_rng_state(it->second);
  }
  loss_scaling.load_state(st);
  return r;
}

Saved save(const TrainConfig& c, const TrainProgress& progress,
           const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
           const LossScaling& loss_scaling, const fsdp::comm::ProcessGroupPtr& group) {
  fsdp::checkpoint::TrainState st;
  st.ints["step"] = progress.step;
  st.ints["lr_step"] = progress.lr_step;
  if (progress.optimizer_step_offset > 0) st.ints["optimizer_step_offset"] = progress.optimizer_step_offset;
  st.ints["sampler_pos"] = progress.batch_pos * c.global_batch_size;
  st.tensors["rng"] = fsdp::checkpoint::cpu_rng_state();
  loss_scaling.save_state(st);
  fsdp::checkpoint::SaveOptions so;
  so.keep_last_k = static_cast<int>(c.keep);
  const auto t0 = Clock::now();
  std::string name = checkpoint_call("--save " + c.save, [&] {
    return fsdp::checkpoint::save_sharded(c.save, model, &optimizer, st, group, so);
  });
  const double save_s = seconds_since(t0);
  return {c.save + "/" + name, save_s};
}

double import_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group) {
  if (c.import_path.empty()) return 0.0;
  const auto t0 = Clock::now();
  checkpoint_call("--import " + c.import_path,
                  [&] { fsdp::checkpoint::import_full(c.import_path, model, group); });
  return seconds_since(t0);
}

double export_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group) {
  const auto t0 = Clock::now();
  checkpoint_call("--export " + c.export_path,
                  [&] { fsdp::checkpoint::export_full(c.export_path, model, group); });
  return seconds_since(t0);
}

}  // namespace apps::train
