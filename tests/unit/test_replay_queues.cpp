// The step replay's collective queues (planner/replay_queues.h): closed-form completion times of
// processor sharing ([Note: processor sharing]).
#include <gtest/gtest.h>

#include "fsdp/common/check.h"
#include "fsdp/planner/replay_queues.h"

namespace fp = fsdp::planner;

TEST(PlannerReplayQueues, SlowdownAppliesOnlyWhileComputing) {
  // 1 s alone, 2x slower beside compute. Compute runs 1 s: half a second of its work is done;
  // the wait then runs the other half at its speed alone: done at 1.5 s.
  {
    fp::ReplayQueues q(1);
    const auto a = q.issue(0, 0.0, 1.0, 2.0);
    EXPECT_DOUBLE_EQ(q.wait(1.0, a), 1.5);
  }
  // Compute long enough: done at 2 s beside it (1 s x 2), the wait at 3 s returns at once.
  {
    fp::ReplayQueues q(1);
    const auto a = q.issue(0, 0.0, 1.0, 2.0);
    EXPECT_DOUBLE_EQ(q.wait(3.0, a), 3.0);
    EXPECT_DOUBLE_EQ(q.wait_all(3.0, 0), 3.0);
  }
  // Waiting at once: its time alone.
  {
    fp::ReplayQueues q(1);
    const auto a = q.issue(0, 0.25, 1.0, 3.0);
    EXPECT_DOUBLE_EQ(q.wait(0.25, a), 1.25);
  }
  // Slowdown 1: the queue as a plain FIFO (a second op starts when the first is done).
  {
    fp::ReplayQueues q(1);
    const auto a = q.issue(0, 0.0, 1.0, 1.0);
    const auto b = q.issue(0, 0.5, 1.0, 1.0);
    EXPECT_DOUBLE_EQ(q.wait(0.5, b), 2.0);
    EXPECT_DOUBLE_EQ(q.wait(2.0, a), 2.0);
  }
  // Zero work: done when issued (a one-rank group).
  {
    fp::ReplayQueues q(3);
    for (int i = 0; i < 4; ++i) q.issue(2, 0.1 * i, 0.0, 2.0);
    EXPECT_DOUBLE_EQ(q.wait_all(0.5, 2), 0.5);
    EXPECT_DOUBLE_EQ(q.wait_all(0.5, 1), 0.5);  // nothing issued there
  }
}

TEST(PlannerReplayQueues, FifoDependencyAndWaitsSpeedUpEveryQueue) {
  // Queue 0: A (1 s alone, slowdown 2) then B (1 s, slowdown 2). Compute to 1 s: A has 0.5 s left.
  // The wait for B runs at speed alone: A done at 1.5, B at 2.5.
  fp::ReplayQueues q(2);
  const auto a = q.issue(0, 0.0, 1.0, 2.0);
  const auto b = q.issue(0, 0.0, 1.0, 2.0);
  // C on queue 1 after A: 1 s alone, slowdown 4.
  const auto c = q.issue(1, 0.0, 1.0, 4.0, a);
  EXPECT_DOUBLE_EQ(q.wait(1.0, b), 2.5);
  // C started at 1.5 (A done) and ran at its speed alone while the compute thread waited until
  // 2.5: done at 2.5 exactly.
  EXPECT_DOUBLE_EQ(q.wait(2.5, c), 2.5);
  // A dependency that is itself still running: D on queue 1 after E on queue 0, issued at 3.
  const auto e = q.issue(0, 3.0, 2.0, 2.0);  // beside compute: 4 s
  const auto d = q.issue(1, 3.0, 1.0, 1.0, e);
  // Compute to 5 s: E has 1 s of work left, then waits: E done at 6, D at 7.
  EXPECT_DOUBLE_EQ(q.wait(5.0, d), 7.0);
}

TEST(PlannerReplayQueues, RejectsBadCalls) {
  fp::ReplayQueues q(2);
  EXPECT_THROW(fp::ReplayQueues(0), fsdp::Error);
  EXPECT_THROW(q.issue(2, 0.0, 1.0, 1.0), fsdp::Error);
  EXPECT_THROW(q.issue(0, 0.0, -1.0, 1.0), fsdp::Error);
  EXPECT_THROW(q.issue(0, 0.0, 1.0, 0.5), fsdp::Error);
  const auto a = q.issue(1, 0.0, 1.0, 1.0);
  EXPECT_THROW(q.issue(0, 0.0, 1.0, 1.0, a), fsdp::Error);  // on a higher queue
  EXPECT_THROW(q.wait(0.0, fp::ReplayOpId{0, 3}), fsdp::Error);
  EXPECT_DOUBLE_EQ(q.wait(0.0, a), 1.0);
  EXPECT_THROW(q.issue(0, 0.5, 1.0, 1.0), fsdp::Error);  // time went back
}
