// Tier `dist`: every collective at world sizes 1..8 on the in-process threaded group.
#include <gtest/gtest.h>

#include "../common/collective_cases.h"
#include "../common/threaded.h"

TEST(ThreadedCollectives, ClosedFormAllOpsWorldSizes1To8) {
  for (int n = 1; n <= 8; ++n) {
    fsdp_test::run_threaded(n, [](int, fsdp::comm::ProcessGroupPtr g) {
      fsdp_test::check_all_collectives(*g);
      fsdp_test::check_validation(*g);
    });
  }
}

TEST(ThreadedCollectives, StatsCountLogicalBytes) {
  fsdp_test::run_threaded(3, [](int, fsdp::comm::ProcessGroupPtr g) {
    g->stats().reset();
    g->all_gather_into_tensor(at::empty({3 * 5}, at::kBFloat16), at::zeros({5}, at::kBFloat16))->wait();
    g->reduce_scatter_tensor(at::empty({4}), at::zeros({12}))->wait();
    g->all_reduce(at::zeros({10}, at::kDouble))->wait();
    auto s = g->stats().snapshot();
    using K = fsdp::comm::CollectiveKind;
    EXPECT_EQ(s[int(K::kAllGather)].calls, 1);
    EXPECT_EQ(s[int(K::kAllGather)].bytes, 3 * 5 * 2);  // output, bf16
    EXPECT_EQ(s[int(K::kReduceScatter)].bytes, 12 * 4);  // input
    EXPECT_EQ(s[int(K::kAllReduce)].bytes, 80);
  });
}
