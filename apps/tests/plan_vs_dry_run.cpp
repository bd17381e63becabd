// The planner's formulas against the real engine's accounting: a dry run (meta tensors, a
// simulated group, one forward/backward/AdamW step through the engine) of gpt2-xl and the
// Llama-2 7B / 13B / 70B presets at N = 8, 64, 512 and 1024 holds exactly the planner's bytes per
// rank, padding included, by kind; so do LoRA fine-tunes (adapters over a frozen base).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include "fsdp/planner/memory.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/runtime/dry_run.h"
#include "fsdp/runtime/fully_shard.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/lora.h"

namespace {

template <typename Impl>
at::Tensor meta_loss(const std::shared_ptr<torch::nn::Module>& m, int64_t vocab) {
  at::Tensor idx = at::empty({1, 16}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  at::Tensor logits = fsdp::call(std::dynamic_pointer_cast<Impl>(m), idx);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), idx.reshape({-1}));
}

// lora.rank > 0: the model with adapters (apps/models/lora.h), the optimizer over the trainable ones.
fsdp::DryRunSpec spec_for(const std::string& preset, int world_size, fsdp::ShardingStrategy strategy,
                          const apps::models::LoraConfig& lora = {}) {
  fsdp::DryRunSpec spec;
  spec.world_size = world_size;
  fsdp::FullyShardOptions o;
  o.strategy = strategy;
  spec.make_optimizer = [](std::vector<at::Tensor> all) -> std::unique_ptr<torch::optim::Optimizer> {
    std::vector<at::Tensor> p;
    for (auto& t : all) {
      if (t.requires_grad()) p.push_back(t);
    }
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  };
  auto adapted = [lora](std::shared_ptr<torch::nn::Module> m, const apps::models::ModelConfig& cfg) {
    if (lora.enabled()) apps::models::add_lora(*m, lora, cfg, at::TensorOptions().device(at::kMeta), 0);
    return m;
  };
  if (preset.rfind("llama", 0) == 0) {
    const apps::models::LlamaConfig cfg = apps::models::llama_preset(preset);
    spec.build = [cfg, adapted] { return adapted(apps::models::Llama(cfg, at::kMeta).ptr(), cfg); };
    spec.shard = [o](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
      fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<apps::models::LlamaBlockImpl>(), o, o);
    };
    spec.loss = [v = cfg.vocab_size](const std::shared_ptr<torch::nn::Module>& m) {
      return meta_loss<apps::models::LlamaImpl>(m, v);
    };
  } else {
    apps::models::GPTConfig cfg = apps::models::gpt_preset(preset, apps::models::kGpt2VocabSize);
    cfg.attention = "math";
    spec.build = [cfg, adapted] { return adapted(apps::models::GPT(cfg, at::kMeta).ptr(), cfg); };
    spec.shard = [o](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
      fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<apps::models::BlockImpl>(), o, o);
    };
    spec.loss = [v = cfg.vocab_size](const std::shared_ptr<torch::nn::Module>& m) {
      return meta_loss<apps::models::GPTImpl>(m, v);
    };
  }
  return spec;
}

// The dry run holds the planner's model state by kind, to the byte.
void expect_state_equal(const fsdp::DryRunResult& dry, const fsdp::planner::ModelStateBytes& plan) {
  EXPECT_EQ(dry.bytes.param_bytes + dry.bytes.master_weight_bytes,
            plan.sharded_param_bytes + plan.resident_unsharded_param_bytes);
  EXPECT_EQ(dry.bytes.grad_bytes, plan.sharded_grad_bytes);
  EXPECT_EQ(dry.bytes.optim_state_bytes, plan.optim_state_bytes);
}

fsdp::planner::ModelSpec plan_model(const std::string& preset) {
  namespace pl = fsdp::planner;
  if (preset.rfind("llama", 0) == 0) return pl::llama_model(pl::llama_shape(preset), preset);
  return pl::gpt_model(pl::gpt_shape(preset, apps::models::kGpt2VocabSize), preset);
}

TEST(PlanVsDryRun, ModelStateBytesEqualTheEngineExactly) {
  namespace pl = fsdp::planner;
  for (const std::string preset : {"gpt2-xl", "llama2-7b", "llama2-13b", "llama2-70b"}) {
    const pl::ModelSpec model = plan_model(preset);
    for (const int n : {8, 64, 512, 1024}) {
      SCOPED_TRACE(preset + " at N = " + std::to_string(n));
      const fsdp::DryRunResult dry = fsdp::dry_run(spec_for(preset, n, fsdp::ShardingStrategy::kFullShard));
      pl::Parallelism par;
      par.world_size = n;
      const pl::ModelStateBytes plan = pl::model_state_bytes(model, par, pl::StepSetup{});
      EXPECT_EQ(dry.param_numel, model.num_params());
      expect_state_equal(dry, plan);
      EXPECT_GT(plan.sharded_param_bytes, 0);
    }
  }
}

// The other strategies' layouts at one world size (zero1 keeps full params between steps).
TEST(PlanVsDryRun, EveryStrategyAtEightRanks) {
  namespace pl = fsdp::planner;
  const pl::ModelSpec model = plan_model("llama2-7b");
  for (auto strategy : {fsdp::ShardingStrategy::kShardGradOp, fsdp::ShardingStrategy::kZero1,
                        fsdp::ShardingStrategy::kNoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    const fsdp::DryRunResult dry = fsdp::dry_run(spec_for("llama2-7b", 8, strategy));
    pl::Parallelism par;
    par.world_size = 8;
    par.strategy = strategy;
    const pl::ModelStateBytes plan = pl::model_state_bytes(model, par, pl::StepSetup{});
    expect_state_equal(dry, plan);
  }
}

// A LoRA fine-tune: the base frozen (no grads, no optimizer state), the adapters trained; the
// planner's with_lora spec holds the engine's bytes exactly, and far less than the full fine-tune.
TEST(PlanVsDryRun, LoraFineTunesEqualTheEngineExactly) {
  namespace pl = fsdp::planner;
  struct Case {
    std::string preset;
    int64_t rank;
    std::vector<std::string> targets;
  };
  for (const Case& c : {Case{"llama2-7b", 8, {}}, Case{"llama2-13b", 16, {"all-linear"}}, Case{"gpt2-xl", 4, {}},
                        Case{"gpt2-xl", 8, {"c_attn", "c_fc"}}}) {
    apps::models::LoraConfig lora;
    lora.rank = c.rank;
    lora.target_modules = c.targets;
    const pl::ModelSpec full = plan_model(c.preset);
    const pl::ModelSpec model = pl::with_lora(full, c.rank, c.targets);
    for (const int n : {8, 64}) {
      SCOPED_TRACE(c.preset + " LoRA rank " + std::to_string(c.rank) + " at N = " + std::to_string(n));
      const fsdp::DryRunResult dry = fsdp::dry_run(spec_for(c.preset, n, fsdp::ShardingStrategy::kFullShard, lora));
      pl::Parallelism par;
      par.world_size = n;
      const pl::ModelStateBytes plan = pl::model_state_bytes(model, par, pl::StepSetup{});
      const pl::ModelStateBytes plan_full = pl::model_state_bytes(full, par, pl::StepSetup{});
      EXPECT_EQ(dry.param_numel, model.num_params());
      expect_state_equal(dry, plan);
      EXPECT_GT(plan.optim_state_bytes, 0);
      EXPECT_LT(plan.optim_state_bytes * 50, plan_full.optim_state_bytes) << "adapters are a few % of the model";
    }
  }
}

}  // namespace
