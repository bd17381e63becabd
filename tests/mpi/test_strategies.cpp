// Tier `mpi`: the strategy family (no_shard, zero1, shard_grad_op, full_shard, hybrid_shard):
// measured model-state bytes per rank against docs/architecture.md's table, collective counts and
// logical bytes per step against theory, overlap of DDP buckets with backward, checkpoint round
// trips, and the set-up errors of invalid combinations.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <torch/nn/functional/loss.h>

#include <chrono>
#include <filesystem>

#include "../common/models.h"
#include "../common/step_comm.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;
using fsdp::ShardingStrategy;
using fsdp::comm::CollectiveKind;

namespace {

const std::vector<int64_t> kWidths{96, 96, 96, 96, 40};

// Sizes of the Chain(kWidths) parameters at a shard group of `world` ranks, this rank at `rank`.
struct Sizes {
  int64_t P = 0, padded_shard = 0, real = 0, padded_full = 0;
};
Sizes chain_sizes(int64_t world, int64_t rank) {
  Sizes z;
  for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
    for (auto shape : {std::vector<int64_t>{kWidths[i + 1], kWidths[i]}, std::vector<int64_t>{kWidths[i + 1]}}) {
      auto s = fsdp::shard::ParamShardSpec::make(shape, world);
      z.P += s.numel();
      z.padded_shard += s.padded_shard_numel();
      z.real += s.real_numel(rank);
      z.padded_full += s.padded_numel();
    }
  }
  return z;
}

std::shared_ptr<ChainImpl> sharded_chain(ShardingStrategy s, const fsdp::comm::ProcessGroupPtr& g,
                                         int64_t bucket_cap = 0) {
  torch::manual_seed(1);
  auto model = Chain(kWidths).ptr();
  auto o = options_for(s, g->size());
  if (bucket_cap > 0 && s == ShardingStrategy::kNoShard) o.bucket_cap_bytes = bucket_cap;  // no_shard's only
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), o);
  return model;
}

int shard_size_of(ShardingStrategy s, int N) {
  if (s == ShardingStrategy::kNoShard) return 1;
  if (s == ShardingStrategy::kHybridShard) return hybrid_size_for(N);
  return N;
}


void train_step(const std::shared_ptr<ChainImpl>& model, torch::optim::Optimizer& opt, int step) {
  auto [x, y] = regression_batch(step, 4, kWidths.front(), kWidths.back());
  F::mse_loss(fsdp::call(model, x), y).backward();
  opt.step();
  opt.zero_grad();
}

// Number of DDP buckets of a unit's trainable params (reverse order, greedy up to cap bytes).
int64_t bucket_count(const std::vector<int64_t>& numels_in_order, int64_t cap, int64_t elem) {
  int64_t buckets = 0, cur = 0;
  for (auto it = numels_in_order.rbegin(); it != numels_in_order.rend(); ++it) {
    if (buckets == 0 || (cur > 0 && (cur + *it) * elem > cap)) {
      ++buckets;
      cur = 0;
    }
    cur += *it;
  }
  return buckets;
}

}  // namespace

// Model state per rank after one AdamW step, measured by the counting allocator, against the
// formulas (P params, N ranks, G hybrid shard group size; padded = this rank's padded shard):
//   no_shard       4P + 4P + 8P = 16P (params alias the storage: no copy)
//   zero1          4P_pad (full params) + 4 padded/N (fp32 master rows) + 4P/N (grads) + 8P/N
//   shard_grad_op  4 padded/N + 12P/N       full_shard  same     hybrid_shard  same at G
TEST(Strategies, ModelStateBytesFollowTheFormula) {
  auto g = world();
  const int N = g->size();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    const int G = shard_size_of(s, N);
    const int64_t sr = g->rank() % G;
    Sizes z = chain_sizes(G, sr);
    int64_t before = fsdp::accounting::current_bytes();
    {
      auto model = sharded_chain(s, g);
      EXPECT_EQ(fsdp::accounting::current_bytes() - before, 4 * z.padded_shard)
          << "after fully_shard only this rank's rows stay";
      torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
      {
        auto [x, y] = regression_batch(0, 4, kWidths.front(), kWidths.back());
        F::mse_loss(fsdp::call(model, x), y).backward();
      }
      opt.step();
      const int64_t state = fsdp::accounting::current_bytes() - before;
      int64_t expected = 4 * z.padded_shard + 4 * z.real + 8 * z.real;
      if (s == ShardingStrategy::kZero1) expected += 4 * z.padded_full;  // persistent full params
      EXPECT_EQ(state, expected) << "measured model state";
      // The library's own account tells the same footprint (zero1's resident full params too).
      const auto acc = fsdp::accounting::model_state_bytes(model, &opt);
      EXPECT_EQ(acc.resident_bytes(), state) << "model_state_bytes: params " << acc.sharded_param_bytes
          << ", grads " << acc.sharded_grad_bytes << ", optim " << acc.optim_state_bytes
          << ", unsharded params " << acc.unsharded_param_bytes;
      double formula = 0;
      switch (s) {
        case ShardingStrategy::kNoShard: formula = 16.0 * z.P; break;
        case ShardingStrategy::kZero1: formula = 4.0 * z.P + 4.0 * z.P + 8.0 * z.P / N; break;
        case ShardingStrategy::kShardGradOp: formula = 4.0 * z.P + 12.0 * z.P / N; break;
        default: formula = 16.0 * z.P / G; break;
      }
      // Documented differences: shard_grad_op frees its full params at the end of backward (it
      // holds 4P only from forward to backward; between steps 4P/N sharded rows), zero1 frees its full gradients once reduced (4P
      // only during backward) and keeps fp32 master rows (4P/N). Rows of padding: 16 bytes each.
      double documented = formula;
      if (s == ShardingStrategy::kShardGradOp) documented += -4.0 * z.P + 4.0 * z.P / N;
      if (s == ShardingStrategy::kZero1) documented += -4.0 * z.P + 8.0 * z.P / N;
      EXPECT_LE(std::abs(state - documented), 16.0 * (z.padded_full - z.P) + 16.0 * G * 96)
          << "state " << state << " vs documented formula " << documented;
      if (g->rank() == 0) {
        std::printf("[strategy bytes] %-13s N=%d G=%d P=%lld: measured %lld B/rank, DESIGN formula %.0f, "
                    "as implemented %.0f\n",
                    fsdp::to_string(s).c_str(), N, G, (long long)z.P, (long long)state, formula, documented);
      }
    }
    EXPECT_EQ(fsdp::accounting::current_bytes(), before) << "everything freed with the model";
  }
}

// Per step (steady state), logical bytes in fp32 (4 bytes/elem), U = 4 units with params, Ppad(k)
// = params padded to a multiple of k rows:
//   full_shard     AG 2U calls 2 x 4Ppad(N)  RS U calls 4Ppad(N)               = 3P
//   shard_grad_op  AG U  calls 4Ppad(N)      RS U calls 4Ppad(N)               = 2P
//   zero1          same as shard_grad_op (AG lazily at the next forward)       = 2P
//   no_shard       AR one per bucket, 4P bytes in all                          = P (all-reduce)
//   hybrid_shard   AG 2U x 4Ppad(G), RS U x 4Ppad(G), AR U x 4Ppad(G)/G (none when G = N)
TEST(Strategies, CollectiveCountsAndBytesPerStep) {
  auto g = world();
  const int N = g->size();
  const int64_t cap = (96 * 96 + 96) * 4;  // one Linear(96,96) per bucket, no more
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    const int G = shard_size_of(s, N);
    Sizes z = chain_sizes(G, g->rank() % G);
    auto model = sharded_chain(s, g, cap);
    const int64_t U = static_cast<int64_t>(kWidths.size()) - 1;
    int64_t buckets = 0;
    for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
      buckets += bucket_count({kWidths[i] * kWidths[i + 1], kWidths[i + 1]}, cap, 4);
    }
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 3; ++step) {
      auto before = g->stats().snapshot();
      train_step(model, opt, step);
      auto d = delta(before, g->stats().snapshot());
      StepComm want{};
      switch (s) {
        case ShardingStrategy::kFullShard:
          want = {2 * U, 2 * 4 * z.padded_full, U, 4 * z.padded_full, 0, 0};
          break;
        case ShardingStrategy::kShardGradOp:
        case ShardingStrategy::kZero1:
          want = {U, 4 * z.padded_full, U, 4 * z.padded_full, 0, 0};
          break;
        case ShardingStrategy::kNoShard:
          want = {0, 0, 0, 0, buckets, 4 * z.P};
          break;
        case ShardingStrategy::kHybridShard:
          want = {2 * U, 2 * 4 * z.padded_full, U, 4 * z.padded_full, G < N ? U : 0,
                  G < N ? 4 * z.padded_shard : 0};
          break;
      }
      EXPECT_EQ(d.ag_calls, want.ag_calls) << "step " << step;
      EXPECT_EQ(d.ag_bytes, want.ag_bytes) << "step " << step;
      EXPECT_EQ(d.rs_calls, want.rs_calls) << "step " << step;
      EXPECT_EQ(d.rs_bytes, want.rs_bytes) << "step " << step;
      EXPECT_EQ(d.ar_calls, want.ar_calls) << "step " << step;
      EXPECT_EQ(d.ar_bytes, want.ar_bytes) << "step " << step;
      if (g->rank() == 0 && step == 2) {
        std::printf("[strategy comm] %-13s N=%d G=%d P=%lld: AG %lld calls %lld B, RS %lld calls %lld B, "
                    "AR %lld calls %lld B; total %.2f x 4P\n",
                    fsdp::to_string(s).c_str(), N, G, (long long)z.P, (long long)d.ag_calls,
                    (long long)d.ag_bytes, (long long)d.rs_calls, (long long)d.rs_bytes,
                    (long long)d.ar_calls, (long long)d.ar_bytes,
                    double(d.ag_bytes + d.rs_bytes + d.ar_bytes) / (4.0 * z.P));
      }
    }
  }
}

// no_shard buckets are issued from the AccumulateGrad hooks while backward still runs: by the time
// the gradient reaches the model's input (the last node of backward), every bucket but the first
// layer's has been issued; and a bucket's all-reduce completes while backward is still running: a
// gradient hook in the middle of backward (layer 1's weight, after layers 5..2) waits until the
// communication thread has finished an all-reduce, which only the buckets of layers 5..2 issued
// during backward can provide (buckets issued at the end of backward would leave it waiting).
TEST(Strategies, NoShardBucketsOverlapBackward) {
  auto g = world();
  constexpr int64_t kLayers = 6, kDim = 256;
  torch::manual_seed(3);
  auto model = Chain(std::vector<int64_t>(kLayers + 1, kDim)).ptr();
  fsdp::FullyShardOptions o = options_for(ShardingStrategy::kNoShard);
  o.bucket_cap_bytes = (kDim * kDim + kDim) * 4;  // one layer per bucket
  fsdp::fully_shard(model, g, o);                 // one unit: DDP over the whole model
  torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.01));
  const int ar = static_cast<int>(CollectiveKind::kAllReduce);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = regression_batch(step, 64, kDim, kDim);
    x.set_requires_grad(true);
    int64_t issued_before_end = -1;
    bool finished_mid_backward = false;
    double waited_s = 0;
    auto before = g->stats().snapshot();
    x.register_hook([&](const at::Tensor&) {
      issued_before_end = g->stats().snapshot()[ar].calls - before[ar].calls;
    });
    model->layers[1]->weight.register_hook([&](const at::Tensor&) {
      const double t0 = fsdp::comm::now_s();
      while (fsdp::comm::now_s() - t0 < 20.0) {
        if (g->stats().snapshot()[ar].busy_s > before[ar].busy_s) {
          finished_mid_backward = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      waited_s = fsdp::comm::now_s() - t0;
    });
    F::mse_loss(fsdp::call(model, x), y).backward();
    const int64_t total = g->stats().snapshot()[ar].calls - before[ar].calls;
    EXPECT_EQ(total, kLayers);
    EXPECT_GE(issued_before_end, kLayers - 1) << "buckets were not issued during backward";
    EXPECT_TRUE(finished_mid_backward) << "no bucket all-reduce completed while backward was running";
    if (g->rank() == 0) {
      std::printf("[ddp overlap] step %d: %lld of %lld bucket all-reduces issued before backward "
                  "reached the input; one had completed %.1f ms into layer 1's gradient hook\n",
                  step, (long long)issued_before_end, (long long)total, waited_s * 1e3);
    }
    opt.step();
    opt.zero_grad();
  }
}

// Invalid combinations are rejected with an fsdp::Error on every rank, never a hang.
TEST(Strategies, InvalidCombinationsAreRejected) {
  auto g = world();
  const int N = g->size();
  {
    auto lin = torch::nn::Linear(4, 4).ptr();
    auto o = options_for(ShardingStrategy::kHybridShard);
    o.hybrid_shard_group_size = N + 1;
    try {
      fsdp::fully_shard(lin, g, o);
      ADD_FAILURE() << "hybrid size not dividing the world accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("must divide"), std::string::npos) << e.what();
    }
  }
  for (auto s : {ShardingStrategy::kNoShard, ShardingStrategy::kZero1}) {
    auto lin = torch::nn::Linear(4, 4).ptr();
    auto o = options_for(s);
    o.reshard_after_forward = true;
    EXPECT_THROW(fsdp::fully_shard(lin, g, o), fsdp::Error) << fsdp::to_string(s);
  }
  {
    auto lin = torch::nn::Linear(4, 4).ptr();
    auto o = options_for(ShardingStrategy::kNoShard);
    o.bucket_cap_bytes = 0;
    EXPECT_THROW(fsdp::fully_shard(lin, g, o), fsdp::Error);
  }
  {
    // units of one tree over different groups (same ranks, another group object)
    auto other = g->split(0, g->rank());
    auto mlp = MLP(4, 4, 4).ptr();
    fsdp::fully_shard(mlp->fc1.ptr(), other);
    fsdp::fully_shard(mlp->fc2.ptr(), g);
    fsdp::fully_shard(mlp, g);
    try {
      fsdp::call(mlp, at::randn({2, 4}));
      ADD_FAILURE() << "units over different groups accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("another process group"), std::string::npos) << e.what();
    }
  }
  // Options of one strategy given to another would be ignored: rejected, naming the option.
  auto expect_rejected = [&](fsdp::FullyShardOptions o, const char* option) {
    auto lin = torch::nn::Linear(4, 4).ptr();
    try {
      fsdp::fully_shard(lin, g, o);
      ADD_FAILURE() << option << " accepted by strategy " << fsdp::to_string(o.strategy);
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[fsdp rank " + std::to_string(g->rank()) + "]"), std::string::npos)
          << e.what();
    }
  };
  for (auto s : implemented_strategies()) {
    if (s != ShardingStrategy::kNoShard) {
      auto o = options_for(s, N);
      o.bucket_cap_bytes = 1 << 20;
      expect_rejected(o, "bucket_cap_bytes");
    }
    if (s != ShardingStrategy::kHybridShard) {
      auto o = options_for(s, N);
      o.hybrid_shard_group_size = 1;
      expect_rejected(o, "hybrid_shard_group_size");
    }
    auto o = options_for(s, N);
    o.max_unsharded_units = 0;
    expect_rejected(o, "max_unsharded_units");
  }
  {
    // max_unsharded_units is a property of the tree, read from the root: another value on a
    // non-root unit is an error at the first forward, not silently ignored.
    auto mlp = MLP(4, 4, 4).ptr();
    auto child = options_for(ShardingStrategy::kFullShard);
    child.max_unsharded_units = 3;
    fsdp::fully_shard(mlp->fc1.ptr(), g, child);
    fsdp::fully_shard(mlp->fc2.ptr(), g);
    fsdp::fully_shard(mlp, g);
    try {
      fsdp::call(mlp, at::randn({2, 4}));
      ADD_FAILURE() << "a non-root max_unsharded_units that differs from the root's was accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_unsharded_units"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("sets max_unsharded_units 3"), std::string::npos) << e.what();
    }
    // The same value as the root's (or unset) is fine.
    auto ok = MLP(4, 4, 4).ptr();
    auto same = options_for(ShardingStrategy::kFullShard);
    same.max_unsharded_units = 2;
    fsdp::fully_shard(ok->fc1.ptr(), g, same);
    fsdp::fully_shard(ok->fc2.ptr(), g);
    fsdp::fully_shard(ok, g);
    EXPECT_NO_THROW(fsdp::call(ok, at::randn({2, 4})));
  }
  {
    // strategies that differ across ranks for the same unit: reported, no hang
    if (N >= 2) {
      auto lin = torch::nn::Linear(4, 4).ptr();
      auto o = options_for(g->rank() == 0 ? ShardingStrategy::kNoShard : ShardingStrategy::kFullShard);
      EXPECT_THROW(fsdp::fully_shard(lin, g, o), fsdp::Error);
    }
  }
  g->barrier()->wait();
}
