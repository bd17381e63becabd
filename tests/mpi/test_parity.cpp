// Tier `mpi`: the engine's "done" bar: an MLP with awkward shapes (dims not divisible by N, a
// 5-element parameter, empty shards at N=4) trained 10 AdamW steps on N processes equals the
// single-process reference: gradients every step and parameters at the end within rtol 1e-5 /
// atol 1e-6 (the transformer counterpart is Engine.TransformerParityTenAdamWSteps).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

TEST(Parity, AwkwardMlpTenAdamWSteps) {
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    ParityRun run;
    run.make_model = [] { return MLP(13, 19, 3, true, 5).ptr(); };
    run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
      auto root = fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(),
                                         options_for(strategy, g->size()));
      if (strategy == fsdp::ShardingStrategy::kHybridShard && g->size() > 1) {
        EXPECT_GT(root->num_replicas(), 1) << "hybrid_shard must replicate at N=" << g->size();
      }
    };
    run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
      auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
      return fsdp::call(mlp, x);
    };
    run.loss = [](const at::Tensor& o, const at::Tensor& y) { return F::mse_loss(o, y); };
    run.batch = [](int step, int64_t rows) { return regression_batch(step, rows, 13, 3); };
    run.make_optimizer = adamw(1e-3, 0.1);
    run.rows_per_rank = 3;
    run.steps = 10;
    run_parity(run, world());
  }
}
