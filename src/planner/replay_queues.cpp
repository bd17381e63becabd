#include "fsdp/planner/replay_queues.h"

#include <algorithm>
#include <limits>

#include "fsdp/common/check.h"

namespace fsdp::planner {
namespace {
const ErrorContext kReplayWhere{-1, "", "planner step replay"};
constexpr double kNever = std::numeric_limits<double>::infinity();
}  // namespace

ReplayQueues::ReplayQueues(int num_queues) {
  FSDP_CHECK(num_queues >= 1, ErrorKind::kInvalidArgument, kReplayWhere,
             expected_actual("replay queues", ">= 1", num_queues));
  queues_.resize(static_cast<std::size_t>(num_queues));
}

void ReplayQueues::check_time(double t_s) const {
  FSDP_CHECK(t_s >= now_s_, ErrorKind::kInvalidArgument, kReplayWhere, "the compute thread's time went back from ",
             now_s_, " s to ", t_s, " s");
}

ReplayQueues::OpId ReplayQueues::issue(int queue, double t_s, double work_s, double slowdown, OpId after) {
  FSDP_CHECK(queue >= 0 && queue < static_cast<int>(queues_.size()), ErrorKind::kInvalidArgument, kReplayWhere,
             expected_actual("queue", "in [0, " + std::to_string(queues_.size()) + ")", queue));
  FSDP_CHECK(work_s >= 0 && work_s < kNever && slowdown >= 1.0 && slowdown < kNever, ErrorKind::kInvalidArgument,
             kReplayWhere, "a collective needs a finite work_s >= 0 and slowdown >= 1, got ", work_s, " and ", slowdown);
  FSDP_CHECK(after.queue < queue && (after.queue < 0 || (after.index >= 0 &&
                                                         after.index < static_cast<int>(queues_[after.queue].ops.size()))),
             ErrorKind::kInvalidArgument, kReplayWhere, "a collective on queue ", queue,
             " may depend only on one issued on a lower queue, got queue ", after.queue, " index ", after.index);
  check_time(t_s);
  Queue& q = queues_[static_cast<std::size_t>(queue)];
  q.ops.push_back(Op{t_s, work_s, slowdown, after, -1.0});
  return OpId{queue, static_cast<int>(q.ops.size()) - 1};
}

double ReplayQueues::start_s(const Queue& q) const {
  const Op& o = q.ops[q.next];
  double s = std::max(q.clock_s, o.issued_s);
  if (o.after.queue >= 0) {
    const double dep_end = queues_[static_cast<std::size_t>(o.after.queue)].ops[static_cast<std::size_t>(o.after.index)].end_s;
    if (dep_end < 0) return kNever;
    s = std::max(s, dep_end);
  }
  return s;
}

// Runs every queue from now_s_ to t_s, in queue order (a dependency is on a lower queue, already run
// to t_s): while `computing` an op runs at 1 / slowdown of its speed alone, else at its speed alone.
void ReplayQueues::run_until(double t_s, bool computing) {
  for (Queue& q : queues_) {
    while (q.next < q.ops.size()) {
      Op& o = q.ops[q.next];
      const double s = start_s(q);
      const double stretch = computing ? o.slowdown : 1.0;
      const double end = s + o.work_left_s * stretch;  // +inf while blocked
      if (end > t_s) {
        if (s < t_s) o.work_left_s -= (t_s - s) / stretch;
        break;
      }
      o.work_left_s = 0.0;
      o.end_s = end;
      q.clock_s = end;
      ++q.next;
    }
    q.clock_s = std::max(q.clock_s, t_s);
  }
  now_s_ = t_s;
}

double ReplayQueues::wait(double t_s, OpId op) {
  FSDP_CHECK(op.queue >= 0 && op.queue < static_cast<int>(queues_.size()) && op.index >= 0 &&
                 op.index < static_cast<int>(queues_[static_cast<std::size_t>(op.queue)].ops.size()),
             ErrorKind::kInvalidArgument, kReplayWhere, "waiting for a collective never issued (queue ", op.queue,
             ", index ", op.index, ")");
  check_time(t_s);
  run_until(t_s, /*computing=*/true);
  const Op& target = queues_[static_cast<std::size_t>(op.queue)].ops[static_cast<std::size_t>(op.index)];
  // The compute thread waits: every queue runs at its speed alone, event by event, until `op` is done.
  while (target.end_s < 0) {
    double next = kNever;
    for (const Queue& q : queues_) {
      if (q.next < q.ops.size()) {
        const double s = start_s(q);
        if (s < kNever) next = std::min(next, s + q.ops[q.next].work_left_s);
      }
    }
    FSDP_CHECK(next < kNever, ErrorKind::kState, kReplayWhere, "no collective can run while one is pending");
    run_until(next, /*computing=*/false);
  }
  return std::max(t_s, target.end_s);
}

double ReplayQueues::wait_all(double t_s, int queue) {
  FSDP_CHECK(queue >= 0 && queue < static_cast<int>(queues_.size()), ErrorKind::kInvalidArgument, kReplayWhere,
             expected_actual("queue", "in [0, " + std::to_string(queues_.size()) + ")", queue));
  const auto& ops = queues_[static_cast<std::size_t>(queue)].ops;
  if (ops.empty()) {
    check_time(t_s);
    return t_s;
  }
  return wait(t_s, OpId{queue, static_cast<int>(ops.size()) - 1});
}

}  // namespace fsdp::planner
