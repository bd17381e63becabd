// Tier `dist`: every collective at world sizes 1..8 on the in-process threaded group; an
// all-reduce that depends on another op.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

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

// all_reduce(after): the op is queued at issue but reads its tensor only once the dependency has
// completed (here a Work the test completes after writing the tensor); a failed dependency does
// not fail or skip it (every rank keeps the same sequence); the identity of one rank never waits.
// fp32 and bf16 (the low-precision reduction's own path; the sums are exact in bf16).
TEST(ThreadedCollectives, AllReduceAfterADependencyStartsWhenItCompletes) {
  for (int n : {1, 2, 3}) {
    for (bool dependency_fails : {false, true}) {
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        fsdp_test::run_threaded(n, [&](int rank, fsdp::comm::ProcessGroupPtr g) {
          at::Tensor t = at::zeros({7}, dtype);
          auto dependency = std::make_shared<fsdp::comm::Work>();
          auto work = g->all_reduce(t, fsdp::comm::ReduceOp::kSum, {"u", "backward"}, dependency);
          if (n == 1) {
            EXPECT_TRUE(work->is_completed());  // nothing read, nothing to wait for
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          EXPECT_FALSE(work->is_completed());
          t.fill_(static_cast<double>(rank + 1));  // written before the dependency completes
          dependency->finish(dependency_fails ? std::make_exception_ptr(std::runtime_error("dependency failed"))
                                              : nullptr,
                             0.0);
          work->wait();  // its own Work: no error even when the dependency failed
          EXPECT_EQ(t[0].item<float>(), static_cast<float>(n * (n + 1) / 2));
          EXPECT_EQ(t[6].item<float>(), static_cast<float>(n * (n + 1) / 2));
          g->barrier()->wait();  // later ops of the group run as usual
        });
      }
    }
  }
}
