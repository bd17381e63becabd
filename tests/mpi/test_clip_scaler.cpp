// Tier `mpi`: non-finite gradients through clip_grad_norm and GradScaler, and GradScaler's call
// order, on every strategy.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <iomanip>
#include <limits>

#include "../common/models.h"
#include "../common/scenario_util.h"
#include "fsdp/common/check.h"
#include "fsdp/optim/clip.h"
#include "fsdp/precision/grad_scaler.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

// A chain sharded with `strategy`, one backward done on every rank; rank `bad` then has value v in
// the first element of its first non-empty sharded gradient (no rank when bad < 0).
std::shared_ptr<ChainImpl> chain_with_grads(fsdp::ShardingStrategy strategy, int bad, double v) {
  auto g = world();
  torch::manual_seed(8);
  auto model = Chain(std::vector<int64_t>{6, 10, 3}).ptr();
  for (auto& l : model->layers) fsdp::fully_shard(l.ptr(), g, options_for(strategy, g->size()));
  fsdp::fully_shard(model, g, options_for(strategy, g->size()));
  auto [x, y] = regression_batch(0, 4, 6, 3);
  F::mse_loss(fsdp::call(model, x), y).backward();
  fsdp::wait_for_pending(model);
  if (g->rank() == bad) {
    for (auto& p : fsdp::parameters(model)) {
      if (p.grad().defined() && p.grad().numel() > 0) {
        p.grad().view(-1)[0] = v;
        break;
      }
    }
  }
  return model;
}

}  // namespace

// A NaN in one rank's shard gives a NaN norm on every rank, for norm type 2 and inf (PyTorch:
// clip_grad_norm_ of a NaN gradient is NaN); an inf gives inf. std::max(x, NaN) used to drop it.
TEST(ClipGradNorm, NonFiniteGradientOnOneRankGivesANonFiniteNormEverywhere) {
  auto g = world();
  const int bad = g->size() - 1;
  {
    // The single-process rule this follows.
    at::Tensor p = at::ones({3}).requires_grad_(true);
    p.mutable_grad() = at::tensor({1.0f, NAN, 2.0f});
    EXPECT_TRUE(std::isnan(torch::nn::utils::clip_grad_norm_({p}, 1.0, INFINITY)));
  }
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
      auto model = chain_with_grads(strategy, bad, NAN);
      const double n = fsdp::clip_grad_norm(model, 1.0, norm_type);
      EXPECT_TRUE(std::isnan(n)) << "norm type " << norm_type << " gave " << n << " on rank "
                                 << g->rank() << " (NaN on rank " << bad << ")";
      auto model2 = chain_with_grads(strategy, bad, INFINITY);
      const double m = fsdp::clip_grad_norm(model2, 1.0, norm_type);
      EXPECT_TRUE(std::isinf(m) && m > 0) << "norm type " << norm_type << " gave " << m;
      auto model3 = chain_with_grads(strategy, -1, 0.0);
      EXPECT_TRUE(std::isfinite(fsdp::clip_grad_norm(model3, 1.0, norm_type)));
    }
  }
}

// The 2-norm of a sharded gradient equals a single process's float64 norm of the full gradient
// under every strategy ([Note: gradient norm accuracy]): a 2M-element weight, where fp32 norms of
// the shards (the old reduction) summed to 1e-5..1e-4 away from the whole's. Every rank trains on
// the same batch, so the averaged gradient equals the single process's to an ulp.
TEST(ClipGradNorm, NormOfShardedGradientsEqualsTheSingleProcessNorm) {
  auto g = world();
  const std::vector<int64_t> widths{1024, 2048, 3};
  auto [x, y] = regression_batch(0, 4, 1024, 3);
  torch::manual_seed(9);
  auto ref = Chain(widths).ptr();
  F::mse_loss(ref->forward(x), y).backward();
  double squares = 0.0;
  for (const auto& p : ref->parameters()) squares += p.grad().to(at::kDouble).square().sum().item<double>();
  const double want = std::sqrt(squares);
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    torch::manual_seed(9);
    auto model = Chain(widths).ptr();
    for (auto& l : model->layers) fsdp::fully_shard(l.ptr(), g, options_for(strategy, g->size()));
    fsdp::fully_shard(model, g, options_for(strategy, g->size()));
    F::mse_loss(fsdp::call(model, x), y).backward();
    const double got = fsdp::clip_grad_norm(model, 0.0);
    EXPECT_LT(std::abs(got - want) / want, 1e-9)
        << "rank " << g->rank() << ": norm " << std::setprecision(17) << got << ", single process " << want;
  }
}

// step() twice without update() is an error, not a second optimizer step; update() needs a
// step() or unscale() first; a NaN (not only an inf) on one rank skips the step everywhere.
TEST(GradScaler, CallOrderIsEnforcedAndNaNSkipsTheStep) {
  auto g = world();
  auto model = chain_with_grads(fsdp::ShardingStrategy::kFullShard, g->size() - 1, NAN);
  torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.1));
  fsdp::GradScaler scaler(fsdp::GradScalerOptions{8.0, 2.0, 0.5, 100});
  EXPECT_THROW(scaler.update(), fsdp::Error) << "update() before step()";
  std::vector<at::Tensor> before;
  for (auto& p : fsdp::parameters(model)) before.push_back(p.detach().clone());
  EXPECT_FALSE(scaler.step(opt, model)) << "the NaN on the last rank must skip the step";
  try {
    scaler.step(opt, model);
    ADD_FAILURE() << "a second step() before update() was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
  auto params = fsdp::parameters(model);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], before[i]));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  // A clean step after update() steps.
  opt.zero_grad();
  auto [x, y] = regression_batch(1, 4, 6, 3);
  scaler.scale(F::mse_loss(fsdp::call(model, x), y)).backward();
  EXPECT_TRUE(scaler.step(opt, model));
  scaler.update();
}
