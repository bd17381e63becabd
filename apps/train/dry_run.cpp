#include "train/dry_run.h"

#include <ATen/ops/empty.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <stdexcept>

#include "fsdp/comm/simulated_backend.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/planner/model_spec.h"
#include "models/model_config.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "train/errors.h"
#include "train/model_setup.h"

namespace apps::train {
namespace {

// The loss of one micro-batch of meta token ids (rows, T) through fsdp::call.
template <typename ModelPtr>
at::Tensor meta_loss(const ModelPtr& model, int64_t rows, int64_t T, int64_t vocab) {
  at::Tensor idx = at::empty({rows, T}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  at::Tensor logits = fsdp::call(model, idx);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}).to(at::kFloat), idx.reshape({-1}));
}

}  // namespace

DryRunReport run_dry_run(const TrainConfig& c) {
  const int n = c.dry_run_world_size;
  // Model state does not depend on the batch (activations are not accounted): one micro-batch of
  // --micro-batch-size sequences, default 1, whatever --global-batch-size says.
  BatchGeometry batch;
  batch.micro = c.micro_batch_size > 0 ? c.micro_batch_size : 1;
  // The options as the job would resolve them (--hybrid-shard-group-size host: one simulated host).
  const fsdp::FullyShardOptions blocks = resolve_fsdp_options(c, *fsdp::comm::simulated_world(n, c.dry_run_rank));
  const fsdp::FullyShardOptions root = root_options_of(blocks);
  fsdp::DryRunSpec spec;
  spec.world_size = n;
  spec.rank = c.dry_run_rank;
  spec.make_optimizer = [&c](std::vector<at::Tensor> all) -> std::unique_ptr<torch::optim::Optimizer> {
    std::vector<at::Tensor> p;  // the trainable ones: a LoRA base holds no optimizer state
    for (auto& t : all) {
      if (t.requires_grad()) p.push_back(t);
    }
    return std::make_unique<torch::optim::AdamW>(
        p, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(1e-8).weight_decay(c.weight_decay));
  };
  // The preset's vocabulary unless --vocab-size is given, as fsdp-plan's (one rule for both).
  const int64_t vocab = c.vocab_size_given ? c.vocab_size : fsdp::planner::preset_vocab_size(c.model);
  models::ModelConfig cfg = resolve_model(c, vocab);
  cfg.set_attention("math");  // no values are computed; the kernel choice changes no byte
  const models::LoraConfig lora = lora_config_of(c);
  if (lora.enabled()) {  // the targets are checked now, as a usage error
    try {
      models::add_lora(*models::build_model(cfg, at::kMeta), lora, cfg, at::TensorOptions().device(at::kMeta), c.seed);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--lora-target-modules: ") + e.what());
    }
  }
  spec.build = [cfg, lora, seed = c.seed] {
    auto m = models::build_model(cfg, at::kMeta);
    if (lora.enabled()) models::add_lora(*m, lora, cfg, at::TensorOptions().device(at::kMeta), seed);
    return std::static_pointer_cast<torch::nn::Module>(m);
  };
  spec.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
    fsdp::fully_shard_tree(m, g, models::block_wrap_policy(cfg), blocks, root);
  };
  spec.loss = [=](const std::shared_ptr<torch::nn::Module>& m) {
    return meta_loss(std::dynamic_pointer_cast<models::CausalLMImpl>(m), batch.micro, c.seq_len, cfg.vocab_size());
  };
  DryRunReport r;
  r.model = c.model;
  r.world_size = n;
  r.rank = c.dry_run_rank;
  try {
    r.result = fsdp::dry_run(spec);
  } catch (const fsdp::Error& e) {
    if (e.kind() == fsdp::ErrorKind::kInvalidArgument || e.kind() == fsdp::ErrorKind::kUnsupported) {
      throw UsageError(std::string("the FSDP engine rejected these settings: ") + e.what());
    }
    throw;
  }
  return r;
}

std::string format_dry_run(const DryRunReport& r, const TrainConfig& c) {
  const fsdp::RankStateBytes& b = r.result.bytes;
  char line[256];
  std::string out;
  std::snprintf(line, sizeof(line),
                "dry run: rank %d of %d, %s (%lld params, %lld units), strategy %s, %s, AdamW, %lld collectives "
                "per step\n",
                r.rank, r.world_size, r.model.c_str(), static_cast<long long>(r.result.param_numel),
                static_cast<long long>(r.result.units), c.strategy.c_str(), c.mixed_precision.c_str(),
                static_cast<long long>(r.result.collectives));
  out += line;
  auto row = [&](const char* kind, int64_t bytes) {
    std::snprintf(line, sizeof(line), "  %-20s %12.1f MiB  %16lld bytes\n", kind, bytes / 1048576.0,
                  static_cast<long long>(bytes));
    out += line;
  };
  row("params", b.param_bytes);
  row("grads", b.grad_bytes);
  row("optimizer state", b.optim_state_bytes);
  row("master weights", b.master_weight_bytes);
  row("unsharded at peak", b.peak_unsharded_param_bytes);
  row("total", b.total_bytes());
  return out;
}

}  // namespace apps::train
