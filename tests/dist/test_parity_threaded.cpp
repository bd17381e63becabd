// Tier `dist`: FULL_SHARD / SHARD_GRAD_OP parity at world sizes 5 to 8 on the threaded group
// (the MPI tier covers 1 to 4 with real processes).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "../common/threaded.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

// S2's awkward shapes (13 and 19 rows, a 5-element parameter) at world sizes where most shards
// are padded and some are empty, 5 AdamW steps.
TEST(ThreadedParity, AwkwardMlpWorldSizes5To8) {
  for (int n = 5; n <= 8; ++n) {
    for (auto strategy : implemented_strategies()) {
      SCOPED_TRACE("N=" + std::to_string(n) + " " + fsdp::to_string(strategy));
      run_threaded(n, [&](int, fsdp::comm::ProcessGroupPtr g) {
        ParityRun run;
        run.make_model = [] { return MLP(13, 19, 3, true, 5).ptr(); };
        run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr grp) {
          auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
          fsdp::fully_shard(mlp->fc1.ptr(), grp, options_for(strategy, grp->size()));
          fsdp::fully_shard(mlp->fc2.ptr(), grp, options_for(strategy, grp->size()));
          auto root = fsdp::fully_shard(mlp, grp, options_for(strategy, grp->size()));
          if (strategy == fsdp::ShardingStrategy::kHybridShard) {
            EXPECT_GT(root->num_replicas(), 1) << "hybrid_shard must replicate at N=" << grp->size();
          }
        };
        run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
          auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
          return fsdp::call(mlp, x);
        };
        run.loss = [](const at::Tensor& o, const at::Tensor& y) { return F::mse_loss(o, y); };
        run.batch = [](int step, int64_t rows) { return regression_batch(step, rows, 13, 3); };
        run.make_optimizer = adamw(1e-2, 0.1);
        run.rows_per_rank = 2;
        run.steps = 5;
        run_parity(run, g);
      });
    }
  }
}
