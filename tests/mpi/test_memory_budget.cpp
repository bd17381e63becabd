// Tier `mpi`: the memory budget inside the runtime: a refusal names the unit and phase the hooks
// marked, on every rank alike, and the same model trains once the budget is lifted.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"
#include "mpi_world.h"

using namespace fsdp_test;

// A budget of 1 byte above what is in use refuses the first allocation of the forward: the
// gathered params of unit 'l0', in its pre-forward, before any collective is issued (so every
// rank is refused at the same point and no peer waits). Every rank reports its own rank, the
// unit, the phase and the exact numbers.
TEST(MemoryBudget, RefusalInsideAUnitNamesItOnEveryRank) {
  auto g = world();
  torch::manual_seed(5);
  auto model = Chain(std::vector<int64_t>{24, 16, 8}).ptr();
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  at::Tensor x = torch::randn({4, 24});
  const int64_t in_use = fsdp::accounting::current_bytes();
  fsdp::accounting::set_memory_budget(in_use + 1, g->rank());
  bool refused = false;
  try {
    fsdp::call(model, x);
  } catch (const fsdp::OutOfMemory& e) {
    refused = true;
    EXPECT_EQ(e.where().rank, g->rank());
    EXPECT_EQ(e.where().unit, "l0");
    EXPECT_EQ(e.phase(), "forward");
    EXPECT_EQ(e.in_use_bytes(), in_use);
    EXPECT_EQ(e.budget_bytes(), in_use + 1);
    EXPECT_GT(e.requested_bytes(), 1);
  }
  fsdp::accounting::clear_memory_budget();
  EXPECT_TRUE(refused) << "the forward ran under a budget of 1 byte of headroom";
  EXPECT_EQ(fsdp::current_activity().unit, nullptr) << "the failed pre-forward left its marker";
  EXPECT_EQ(fsdp::accounting::current_bytes(), in_use) << "the refusal left nothing allocated";
  // Every rank was refused: one all-reduce of the flags agrees.
  at::Tensor all = at::tensor({refused ? 1 : 0}, at::kInt);
  g->all_reduce(all, fsdp::comm::ReduceOp::kSum)->wait();
  EXPECT_EQ(all.item<int>(), g->size());
}
