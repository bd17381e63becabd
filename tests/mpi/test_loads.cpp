// Tier `mpi`: every path that changes the shards leaves no stale unsharded copy. A unit still
// holding its gathered params (the root after a forward with grad and no backward; shard_grad_op
// and zero1 units) must compute with the loaded values, as a freshly built model does.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/runtime/state_dict.h"
#include "mpi_world.h"
#include "shared_dir.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace ckpt = fsdp::checkpoint;

namespace {

std::shared_ptr<MLPImpl> sharded_mlp(uint64_t seed, fsdp::ShardingStrategy s) {
  auto g = world();
  torch::manual_seed(seed);
  auto m = MLP(5, 9, 3).ptr();
  fsdp::fully_shard(m->fc1.ptr(), g, options_for(s, g->size()));
  fsdp::fully_shard(m->fc2.ptr(), g, options_for(s, g->size()));
  fsdp::fully_shard(m, g, options_for(s, g->size()));
  return m;
}

// One AdamW step, then a forward with grad and no backward (a validation pass that forgot
// no_grad): the root, shard_grad_op units and zero1's full params stay gathered.
void train_then_leave_gathered(const std::shared_ptr<MLPImpl>& m) {
  auto g = world();
  torch::optim::AdamW opt(fsdp::parameters(m), torch::optim::AdamWOptions(0.05));
  auto [x, y] = regression_batch(0, 4, 5, 3);
  F::mse_loss(fsdp::call(m, x), y).backward();
  opt.step();
  opt.zero_grad();
  (void)fsdp::call(m, x);  // gathered, graph dropped
}

}  // namespace

TEST(Loads, NoStaleUnshardedCopyAfterAnyLoadEveryStrategy) {
  auto g = world();
  SharedDir dir("loads");
  auto [x, y] = regression_batch(7, 4, 5, 3);
  // The single-process reference: seed 99's weights.
  torch::manual_seed(99);
  auto ref = MLP(5, 9, 3).ptr();
  const at::Tensor expected = ref->forward(x).detach();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto source = sharded_mlp(99, s);
    auto full = fsdp::full_state_dict(source);
    std::map<std::string, at::Tensor> state(full.begin(), full.end());
    const std::string ckpt_dir = dir.sub(std::string("ck-") + fsdp::to_string(s));
    ckpt::save_sharded(ckpt_dir, source, nullptr, ckpt::TrainState{}, g);
    const std::string pt = dir.sub(std::string("full-") + fsdp::to_string(s) + ".pt");
    ckpt::export_full(pt, source, g);
    for (const char* how : {"load_full_state_dict", "load_sharded", "import_full"}) {
      SCOPED_TRACE(how);
      auto m = sharded_mlp(5, s);
      train_then_leave_gathered(m);
      if (std::string(how) == "load_full_state_dict") fsdp::load_full_state_dict(m, state);
      if (std::string(how) == "load_sharded") ckpt::load_sharded(ckpt_dir, m, nullptr, nullptr, g);
      if (std::string(how) == "import_full") ckpt::import_full(pt, m, g);
      for (bool grad : {true, false}) {  // a forward with grad keeps the root gathered again
        at::AutoGradMode mode(grad);
        expect_close(fsdp::call(m, x).detach(), expected, 1e-6, 1e-6,
                     std::string("forward after ") + how + (grad ? " (grad)" : " (no grad)"));
      }
      // And training goes on from the loaded values.
      torch::optim::SGD opt(fsdp::parameters(m), torch::optim::SGDOptions(0.0));
      F::mse_loss(fsdp::call(m, x), y).backward();
      compare_with_reference(m, ref, /*grad=*/false, 1e-6, 1e-6, std::string("params after ") + how);
    }
  }
}
