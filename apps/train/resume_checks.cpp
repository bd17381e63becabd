// The TrainState checks of --resume (resume_checks.h).
#include "train/resume_checks.h"

#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>

#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "fsdp/runtime/fully_shard.h"
#include "train/errors.h"

namespace apps::train {
namespace {

std::string s(int64_t v) { return std::to_string(v); }

}  // namespace

TrainProgress validated_progress(const TrainConfig& c, const std::string& path,
                                 const fsdp::checkpoint::TrainState& st,
                                 const torch::optim::Optimizer& optimizer,
                                 const std::shared_ptr<torch::nn::Module>& model) {
  const std::string head = "--resume " + path + ": the checkpoint's train state ";
  auto fail = [&](const std::string& why) { throw CheckpointError(head + why); };
  auto need = [&](const char* key) {
    auto it = st.ints.find(key);
    if (it == st.ints.end()) fail(std::string("has no '") + key + "' (not written by fsdp-train?)");
    if (it->second < 0) fail(fsdp::expected_actual(std::string("'") + key + "'", ">= 0", it->second));
    return it->second;
  };
  TrainProgress p;
  p.step = need("step");
  p.lr_step = need("lr_step");
  const int64_t sampler_pos = need("sampler_pos");
  if (p.lr_step != p.step) {
    fail("is inconsistent: " + fsdp::expected_actual("'lr_step' (advanced with 'step')", p.step, p.lr_step));
  }
  const int64_t G = c.global_batch_size;
  if (p.step > 0 && sampler_pos % p.step == 0 && sampler_pos / p.step != G) {
    throw UsageError(head + "says --global-batch-size " + s(sampler_pos / p.step) + " (" +
                     s(sampler_pos) + " sequences in " + s(p.step) + " steps), this run has " + s(G) +
                     ": resume with the same --global-batch-size");
  }
  if (sampler_pos != p.step * G) {
    fail("is inconsistent: " + fsdp::expected_actual("'sampler_pos' ('step' x --global-batch-size " + s(G) + ")",
                                                    p.step * G, sampler_pos));
  }
  p.batch_pos = sampler_pos / G;
  if (st.ints.count("optimizer_step_offset")) p.optimizer_step_offset = need("optimizer_step_offset");
  const int64_t max_optimizer_step = p.step + p.optimizer_step_offset;
  for (const auto& sp : fsdp::sharded_parameters(model)) {
    const auto state = fsdp::optim::get_param_state(optimizer, sp.tensor);
    if (state && (state->step < 0 || state->step > max_optimizer_step)) {
      fail("is inconsistent with the optimizer state: parameter '" + sp.name + "' " +
           fsdp::expected_actual("optimizer step",
                                 "in [0, " + s(max_optimizer_step) + "] ('step' + 'optimizer_step_offset')",
                                 state->step));
    }
  }
  if (auto it = st.doubles.find("grad_scale"); it != st.doubles.end()) {
    if (!std::isfinite(it->second) || it->second <= 0) {
      fail(fsdp::expected_actual("'grad_scale'", "finite and > 0", it->second));
    }
  }
  if (auto it = st.ints.find("growth_tracker"); it != st.ints.end() && it->second < 0) {
    fail(fsdp::expected_actual("'growth_tracker'", ">= 0", it->second));
  }
  if (auto it = st.tensors.find("rng"); it != st.tensors.end()) {
    const at::Tensor want = fsdp::checkpoint::cpu_rng_state();
    if (it->second.scalar_type() != at::kByte || it->second.numel() != want.numel()) {
      fail(fsdp::expected_actual("'rng' (the CPU generator state)", s(want.numel()) + " uint8",
                                 s(it->second.numel()) + " " + std::string(c10::toString(it->second.scalar_type()))));
    }
  }
  return p;
}

void check_resumed_optimizer_options(const TrainConfig& c, const std::string& path,
                                     const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&groups[g].options());
    if (!o) continue;
    const double want_wd = g == 0 ? c.weight_decay : 0.0;  // make_optimizer: decay, then no-decay
    const std::pair<const char*, std::pair<double, double>> fields[] = {
        {"--beta1", {std::get<0>(o->betas()), c.beta1}},
        {"--beta2", {std::get<1>(o->betas()), c.beta2}},
        {"--weight-decay", {o->weight_decay(), want_wd}},
    };
    for (const auto& [flag, values] : fields) {
      if (values.first == values.second) continue;
      char buf[160];
      std::snprintf(buf, sizeof(buf), "says %s %.10g, this run has %.10g", flag, values.first, values.second);
      throw UsageError("--resume " + path + ": the checkpoint's optimizer " + buf + ": resume with the same " +
                       flag + " (a resumed AdamW keeps the options it was saved with)");
    }
  }
}

}  // namespace apps::train
