// Tier `mpi`: transformer parity, model-state bytes vs the formula, collective counts and bytes
// per step, and the set-up errors of fully_shard.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/step_comm.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using fsdp::comm::CollectiveKind;

namespace {

constexpr int64_t kVocab = 37, kDim = 16, kHeads = 2, kLayers = 2, kCtx = 8;

ParityRun transformer_run(fsdp::ShardingStrategy strategy) {
  ParityRun run;
  run.make_model = [] { return TinyTransformer(kVocab, kDim, kHeads, kLayers, kCtx).ptr(); };
  run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
    fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<TinyBlockImpl>(), options_for(strategy, g->size()));
  };
  run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& idx) {
    auto t = std::dynamic_pointer_cast<TinyTransformerImpl>(m);
    return fsdp::call(t, idx);
  };
  run.loss = [](const at::Tensor& logits, const at::Tensor& targets) {
    return F::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
  };
  run.batch = [](int step, int64_t rows) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
    at::Tensor tok = at::randint(0, kVocab, {rows, kCtx + 1}, gen);
    return std::make_pair(tok.narrow(1, 0, kCtx).contiguous(), tok.narrow(1, 1, kCtx).contiguous());
  };
  run.rows_per_rank = 2;
  run.steps = 10;
  run.make_optimizer = adamw(1e-3, 0.1);
  return run;
}


}  // namespace

// A 2-block transformer with the output head tied to the token embedding (both in the root unit):
// gradients every step and parameters after 10 AdamW steps equal the single-process reference.
TEST(Engine, TransformerParityTenAdamWSteps) {
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    run_parity(transformer_run(strategy), world());
  }
}

// FULL_SHARD model state per rank: 4 bytes x padded shard (params) + 4 x real shard (grads) +
// 8 x real shard (AdamW m, v) = 16P/N plus padding, measured by the counting allocator and by the
// library's own accounting.
TEST(Engine, ModelStateBytesFollowTheFormula) {
  auto g = world();
  const int64_t N = g->size(), r = g->rank();
  const std::vector<int64_t> widths{96, 96, 96, 96, 40};
  int64_t P = 0, padded = 0, real = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    for (auto shape : {std::vector<int64_t>{widths[i + 1], widths[i]}, std::vector<int64_t>{widths[i + 1]}}) {
      auto s = fsdp::shard::ParamShardSpec::make(shape, N);
      P += s.numel();
      padded += s.padded_shard_numel();
      real += s.real_numel(r);
    }
  }
  int64_t before = fsdp::accounting::current_bytes();
  torch::manual_seed(1);
  auto model = Chain(widths).ptr();
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  int64_t after_shard = fsdp::accounting::current_bytes() - before;
  EXPECT_EQ(after_shard, 4 * padded) << "after fully_shard only the padded shards stay";
  torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
  {
    auto [x, y] = regression_batch(0, 4, widths.front(), widths.back());
    F::mse_loss(fsdp::call(model, x), y).backward();
    opt.step();
  }
  int64_t state = fsdp::accounting::current_bytes() - before;
  EXPECT_EQ(state, 4 * padded + 4 * real + 8 * real) << "measured model state after one step";
  auto acc = fsdp::accounting::model_state_bytes(model, &opt);
  EXPECT_EQ(acc.sharded_param_bytes, 4 * padded);
  EXPECT_EQ(acc.sharded_grad_bytes, 4 * real);
  EXPECT_EQ(acc.optim_state_bytes, 8 * real);
  EXPECT_EQ(acc.unsharded_param_bytes, 0);
  EXPECT_EQ(acc.unsharded_grad_bytes, 0);
  // 16P/N within padding (at most one row per rank per parameter, 4 bytes/elem in 4 buffers)
  const double formula = 16.0 * P / N;
  EXPECT_LE(std::abs(state - formula), 16.0 * (padded * N - P) + 16.0 * N * 96)
      << "state " << state << " vs 16P/N " << formula;
  if (r == 0) {
    std::printf("[model state] P=%lld N=%lld: measured %lld bytes/rank, formula 16P/N = %.0f\n",
                (long long)P, (long long)N, (long long)state, formula);
  }
}

// Per step: 2 all-gathers (forward, backward) per non-root unit with params, 1 for the root (kept
// unsharded from forward to backward), 1 reduce-scatter per unit with trainable params; logical
// bytes = padded unit size x 4 per collective (FULL_SHARD: 3 x P x 4 bytes, 1.5x DDP's all-reduce).
TEST(Engine, CollectiveCountsAndBytesPerStep) {
  auto g = world();
  const int64_t N = g->size();
  torch::manual_seed(2);
  auto model = TinyTransformer(kVocab, kDim, kHeads, kLayers, kCtx).ptr();
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<TinyBlockImpl>());
  int64_t root_bytes = 0, blocks_bytes = 0;
  for (const auto& u : fsdp::units_of(model)) {
    int64_t b = 0;
    for (const auto& p : u->params()) b += p.spec.padded_numel() * 4;
    (u->is_root() || u.get() == fsdp::find_unit(model.get()).get() ? root_bytes : blocks_bytes) += b;
  }
  torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 3; ++step) {
    auto before = g->stats().snapshot();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(step);
    at::Tensor tok = at::randint(0, kVocab, {2, kCtx + 1}, gen);
    at::Tensor logits = fsdp::call(model, tok.narrow(1, 0, kCtx).contiguous());
    F::cross_entropy(logits.reshape({-1, kVocab}), tok.narrow(1, 1, kCtx).reshape({-1})).backward();
    opt.step();
    opt.zero_grad();
    auto d = delta(before, g->stats().snapshot());
    EXPECT_EQ(d.ag_calls, 2 * kLayers + 1) << "step " << step;
    EXPECT_EQ(d.rs_calls, kLayers + 1) << "step " << step;
    EXPECT_EQ(d.ag_bytes, 2 * blocks_bytes + root_bytes) << "step " << step;
    EXPECT_EQ(d.rs_bytes, blocks_bytes + root_bytes) << "step " << step;
    EXPECT_EQ(d.ar_calls, 0) << "step " << step;
  }
  (void)N;
}

// Different parameter shapes on one rank: fully_shard throws on every rank, naming the parameter
// and both shapes, instead of hanging in a later collective.
TEST(Engine, InconsistentShapesAcrossRanksAreReported) {
  auto g = world();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t out = g->rank() == 1 ? 7 : 6;
  auto lin = torch::nn::Linear(4, out).ptr();
  try {
    fsdp::fully_shard(lin, g);
    ADD_FAILURE() << "no error for shapes that differ across ranks";
  } catch (const fsdp::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[6, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[7, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank"), std::string::npos) << msg;
  }
  g->barrier()->wait();
}

// A parameter shared by modules in two different units is rejected with a clear message; tied
// parameters inside one unit are managed once (see the transformer test).
TEST(Engine, ParameterSharedAcrossUnitsIsRejected) {
  auto g = world();
  struct HolderImpl : torch::nn::Module {
    explicit HolderImpl(at::Tensor w) { register_parameter("w", w); }
  };
  at::Tensor w = torch::randn({4, 4});
  auto a = std::make_shared<HolderImpl>(w);
  auto b = std::make_shared<HolderImpl>(w);
  fsdp::fully_shard(a, g);
  try {
    fsdp::fully_shard(b, g);
    ADD_FAILURE() << "shared parameter across units accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already managed by unit"), std::string::npos) << e.what();
  }
}

// Every strategy name parses back; unknown names are rejected, never silently downgraded (invalid
// strategy combinations: tests/mpi/test_strategies.cpp).
TEST(Engine, StrategyNamesParse) {
  for (auto s : implemented_strategies()) {
    EXPECT_EQ(fsdp::parse_sharding_strategy(fsdp::to_string(s)), s);
  }
  EXPECT_THROW(fsdp::parse_sharding_strategy("zero4"), fsdp::Error);
}
