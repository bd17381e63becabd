// Tier `mpi`: the strategy family (no_shard, zero1, shard_grad_op, full_shard, hybrid_shard):
// measured model-state bytes per rank against docs/architecture.md's table, collective counts and
// logical bytes per step against theory, overlap of DDP buckets with backward, checkpoint round
// trips, and the set-up errors of invalid combinations.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include <chrono>
#include <filesystem>

#include "../common/models.h"
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

struct StepComm {
  int64_t ag_calls, ag_bytes, rs_calls, rs_bytes, ar_calls, ar_bytes;
};

StepComm delta(const fsdp::comm::CommStats::Snapshot& a, const fsdp::comm::CommStats::Snapshot& b) {
  auto k = [](CollectiveKind c) { return static_cast<int>(c); };
  auto d = [&](CollectiveKind c, bool bytes) {
    return bytes ? b[k(c)].bytes - a[k(c)].bytes : b[k(c)].calls - a[k(c)].calls;
  };
  return {d(CollectiveKind::kAllGather, false), d(CollectiveKind::kAllGather, true),
          d(CollectiveKind::kReduceScatter, false), d(CollectiveKind::kReduceScatter, true),
          d(CollectiveKind::kAllReduce, false), d(CollectiveKind::kAllReduce, true)};
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
// layer's has been issued; the comm thread's events show when they started.
TEST(Strategies, NoShardBucketsOverlapBackward) {
  auto g = world();
  constexpr int64_t kLayers = 6, kDim = 256;
  torch::manual_seed(3);
  auto model = Chain(std::vector<int64_t>(kLayers + 1, kDim)).ptr();
  fsdp::FullyShardOptions o = options_for(ShardingStrategy::kNoShard);
  o.bucket_cap_bytes = (kDim * kDim + kDim) * 4;  // one layer per bucket
  fsdp::fully_shard(model, g, o);                 // one unit: DDP over the whole model
  torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.01));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = regression_batch(step, 64, kDim, kDim);
    x.set_requires_grad(true);
    int64_t issued_before_end = -1;
    double t_end = 0;
    auto before = g->stats().snapshot();
    const int ar = static_cast<int>(CollectiveKind::kAllReduce);
    x.register_hook([&](const at::Tensor&) {
      t_end = fsdp::comm::now_s();
      issued_before_end = g->stats().snapshot()[ar].calls - before[ar].calls;
    });
    g->stats().set_record_events(true);
    g->stats().take_events();
    F::mse_loss(fsdp::call(model, x), y).backward();
    auto events = g->stats().take_events();
    g->stats().set_record_events(false);
    int64_t started_before_end = 0, total = 0;
    for (const auto& e : events) {
      if (e.kind != CollectiveKind::kAllReduce) continue;
      ++total;
      if (e.start_s < t_end) ++started_before_end;
    }
    EXPECT_EQ(total, kLayers);
    EXPECT_GE(issued_before_end, kLayers - 1) << "buckets were not issued during backward";
    if (g->rank() == 0) {
      std::printf("[ddp overlap] step %d: %lld of %lld bucket all-reduces issued and %lld started "
                  "before backward reached the input\n",
                  step, (long long)issued_before_end, (long long)total, (long long)started_before_end);
    }
    opt.step();
    opt.zero_grad();
  }
}

// no_shard and hybrid_shard: a checkpoint saved under the strategy loads into a fresh model of the
// same strategy (and into a full_shard one) with identical full state dicts and optimizer steps.
TEST(Strategies, CheckpointRoundTrip) {
  auto g = world();
  const int N = g->size();
  for (auto s : {ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard, ShardingStrategy::kZero1}) {
    SCOPED_TRACE(fsdp::to_string(s));
    at::Tensor token = at::tensor(
        {static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007)},
        at::kLong);
    g->broadcast(token, 0)->wait();
    const std::string dir =
        (fs::temp_directory_path() / ("fsdp-strategy-ckpt-" + std::to_string(token.item<int64_t>()))).string();
    auto model = sharded_chain(s, g);
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) train_step(model, opt, step);
    fsdp::checkpoint::TrainState st;
    st.ints["step"] = 2;
    fsdp::checkpoint::save_sharded(dir, model, &opt, st, g);
    auto full = fsdp::full_state_dict(model);
    for (auto target : {ShardingStrategy::kFullShard, s}) {
      SCOPED_TRACE("loaded as " + fsdp::to_string(target));
      torch::manual_seed(77);
      auto other = Chain(kWidths).ptr();
      fsdp::fully_shard_tree(other, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), options_for(target, N));
      torch::optim::AdamW opt2(fsdp::parameters(other), torch::optim::AdamWOptions(0.5));
      fsdp::checkpoint::TrainState back;
      fsdp::checkpoint::load_sharded(dir, other, &opt2, &back, g);
      EXPECT_EQ(back.ints["step"], 2);
      auto loaded = fsdp::full_state_dict(other);
      ASSERT_EQ(loaded.size(), full.size());
      for (size_t i = 0; i < full.size(); ++i) {
        EXPECT_EQ(loaded[i].first, full[i].first);
        EXPECT_TRUE(at::equal(loaded[i].second, full[i].second)) << full[i].first;
      }
      if (target == s) {
        // one more step on both: same optimizer state, so same parameters
        train_step(model, opt, 5);
        train_step(other, opt2, 5);
        auto a = fsdp::full_state_dict(model), b = fsdp::full_state_dict(other);
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::allclose(a[i].second, b[i].second, 1e-6, 1e-7)) << "after a step: " << a[i].first;
        }
      }
    }
    g->barrier()->wait();
    std::error_code ec;
    if (g->rank() == 0) fs::remove_all(dir, ec);
  }
}

// no_shard with a bf16 param_dtype (the "unshard" is a local cast copy) and a no_shard unit inside
// a full_shard tree train like the reference.
TEST(Strategies, MixedTreesAndCastCopies) {
  auto g = world();
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "no_shard fc1 in a full_shard tree" : "zero1 fc2 in a hybrid tree");
    ParityRun run;
    run.make_model = [] { return MLP(6, 10, 3).ptr(); };
    run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr grp) {
      auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
      const int n = grp->size();
      if (variant == 0) {
        fsdp::fully_shard(mlp->fc1.ptr(), grp, options_for(ShardingStrategy::kNoShard, n));
        fsdp::fully_shard(mlp->fc2.ptr(), grp, options_for(ShardingStrategy::kFullShard, n));
        fsdp::fully_shard(mlp, grp, options_for(ShardingStrategy::kFullShard, n));
      } else {
        fsdp::fully_shard(mlp->fc1.ptr(), grp, options_for(ShardingStrategy::kHybridShard, n));
        fsdp::fully_shard(mlp->fc2.ptr(), grp, options_for(ShardingStrategy::kZero1, n));
        fsdp::fully_shard(mlp, grp, options_for(ShardingStrategy::kNoShard, n));
      }
    };
    run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
      auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
      return fsdp::call(mlp, x);
    };
    run.loss = [](const at::Tensor& out, const at::Tensor& y) { return F::mse_loss(out, y); };
    run.batch = [](int step, int64_t rows) { return regression_batch(step, rows, 6, 3); };
    run.make_optimizer = adamw(1e-2, 0.1);
    run.clip_max_norm = 0.5;
    run_parity(run, g);
  }
  // bf16 compute, fp32 master: losses close to the fp32 reference
  torch::manual_seed(4);
  auto model = MLP(6, 10, 3).ptr();
  fsdp::FullyShardOptions o = options_for(ShardingStrategy::kNoShard);
  o.mixed_precision.param_dtype = at::kBFloat16;
  o.mixed_precision.output_dtype = at::kFloat;
  fsdp::fully_shard(model->fc1.ptr(), g, o);
  fsdp::fully_shard(model->fc2.ptr(), g, o);
  fsdp::fully_shard(model, g, o);
  torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.1));
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = regression_batch(0, 8, 6, 3);
    at::Tensor loss = F::mse_loss(fsdp::call(model, x), y);
    loss.backward();
    for (auto& u : fsdp::units_of(model)) EXPECT_EQ(u->unsharded_param_bytes(), 0) << u->name();
    opt.step();
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first) << "bf16 no_shard does not train";
  for (const auto& p : fsdp::parameters(model)) EXPECT_EQ(p.scalar_type(), at::kFloat);
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
