// Tier `mpi`: the scheduler's forward prefetch and its bound on unsharded units, backward
// prefetch under the same bound, and a unit destroyed while its autograd graph lives.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/runtime/model_state.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

// A Linear that records, when its forward runs, which of the chain's units are gathered.
struct ProbeLayerImpl : torch::nn::Module {
  explicit ProbeLayerImpl(int64_t d) { lin = register_module("lin", torch::nn::Linear(d, d)); }
  at::Tensor forward(at::Tensor x) {
    if (on_forward) on_forward();
    return torch::tanh(lin(x));
  }
  torch::nn::Linear lin{nullptr};
  std::function<void()> on_forward;
};
TORCH_MODULE(ProbeLayer);

struct ProbeChainImpl : torch::nn::Module {
  ProbeChainImpl(int layers, int64_t d) {
    for (int i = 0; i < layers; ++i) blocks.push_back(register_module("b" + std::to_string(i), ProbeLayer(d)));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = fsdp::call(b, x);
    return x;
  }
  std::vector<ProbeLayer> blocks;
};
TORCH_MODULE(ProbeChain);

constexpr int kLayers = 5;
constexpr int64_t kDim = 24;

}  // namespace

// forward_prefetch issues the next unit's all-gather (in the last forward's order) at each
// pre-forward, as long as fewer than max_unsharded_units non-root units are gathered: with bound
// m, at most m block units are ever gathered at once, and with m >= 2 the next block is already
// gathering or gathered when a block's forward runs (from the second step on). With
// forward_prefetch off, it never is.
TEST(Scheduler, ForwardPrefetchAndTheBoundOnUnshardedUnits) {
  auto g = world();
  for (bool prefetch : {false, true}) {
    for (int bound : {1, 2, 3}) {
      SCOPED_TRACE(std::string("forward_prefetch ") + (prefetch ? "on" : "off") + ", max_unsharded_units " +
                   std::to_string(bound));
      torch::manual_seed(2);
      auto model = ProbeChain(kLayers, kDim).ptr();
      fsdp::FullyShardOptions o;
      o.forward_prefetch = prefetch;
      o.max_unsharded_units = bound;
      fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<ProbeLayerImpl>(), o);
      std::vector<std::shared_ptr<fsdp::FSDPUnit>> units;
      for (auto& b : model->blocks) units.push_back(fsdp::find_unit(b.get()));
      int max_gathered = 0, next_ready = 0, probes = 0;
      for (int i = 0; i < kLayers; ++i) {
        model->blocks[i]->on_forward = [&, i] {
          int gathered = 0;
          for (auto& u : units) gathered += u->sharded_state() != fsdp::ShardedState::kSharded;
          max_gathered = std::max(max_gathered, gathered);
          if (i + 1 < kLayers) {
            ++probes;
            next_ready += units[i + 1]->sharded_state() != fsdp::ShardedState::kSharded;
          }
        };
      }
      torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.01));
      for (int step = 0; step < 3; ++step) {
        if (step == 1) {  // the first forward has no order to prefetch from
          max_gathered = next_ready = probes = 0;
        }
        auto [x, y] = regression_batch(step, 4, kDim, kDim);
        F::mse_loss(fsdp::call(model, x), y).backward();
        opt.step();
        opt.zero_grad();
      }
      EXPECT_LE(max_gathered, bound) << "more block units gathered at once than the bound";
      if (prefetch && bound >= 2) {
        EXPECT_EQ(next_ready, probes) << "the next block was not prefetched";
        EXPECT_EQ(max_gathered, 2) << "one block computing, the next one prefetched";
      } else {
        EXPECT_EQ(next_ready, 0) << "a block was gathered before its forward without prefetch room";
        EXPECT_EQ(max_gathered, 1);
      }
      // Backward prefetch obeys the same bound: the peak of unsharded param bytes of the tree stays
      // within `bound` blocks (root excluded: it owns no params here).
      const int64_t block_bytes = (kDim * kDim + kDim) * 4;  // every rank gathers whole blocks
      const auto acc = fsdp::accounting::model_state_bytes(model);
      EXPECT_LE(acc.peak_unsharded_param_bytes, bound * (block_bytes + 4 * kDim * g->size()))
          << "peak unsharded bytes above the bound";
    }
  }
}

// A unit destroyed while the autograd graph of its forward is alive: the backward reaching its
// hooks throws fsdp::Error naming the unit instead of touching freed memory (every strategy).
TEST(Runtime, UnitDestroyedWhileItsGraphLivesIsAnError) {
  auto g = world();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    at::Tensor loss;
    {
      torch::manual_seed(5);
      auto model = MLP(6, 8, 3).ptr();
      fsdp::fully_shard(model->fc1.ptr(), g, options_for(s, g->size()));
      fsdp::fully_shard(model->fc2.ptr(), g, options_for(s, g->size()));
      fsdp::fully_shard(model, g, options_for(s, g->size()));
      auto [x, y] = regression_batch(0, 4, 6, 3);
      x.set_requires_grad(true);  // every unit's hooks are on the graph
      loss = F::mse_loss(fsdp::call(model, x), y);
    }  // the model and its units die here; the graph lives on in `loss`
    try {
      loss.backward();
      ADD_FAILURE() << "backward through destroyed units was accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kState);
      EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("unit '"), std::string::npos) << e.what();
    }
  }
  g->barrier()->wait();
}
