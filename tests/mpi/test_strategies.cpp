// Tier `mpi`: the strategy family (no_shard, zero1, shard_grad_op, full_shard, hybrid_shard):
// measured model-state bytes per rank against docs/architecture.md's table, collective counts and
// logical bytes per step against theory, overlap of DDP buckets with backward, the issue order of
// hybrid_shard's replica all-reduce, checkpoint round trips, and the set-up errors of invalid
// combinations.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <torch/nn/functional/loss.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "../common/models.h"
#include "../common/step_comm.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/comm/block_quant.h"
#include "fsdp/runtime/strategy_traits.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/traffic.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;
namespace fp = fsdp::planner;
using fsdp::ShardingStrategy;
using fsdp::comm::CollectiveKind;

namespace {

const std::vector<int64_t> kWidths{96, 96, 96, 96, 40};

// The planner's spec of Chain(kWidths) wrapped with wrap_by_type<LinearImpl>: a root without
// parameters and one unit per Linear (weight (out, in), bias (out)). Memory and traffic formulas
// come from the planner (include/fsdp/planner/), the one source of them.
fp::ModelSpec chain_spec() {
  fp::ModelSpec m;
  m.name = "chain";
  fp::UnitSpec root;
  root.is_root = true;
  m.units.push_back(root);
  for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
    fp::UnitSpec u;
    u.name = "l" + std::to_string(i);  // ChainImpl registers l0, l1, ...
    u.params = {{u.name + ".weight", {kWidths[i + 1], kWidths[i]}, true}, {u.name + ".bias", {kWidths[i + 1]}, true}};
    m.units.push_back(u);
  }
  return m;
}

fp::Parallelism parallelism_of(ShardingStrategy s, int N) {
  fp::Parallelism p;
  p.strategy = s;
  p.world_size = N;
  if (s == ShardingStrategy::kHybridShard) p.hybrid_shard_group_size = hybrid_size_for(N);
  return p;
}

// fp32 params, AdamW, plain optimizer steps (no grad-norm or finite-check all-reduce), no_shard
// buckets of `cap`.
fp::StepSetup chain_step(int64_t cap = fsdp::kDefaultBucketCapBytes) {
  fp::StepSetup st;
  st.clip_grad_norm = false;
  st.nonfinite_check = false;
  st.bucket_cap_bytes = cap;
  return st;
}

// Elements of the unit's all-gather outputs (padded to the shard group), summed over units.
int64_t padded_full_numel(const fp::ModelSpec& m, int64_t G) {
  int64_t n = 0;
  for (const auto& u : m.units) n += fp::unit_numbers(u, G, 0).gathered_numel;
  return n;
}

std::shared_ptr<ChainImpl> sharded_chain(ShardingStrategy s, const fsdp::comm::ProcessGroupPtr& g,
                                         int64_t bucket_cap = 0,
                                         fsdp::WireCodec codec = fsdp::WireCodec::kNone, int node = 0,
                                         int host = 0, fsdp::WireCodec rs_codec = fsdp::WireCodec::kNone) {
  torch::manual_seed(1);
  auto model = Chain(kWidths).ptr();
  auto o = options_for(s, g->size());
  o.all_gather_codec = codec;
  o.reshard_after_forward_group_size = node;
  o.collective_host_size = host;
  o.reduce_scatter_codec = rs_codec;
  if (bucket_cap > 0 && s == ShardingStrategy::kNoShard) o.bucket_cap_bytes = bucket_cap;  // no_shard's only
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), o);
  return model;
}

int shard_size_of(ShardingStrategy s, int N) {
  return static_cast<int>(parallelism_of(s, N).shard_group_size());
}


void train_step(const std::shared_ptr<ChainImpl>& model, torch::optim::Optimizer& opt, int step) {
  auto [x, y] = regression_batch(step, 4, kWidths.front(), kWidths.back());
  F::mse_loss(fsdp::call(model, x), y).backward();
  opt.step();
  opt.zero_grad();
}

}  // namespace

// Model state per rank after one AdamW step, measured by the counting allocator, against the
// planner's exact bytes (fp::model_state_bytes: P params, N ranks, G hybrid shard group size;
// padded = this rank's padded shard):
//   no_shard       4P + 4P + 8P = 16P (params alias the storage: no copy)
//   zero1          4P_pad (full params) + 4 padded/N (fp32 master rows) + 4P/N (grads) + 8P/N
//   shard_grad_op  4 padded/N + 12P/N       full_shard  same     hybrid_shard  same at G
// and within padding rows of the planner's closed form (DESIGN.md's formula as implemented).
TEST(Strategies, ModelStateBytesFollowTheFormula) {
  auto g = world();
  const int N = g->size();
  const fp::ModelSpec spec = chain_spec();
  const fp::StepSetup st = chain_step();
  const double P = static_cast<double>(spec.num_params());
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    const fp::Parallelism par = parallelism_of(s, N);
    const int G = shard_size_of(s, N);
    const fp::ModelStateBytes want = fp::model_state_bytes(spec, par, st, g->rank());
    int64_t before = fsdp::accounting::current_bytes();
    {
      auto model = sharded_chain(s, g);
      EXPECT_EQ(fsdp::accounting::current_bytes() - before, want.sharded_param_bytes)
          << "after fully_shard only this rank's rows stay";
      torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
      {
        auto [x, y] = regression_batch(0, 4, kWidths.front(), kWidths.back());
        F::mse_loss(fsdp::call(model, x), y).backward();
      }
      opt.step();
      const int64_t state = fsdp::accounting::current_bytes() - before;
      EXPECT_EQ(state, want.total_bytes()) << "measured model state";
      // The library's own account tells the same footprint (zero1's resident full params too).
      const auto acc = fsdp::accounting::model_state_bytes(model, &opt);
      EXPECT_EQ(acc.resident_bytes(), state) << "model_state_bytes: params " << acc.sharded_param_bytes
          << ", grads " << acc.sharded_grad_bytes << ", optim " << acc.optim_state_bytes
          << ", unsharded params " << acc.unsharded_param_bytes;
      EXPECT_EQ(acc.sharded_param_bytes, want.sharded_param_bytes);
      EXPECT_EQ(acc.sharded_grad_bytes, want.sharded_grad_bytes);
      EXPECT_EQ(acc.optim_state_bytes, want.optim_state_bytes);
      EXPECT_EQ(acc.unsharded_param_bytes, want.resident_unsharded_param_bytes);
      // DESIGN.md's table (ZeRO section 5's formulas in fp32: 16P, 4P + 4P + 8P/N, 4P + 12P/N,
      // 16P/N, 16P/G) and the closed form as implemented: shard_grad_op frees its full params at the
      // end of backward (it holds 4P only from forward to backward; between steps 4P/N sharded
      // rows), zero1 frees its full gradients once reduced (4P only during backward) and keeps fp32
      // master rows (4P/N). Rows of padding: 16 bytes each.
      const double formula = fp::zero_paper_model_state_bytes(
          par, P, fp::zero_paper_bytes_per_param(st.precision, st.optimizer));
      const double documented = fp::closed_form_model_state_bytes(par, P, st);
      const double padding = static_cast<double>(padded_full_numel(spec, G)) - P;
      EXPECT_LE(std::abs(state - documented), 16.0 * padding + 16.0 * G * 96)
          << "state " << state << " vs documented formula " << documented;
      if (g->rank() == 0) {
        std::printf("[strategy bytes] %-13s N=%d G=%d P=%lld: measured %lld B/rank, DESIGN formula %.0f, "
                    "as implemented %.0f\n",
                    fsdp::to_string(s).c_str(), N, G, (long long)spec.num_params(), (long long)state, formula,
                    documented);
      }
    }
    EXPECT_EQ(fsdp::accounting::current_bytes(), before) << "everything freed with the model";
  }
}

// Per step (steady state), logical bytes in fp32 (4 bytes/elem), U = 4 units with params, Ppad(k)
// = params padded to a multiple of k rows, as fp::step_traffic computes them:
//   full_shard     AG 2U calls 2 x 4Ppad(N)  RS U calls 4Ppad(N)               = 3P
//   shard_grad_op  AG U  calls 4Ppad(N)      RS U calls 4Ppad(N)               = 2P
//   zero1          same as shard_grad_op (AG lazily at the next forward)       = 2P
//   no_shard       AR one per bucket, 4P bytes in all                          = P (all-reduce)
//   hybrid_shard   AG 2U x 4Ppad(G), RS U x 4Ppad(G), AR U x 4Ppad(G)/G (none when G = N)
// (the root, Chain itself, has no parameters: no collective of its own). With the int8
// all-gather codec every all-gather carries G x int8_payload_bytes(S) instead of G x 4S; with
// full_shard resharded to 2 ranks after forward (N = 4) the backward's carry 2 x 4 S_2. With
// host-aware collectives (hosts of 2, N = 4) each all-gather and reduce-scatter is two calls (across
// hosts: 2 blocks; inside: the whole); an int8 reduce-scatter is an all-to-all of n payloads of the
// unit's reduce shard (n = G, or the 2 hosts after the host stage).
TEST(Strategies, CollectiveCountsAndBytesPerStep) {
  auto g = world();
  const int N = g->size();
  const int64_t cap = (96 * 96 + 96) * 4;  // one Linear(96,96) per bucket, no more
  const fp::ModelSpec spec = chain_spec();
  struct Config {
    ShardingStrategy s;
    fsdp::WireCodec codec;
    int node;
    int host = 0;
    fsdp::WireCodec rs_codec = fsdp::WireCodec::kNone;
  };
  std::vector<Config> configs;
  for (auto codec : {fsdp::WireCodec::kNone, fsdp::WireCodec::kInt8}) {
    for (auto s : implemented_strategies()) {
      if (codec == fsdp::WireCodec::kNone || fsdp::traits_of(s).gathers_params) configs.push_back({s, codec, 0});
    }
  }
  if (N >= 2) configs.push_back({ShardingStrategy::kFullShard, fsdp::WireCodec::kNone, 0, 0, fsdp::WireCodec::kInt8});
  if (N == 4) {
    configs.push_back({ShardingStrategy::kFullShard, fsdp::WireCodec::kNone, 2});
    configs.push_back({ShardingStrategy::kFullShard, fsdp::WireCodec::kInt8, 2, 2});
    configs.push_back({ShardingStrategy::kShardGradOp, fsdp::WireCodec::kNone, 0, 2, fsdp::WireCodec::kInt8});
  }
  for (const auto& [s, codec, node, host, rs_codec] : configs) {
    SCOPED_TRACE(fsdp::to_string(s) + " all_gather_codec " + fsdp::to_string(codec) + " node " + std::to_string(node) +
                 " host " + std::to_string(host) + " reduce_scatter_codec " + fsdp::to_string(rs_codec));
    const int G = shard_size_of(s, N);
    fp::StepSetup setup = chain_step(cap);
    setup.all_gather_codec = codec;
    setup.reduce_scatter_codec = rs_codec;
    fp::Parallelism par = parallelism_of(s, N);
    par.reshard_after_forward_group_size = node;
    par.collective_host_size = host;
    const fp::StepTraffic plan = fp::step_traffic(spec, par, setup);
    const StepComm want{plan.all_gather.calls,     plan.all_gather.logical_bytes,
                        plan.reduce_scatter.calls, plan.reduce_scatter.logical_bytes,
                        plan.all_reduce.calls,     plan.all_reduce.logical_bytes};
    if (codec == fsdp::WireCodec::kInt8) {
      // The planner's bytes by hand: per gather G payloads of each unit's shard (96 x 96 + 96 rows
      // and 40 x 96 + 40, padded to G rows).
      int64_t per_pass = 0;
      for (const auto& u : spec.units) {
        std::vector<int64_t> segments;  // weight, bias: blocks restart at each
        for (const auto& p : u.params) segments.push_back(fsdp::shard::ParamShardSpec::make(p.shape, G).padded_shard_numel());
        if (!segments.empty()) per_pass += G * fsdp::comm::int8_payload_bytes(segments);
      }
      const int64_t passes = fsdp::traits_of(s).reshard_after_forward ? 2 : 1;
      if (node == 0 && host == 0) EXPECT_EQ(want.ag_bytes, passes * per_pass);
    }
    if (rs_codec == fsdp::WireCodec::kInt8) {
      // By hand: per unit n payloads of its reduce shard (weight and bias trainable).
      const int64_t n = host ? G / host : G;
      int64_t bytes = 0;
      for (const auto& u : spec.units) {
        std::vector<int64_t> segments;
        for (const auto& p : u.params) segments.push_back(fsdp::shard::ParamShardSpec::make(p.shape, G).padded_shard_numel());
        if (!segments.empty()) bytes += n * fsdp::comm::int8_payload_bytes(segments);
      }
      EXPECT_EQ(plan.all_to_all.logical_bytes, bytes);
    }
    auto model = sharded_chain(s, g, cap, codec, node, host, rs_codec);
    const int a2a = static_cast<int>(fsdp::comm::CollectiveKind::kAllToAll);
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 3; ++step) {
      auto before = g->stats().snapshot();
      train_step(model, opt, step);
      auto d = delta(before, g->stats().snapshot());
      EXPECT_EQ(d.ag_calls, want.ag_calls) << "step " << step;
      EXPECT_EQ(d.ag_bytes, want.ag_bytes) << "step " << step;
      EXPECT_EQ(d.rs_calls, want.rs_calls) << "step " << step;
      EXPECT_EQ(d.rs_bytes, want.rs_bytes) << "step " << step;
      EXPECT_EQ(d.ar_calls, want.ar_calls) << "step " << step;
      EXPECT_EQ(d.ar_bytes, want.ar_bytes) << "step " << step;
      const auto after = g->stats().snapshot();
      EXPECT_EQ(after[a2a].calls - before[a2a].calls, plan.all_to_all.calls) << "step " << step;
      EXPECT_EQ(after[a2a].bytes - before[a2a].bytes, plan.all_to_all.logical_bytes) << "step " << step;
      if (g->rank() == 0 && step == 2) {
        std::printf("[strategy comm] %-13s N=%d G=%d P=%lld: AG %lld calls %lld B, RS %lld calls %lld B, "
                    "AR %lld calls %lld B; total %.2f x 4P\n",
                    fsdp::to_string(s).c_str(), N, G, (long long)spec.num_params(), (long long)d.ag_calls,
                    (long long)d.ag_bytes, (long long)d.rs_calls, (long long)d.rs_bytes,
                    (long long)d.ar_calls, (long long)d.ar_bytes,
                    double(d.ag_bytes + d.rs_bytes + d.ar_bytes) / (4.0 * spec.num_params()));
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

// hybrid_shard's replica all-reduce of a unit is issued with its reduce-scatter (before the next
// unit's reduce-scatter), not when the next unit's reduce-scatter waits for it, and starts only once
// the reduce-scatter is done (flight recorder times). The strategy's gradients: the parity suite.
TEST(Strategies, HybridReplicaAllReduceIsIssuedWithTheReduceScatter) {
  auto g = world();
  const int N = g->size();
  if (N < 2) GTEST_SKIP() << "needs replicas";
  constexpr int64_t kLayers = 5, kDim = 128;
  torch::manual_seed(4);
  auto model = Chain(std::vector<int64_t>(kLayers + 1, kDim)).ptr();
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(),
                         options_for(ShardingStrategy::kHybridShard, N));
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = regression_batch(step * N + g->rank(), 32, kDim, kDim);
    const double t0 = fsdp::comm::now_s();
    F::mse_loss(fsdp::call(model, x), y).backward();
    std::map<std::string, fsdp::comm::CollectiveRecord> rs, ar;
    std::vector<std::string> rs_order;  // units in the order their reduce-scatters were issued
    for (const auto& r : g->flight_recorder().records()) {
      if (r.issue_s < t0 || r.tag.phase != "backward") continue;
      if (r.kind == CollectiveKind::kReduceScatter) {
        rs[r.tag.unit] = r;
        rs_order.push_back(r.tag.unit);
      }
      if (r.kind == CollectiveKind::kAllReduce) ar[r.tag.unit] = r;
    }
    ASSERT_EQ(rs_order.size(), static_cast<size_t>(kLayers)) << "one reduce-scatter per Linear";
    ASSERT_EQ(ar.size(), rs.size()) << "one replica all-reduce per reduce-scatter";
    for (size_t i = 0; i < rs_order.size(); ++i) {
      const auto& a = ar.at(rs_order[i]);
      const auto& r = rs.at(rs_order[i]);
      EXPECT_GE(a.issue_s, r.issue_s) << rs_order[i];
      if (i + 1 < rs_order.size()) {
        EXPECT_LT(a.issue_s, rs.at(rs_order[i + 1]).issue_s)
            << rs_order[i] << ": its replica all-reduce was issued after the next unit's reduce-scatter";
      }
      EXPECT_GE(a.start_s, r.end_s) << rs_order[i] << ": the all-reduce started before its reduce-scatter ended";
      EXPECT_EQ(a.state, fsdp::comm::OpState::kCompleted) << rs_order[i];
    }
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
