// Tier `dist`: every collective at world sizes 1..8 on the in-process threaded group; an
// all-reduce that depends on another op; the collective check on the control channel.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../common/collective_cases.h"
#include "../common/counting_backend.h"
#include "../common/threaded.h"
#include "../common/error_of.h"
#include "fsdp/comm/exposed_wait.h"
#include "fsdp/common/activity.h"

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

using fsdp_test::error_of;

namespace {

// A failed step's forward pass `forward_pass` (sync epoch 0) abandoned for `reason`.
fsdp::comm::AbandonedPass pass(int64_t forward_pass, const std::string& reason) {
  return {fsdp::comm::AbandonedPass::Kind::kFailedWithGrad, forward_pass, 0, reason};
}

}  // namespace

// [Note: abandoned steps] Rank r issued r all-reduces of forward pass 7 before its step failed,
// then abandons the step: position k holds markers of ranks 0..k and real ops of the others, so
// every real op fails (kStepAbandoned, naming rank 0 and its reason), abandon_step returns on
// every rank after max(r) + 1 rounds, and the group is in step again (an all-reduce of ones sums
// to n). When every rank issued the same ops, they complete with their closed-form sums.
TEST(ThreadedCollectives, AbandonedStepPairsTheCollectivesOneRankIssuedAndAnotherDidNot) {
  for (int n = 2; n <= 5; ++n) {
    fsdp_test::run_threaded(n, [n](int rank, fsdp::comm::ProcessGroupPtr g) {
      const fsdp::comm::OpTag tag{"h.1", "forward", 7, 0};
      std::vector<fsdp::comm::WorkPtr> works;
      for (int k = 0; k < rank; ++k) works.push_back(g->all_reduce(at::ones({3}), fsdp::comm::ReduceOp::kSum, tag));
      fsdp::comm::abandon_step({g.get()}, pass(7, "rank " + std::to_string(rank) + "'s batch check"));
      for (const auto& w : works) {
        const fsdp::Error e = error_of([&] { w->wait(); });
        EXPECT_EQ(e.kind(), fsdp::ErrorKind::kStepAbandoned) << e.what();
        EXPECT_NE(std::string(e.what()).find("abandoned forward pass 7 (its step failed: rank 0's batch check)"),
                  std::string::npos)
            << e.what();
      }
      at::Tensor t = at::ones({4});
      g->all_reduce(t)->wait();
      EXPECT_EQ(t[3].item<float>(), static_cast<float>(n));
      // The same ops on every rank: nothing to pair, they complete.
      at::Tensor u = at::full({2}, static_cast<float>(rank + 1));
      auto w = g->all_reduce(u, fsdp::comm::ReduceOp::kSum, tag);
      fsdp::comm::abandon_step({g.get()}, pass(7, "every rank's check"));
      w->wait();
      EXPECT_EQ(u[1].item<float>(), static_cast<float>(n * (n + 1) / 2));
      EXPECT_EQ(g->diverged(), "");
    });
  }
}

// A rank abandons forward pass 7 while its peer is already at a collective of no step: every rank
// throws kMismatch naming both sides, and the group refuses every later op with that reason.
TEST(ThreadedCollectives, AbandonedStepMetByACollectiveOfNoStepDivergesTheGroup) {
  fsdp_test::run_threaded(2, [](int rank, fsdp::comm::ProcessGroupPtr g) {
    fsdp::Error e = rank == 0 ? error_of([&] { fsdp::comm::abandon_step({g.get()}, pass(7, "NaN guard")); })
                              : error_of([&] { g->all_reduce(at::ones({3}))->wait(); });
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch) << e.what();
    for (const char* want : {"ranks left a step at different points", "rank 0 issued nothing more of forward pass 7 "
                             "(its step failed: NaN guard)", "rank 1 issued all_reduce of 3 float32 (sum)"}) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << want << " in " << e.what();
    }
    e = error_of([&] { g->barrier()->wait(); });
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch);
    EXPECT_NE(std::string(e.what()).find("refuses every collective: ranks left a step"), std::string::npos) << e.what();
  });
}

// Exposed communication: a wait that blocks is counted in the waiting thread's phase, for at least
// as long as the late peer kept it waiting; a wait on a finished op counts nothing.
TEST(ThreadedCollectives, BlockingWaitsAreCountedAsExposedInTheirPhase) {
  using fsdp::comm::WaitPhase;
  EXPECT_EQ(fsdp::comm::wait_phase_of("forward"), WaitPhase::kForward);
  EXPECT_EQ(fsdp::comm::wait_phase_of("forward (checkpointed)"), WaitPhase::kForward);
  EXPECT_EQ(fsdp::comm::wait_phase_of("backward (recompute)"), WaitPhase::kBackward);
  EXPECT_EQ(fsdp::comm::wait_phase_of("post-backward"), WaitPhase::kBackward);
  EXPECT_EQ(fsdp::comm::wait_phase_of("end of backward"), WaitPhase::kEndOfBackward);
  EXPECT_EQ(fsdp::comm::wait_phase_of("optimizer step"), WaitPhase::kOptimizer);
  EXPECT_EQ(fsdp::comm::wait_phase_of("loss"), WaitPhase::kOther);
  EXPECT_EQ(fsdp::comm::wait_phase_of(nullptr), WaitPhase::kOther);
  static constexpr double kLateS = 0.2;
  const auto before = fsdp::comm::exposed_wait_s();
  fsdp::comm::set_record_wait_events(true);
  fsdp::comm::take_wait_events();
  fsdp_test::run_threaded(2, [](int rank, fsdp::comm::ProcessGroupPtr g) {
    at::Tensor t = at::ones({4});
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
      g->all_reduce(t)->wait();
      return;
    }
    const fsdp::ActivityScope phase(nullptr, "optimizer step");
    auto work = g->all_reduce(t);
    work->wait();  // blocks until rank 1 arrives
    work->wait();  // finished: nothing more
  });
  const auto after = fsdp::comm::exposed_wait_s();
  const auto events = fsdp::comm::take_wait_events();
  fsdp::comm::set_record_wait_events(false);
  const int opt = static_cast<int>(WaitPhase::kOptimizer);
  EXPECT_GE(after[opt] - before[opt], 0.9 * kLateS);
  double optimizer_event_s = 0.0;
  for (const auto& e : events) {
    EXPECT_LE(e.start_s, e.end_s);
    if (e.phase == WaitPhase::kOptimizer) optimizer_event_s += e.end_s - e.start_s;
  }
  EXPECT_NEAR(optimizer_event_s, after[opt] - before[opt], 1e-9);
}

// A chained op's communication thread waits for the stage before it ([Note: chained ops]); that
// wait hides nothing from compute and is not exposed communication: only the compute thread's own
// wait on the chained op counts, in its phase.
TEST(ThreadedCollectives, ChainedOpWaitOnTheCommunicationThreadIsNotExposed) {
  using fsdp::comm::WaitPhase;
  static constexpr double kLateS = 0.3;
  auto first = fsdp::comm::threaded_world(2);
  auto second = fsdp::comm::threaded_world(2);
  const auto before = fsdp::comm::exposed_wait_s();
  fsdp_test::on_threads(2, [&](int rank) {
    at::Tensor a = at::ones({4}), b = at::ones({4});
    if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
    const fsdp::ActivityScope phase(nullptr, rank == 0 ? "optimizer step" : "forward");
    auto stage1 = first[rank]->all_reduce(a);
    auto stage2 = second[rank]->all_reduce(b, fsdp::comm::ReduceOp::kSum, {}, stage1);
    stage2->wait();
  });
  const auto after = fsdp::comm::exposed_wait_s();
  const int opt = static_cast<int>(WaitPhase::kOptimizer), other = static_cast<int>(WaitPhase::kOther);
  EXPECT_GE(after[opt] - before[opt], 0.9 * kLateS);  // rank 0's compute thread waited for rank 1
  // Rank 0's second executor waited as long for stage 1: not counted anywhere.
  double total = 0.0;
  for (int p = 0; p < fsdp::comm::kWaitPhaseCount; ++p) total += after[p] - before[p];
  EXPECT_LT(total, after[opt] - before[opt] + 0.5 * kLateS);
  EXPECT_LT(after[other] - before[other], 0.5 * kLateS);
}

// [Note: control channel] A group given a data backend and a control backend of its own (the
// seam a device data backend uses): the data backend sees the user's ops only, the control
// channel the signatures; a mismatch is still caught and named.
TEST(ControlChannel, GivenControlBackendCarriesTheCheckAndTheDataBackendTheOpsOnly) {
  constexpr int kRanks = 2;
  auto data = fsdp::comm::threaded_backends(kRanks, kRanks);
  auto control = fsdp::comm::threaded_backends(kRanks, kRanks);
  std::vector<fsdp_test::BackendCounts> data_counts(kRanks), control_counts(kRanks);
  std::vector<fsdp::comm::ProcessGroupPtr> groups;
  for (int r = 0; r < kRanks; ++r) {
    groups.push_back(std::make_shared<fsdp::comm::ProcessGroup>(
        std::make_unique<fsdp_test::CountingBackend>(std::move(data[r]), data_counts[r]),
        std::make_unique<fsdp_test::CountingBackend>(std::move(control[r]), control_counts[r]),
        fsdp::comm::threaded_defaults(), "world"));
  }
  fsdp_test::on_threads(kRanks, [&](int r) {
    EXPECT_EQ(groups[r]->control_backend_name(), "threaded");
    fsdp_test::check_control_channel_carries_the_check(*groups[r], data_counts[r], control_counts[r]);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(data_counts[r].control_channels.load(), 0);
}

// The default: the group asks its data backend for a control channel (collective over the
// threads, as MPI_Comm_dup is over processes); one per group, and one per group split from it.
TEST(ControlChannel, TheDataBackendsOwnControlChannelCarriesTheCheck) {
  constexpr int kRanks = 2;
  auto data = fsdp::comm::threaded_backends(kRanks, kRanks);
  std::vector<fsdp_test::BackendCounts> data_counts(kRanks), control_counts(kRanks);
  fsdp_test::on_threads(kRanks, [&](int r) {
    fsdp::comm::ProcessGroup g(
        std::make_unique<fsdp_test::CountingBackend>(std::move(data[r]), data_counts[r], &control_counts[r]),
        fsdp::comm::threaded_defaults());
    EXPECT_EQ(data_counts[r].control_channels.load(), 1);
    fsdp_test::check_control_channel_carries_the_check(g, data_counts[r], control_counts[r]);
    EXPECT_EQ(data_counts[r].control_channels.load(), 1) << "the split made a channel instead of splitting it";
  });
}

// A control backend that does not span the data backend's ranks is refused at construction,
// naming the rank and expected vs actual; so is one that is not on the CPU.
TEST(ControlChannel, AControlBackendOverOtherRanksIsRefused) {
  auto data = fsdp::comm::threaded_backends(2, 2);
  auto control = fsdp::comm::threaded_backends(3, 3);
  const fsdp::Error e = fsdp_test::error_of([&] {
    fsdp::comm::ProcessGroup g(std::move(data[1]), std::move(control[2]), fsdp::comm::threaded_defaults());
  });
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
  const std::string msg = e.what();
  EXPECT_NE(msg.find("[fsdp rank 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected rank 1 of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 2 of 3"), std::string::npos) << msg;
}
