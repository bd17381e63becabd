// Tier `dist`: reshard after forward to a node-local group (reshard_after_forward_group_size,
// ZeRO++'s hpZ) on the threaded group of 4 ranks (one host). Only where the backward's all-gather
// runs changes, so training is bit for bit the run without it (full_shard, hybrid_shard, int8
// all-gathers, bf16); the backward's gathers run on the node-local group with its shard sizes;
// the kept shards cost exactly S_g x param bytes per unit, from forward to backward; a shard kept
// by an earlier forward is never used; and every misuse is refused.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/error_of.h"
#include "../common/models.h"
#include "../common/scenario_util.h"
#include "../common/threaded.h"
#include "fsdp/fsdp.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

constexpr int kNodeTestWorld = 4;
const std::vector<int64_t> kNodeTestWidths{30, 40, 5};  // l0: 40 x 30 + 40, l1: 5 x 40 + 5 (padded at 4 and 2 ranks)

Chain node_test_chain(const fsdp::comm::ProcessGroupPtr& g, const fsdp::FullyShardOptions& o) {
  Chain model = seeded_chain(kNodeTestWidths, 5);
  for (auto& l : model->layers) fsdp::fully_shard(l.ptr(), g, o);
  fsdp::fully_shard(model.ptr(), g, o);
  return model;
}

struct NodeTestRun {
  std::vector<double> losses;
  std::vector<at::Tensor> params;  // full, after the last step
};

// `steps` AdamW steps on this rank's rows of a fixed batch sequence.
NodeTestRun train_steps(Chain& model, int rank, int steps) {
  torch::optim::AdamW opt(fsdp::parameters(model.ptr()), torch::optim::AdamWOptions(1e-2));
  NodeTestRun t;
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = regression_batch(s, 2 * kNodeTestWorld, 30, 5);
    at::Tensor loss = F::mse_loss(fsdp::call(model, x.narrow(0, 2 * rank, 2)), y.narrow(0, 2 * rank, 2));
    loss.backward();
    opt.step();
    opt.zero_grad();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& kv : fsdp::full_state_dict(model.ptr())) t.params.push_back(kv.second);
  return t;
}

fsdp::FullyShardOptions node_options(fsdp::ShardingStrategy s, int hybrid, int node, fsdp::WireCodec codec,
                                std::optional<at::ScalarType> dtype) {
  fsdp::FullyShardOptions o;
  o.strategy = s;
  o.hybrid_shard_group_size = hybrid;
  o.reshard_after_forward_group_size = node;
  o.all_gather_codec = codec;
  o.mixed_precision.param_dtype = dtype;
  return o;
}

}  // namespace

TEST(NodeReshard, TrainsBitForBitAsWithoutItAndGathersBackwardOnTheNode) {
  struct Case {
    const char* what;
    fsdp::ShardingStrategy strategy;
    int hybrid, node;
    fsdp::WireCodec codec;
    std::optional<at::ScalarType> dtype;
    bool checkpointed = false;  // each layer's forward recomputed in backward
  };
  using S = fsdp::ShardingStrategy;
  const Case cases[] = {
      {"full_shard g=2", S::kFullShard, 0, 2, fsdp::WireCodec::kNone, std::nullopt},
      {"full_shard g=1", S::kFullShard, 0, 1, fsdp::WireCodec::kNone, std::nullopt},
      {"hybrid_shard G=2 g=1", S::kHybridShard, 2, 1, fsdp::WireCodec::kNone, std::nullopt},
      {"full_shard g=2 int8", S::kFullShard, 0, 2, fsdp::WireCodec::kInt8, std::nullopt},
      {"full_shard g=2 bf16", S::kFullShard, 0, 2, fsdp::WireCodec::kNone, at::kBFloat16},
      {"full_shard g=2 checkpointed", S::kFullShard, 0, 2, fsdp::WireCodec::kNone, std::nullopt, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    run_threaded(kNodeTestWorld, [&](int rank, fsdp::comm::ProcessGroupPtr g) {
      Chain plain = node_test_chain(g, node_options(c.strategy, c.hybrid, 0, c.codec, c.dtype));
      Chain node = node_test_chain(g, node_options(c.strategy, c.hybrid, c.node, c.codec, c.dtype));
      plain->checkpoint_layers = node->checkpoint_layers = c.checkpointed;
      const NodeTestRun want = train_steps(plain, rank, 3);
      const size_t first = g->flight_recorder().records().size();
      const NodeTestRun got = train_steps(node, rank, 3);
      EXPECT_EQ(got.losses, want.losses);
      for (size_t i = 0; i < want.params.size(); ++i) EXPECT_TRUE(at::equal(got.params[i], want.params[i])) << "param " << i;
      // The backward's all-gathers: on each unit's node-local group, a shard over g ranks each.
      const auto units = fsdp::units_of(node.ptr());
      std::map<std::string, std::pair<std::string, int64_t>> node_of;  // unit -> (group, S_g)
      fsdp::comm::ProcessGroupPtr shared;
      for (const auto& u : units) {
        if (u->is_root()) continue;
        ASSERT_NE(u->node_group(), nullptr) << u->name();
        if (!shared) shared = u->node_group();
        EXPECT_EQ(u->node_group(), shared) << "one node-local group per (shard group, size), split once";
        ASSERT_EQ(u->node_group()->size(), c.node);
        std::vector<std::vector<int64_t>> shapes;
        for (const auto& p : u->params()) shapes.push_back(p.shape);
        node_of[u->name()] = {u->node_group()->name(), fsdp::shard::FlatLayout::make(shapes, c.node).shard_numel()};
      }
      const auto records = g->flight_recorder().records();
      int backward_gathers = 0;
      for (size_t i = first; i < records.size(); ++i) {
        const auto& r = records[i];
        if (r.kind != fsdp::comm::CollectiveKind::kAllGather || r.tag.phase.rfind("backward", 0) != 0) continue;
        ++backward_gathers;
        ASSERT_TRUE(node_of.count(r.tag.unit)) << r.tag.unit;
        EXPECT_EQ(r.group, node_of[r.tag.unit].first) << r.tag.unit;
        EXPECT_EQ(r.numel, node_of[r.tag.unit].second) << r.tag.unit;
      }
      EXPECT_EQ(backward_gathers, 3 * 2) << "one per non-root unit per step";
    });
  }
}

TEST(NodeReshard, KeptShardsCostTheirBytesFromForwardToBackward) {
  run_threaded(kNodeTestWorld, [&](int, fsdp::comm::ProcessGroupPtr g) {
    Chain model = node_test_chain(g, node_options(fsdp::ShardingStrategy::kFullShard, 0, 2, fsdp::WireCodec::kNone, at::kBFloat16));
    int64_t want = 0;  // S_g x 2 bytes per Linear unit: (ceil(40/2) x 30 + 20) and (ceil(5/2) x 40 + 3)
    want += (20 * 30 + 20) * 2 + (3 * 40 + 3) * 2;
    at::Tensor loss = fsdp::call(model, at::ones({2, 30})).sum();
    EXPECT_EQ(fsdp::accounting::model_state_bytes(model.ptr()).node_shard_bytes, want);
    loss.backward();
    EXPECT_EQ(fsdp::accounting::model_state_bytes(model.ptr()).node_shard_bytes, 0);
    // A no-grad forward keeps nothing (no backward will come).
    {
      at::NoGradGuard no_grad;
      fsdp::call(model, at::ones({2, 30}));
    }
    EXPECT_EQ(fsdp::accounting::model_state_bytes(model.ptr()).node_shard_bytes, 0);
  });
}

// A forward whose backward never came leaves its shards behind; the params then change (a load,
// an optimizer): the next forward and backward use the new rows, not the kept ones.
TEST(NodeReshard, AShardFromAnEarlierForwardIsNeverUsed) {
  run_threaded(kNodeTestWorld, [&](int rank, fsdp::comm::ProcessGroupPtr g) {
    const auto o = node_options(fsdp::ShardingStrategy::kFullShard, 0, 2, fsdp::WireCodec::kNone, std::nullopt);
    Chain plain = node_test_chain(g, node_options(fsdp::ShardingStrategy::kFullShard, 0, 0, fsdp::WireCodec::kNone, std::nullopt));
    Chain node = node_test_chain(g, o);
    std::vector<std::vector<at::Tensor>> grads(2);
    std::vector<at::Tensor> evals(2);
    int k = 0;
    for (Chain m : {plain, node}) {
      fsdp::call(m, at::ones({2, 30}));  // kept, never used
      {
        at::NoGradGuard no_grad;
        for (auto& p : fsdp::parameters(m.ptr())) p.mul_(-2);
        evals[k] = fsdp::call(m, at::ones({2, 30}));  // an evaluation reads the new rows too
      }
      const auto [x, y] = regression_batch(0, 2 * kNodeTestWorld, 30, 5);
      F::mse_loss(fsdp::call(m, x.narrow(0, 2 * rank, 2)), y.narrow(0, 2 * rank, 2)).backward();
      for (const auto& sp : fsdp::sharded_parameters(m.ptr())) {
        grads[k].push_back(fsdp::gather_full_tensor(*sp.unit, *sp.param, /*grad=*/true));
      }
      ++k;
    }
    EXPECT_TRUE(at::equal(evals[1], evals[0])) << "the no-grad forward";
    for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(at::equal(grads[1][i], grads[0][i])) << "grad " << i;
  });
}

TEST(NodeReshard, RefusedWhereItCannotApply) {
  run_threaded(kNodeTestWorld, [&](int, fsdp::comm::ProcessGroupPtr g) {
    auto refusal = [&](fsdp::FullyShardOptions o) {
      torch::nn::Linear l(3, 4);
      return std::string(error_of([&] { fsdp::fully_shard(l.ptr(), g, o); }).what());
    };
    using S = fsdp::ShardingStrategy;
    auto o = node_options(S::kShardGradOp, 0, 2, fsdp::WireCodec::kNone, std::nullopt);
    EXPECT_NE(refusal(o).find("keeps its params until backward"), std::string::npos) << refusal(o);
    o = node_options(S::kFullShard, 0, 2, fsdp::WireCodec::kNone, std::nullopt);
    o.reshard_after_forward = false;
    EXPECT_NE(refusal(o).find("with reshard_after_forward=false"), std::string::npos) << refusal(o);
    for (S s : {S::kNoShard, S::kZero1}) {
      o = node_options(s, 0, 2, fsdp::WireCodec::kNone, std::nullopt);
      EXPECT_NE(refusal(o).find("applies to units that reshard after forward"), std::string::npos) << refusal(o);
    }
    for (int bad : {3, -2}) {
      o = node_options(S::kFullShard, 0, bad, fsdp::WireCodec::kNone, std::nullopt);
      EXPECT_NE(refusal(o).find("must divide the shard group size 4"), std::string::npos) << refusal(o);
    }
  });
}
