// The communication threads of the step replay (time_model.h): one queue per process group, each
// running its collectives one after another in issue order, beside one compute thread.
// docs/planner.md, "Time model".
#pragma once

#include <cstddef>
#include <vector>

namespace fsdp::planner {

/// One collective issued on ReplayQueues: its queue and its place in that queue (-1: none).
struct ReplayOpId {
  int queue = -1;
  int index = -1;
};

/// [Note: processor sharing] Collective queues on the compute thread's clock (seconds from the
/// start of a step). A collective needs `work_s` seconds of its queue when it runs at its speed
/// alone. While the compute thread computes beside it, it runs `slowdown` times slower (on a
/// machine where compute oversubscribes the cores the communication threads get a smaller share of
/// them: profile.h CollectiveLinks::duration_factor; 1 elsewhere); while the compute thread waits
/// (for this or any other collective), every rank's compute thread waits at once and it runs at
/// its speed alone. A collective starts once it is issued, its queue's earlier collectives are done
/// and the collective it depends on (on a queue of a lower index) is done.
///
/// The compute thread's time only moves forward: `issue` and `wait` take the compute thread's
/// clock, and everything between two calls counts as computing. Not thread-safe (one replay).
class ReplayQueues {
 public:
  using OpId = ReplayOpId;
  /// `num_queues` empty queues. Throws fsdp::Error (kInvalidArgument) for num_queues < 1.
  explicit ReplayQueues(int num_queues);
  /// Issues on `queue` at compute time `t_s` a collective of `work_s` seconds alone that runs
  /// `slowdown` (>= 1) times slower while the compute thread computes; it starts only after `after`
  /// is done (none by default; it must be on a queue of a lower index). Does not block the compute
  /// thread. Throws fsdp::Error (kInvalidArgument) for a bad queue, a work_s negative or not
  /// finite, a slowdown below 1 or not finite, a dependency on the same or a higher queue, or t_s before an earlier call's time.
  OpId issue(int queue, double t_s, double work_s, double slowdown, OpId after = {});
  /// The compute thread, computing until `t_s`, waits there for `op`: returns the time it is done
  /// (>= t_s). Throws fsdp::Error (kInvalidArgument) for an op never issued or t_s before an
  /// earlier call's time.
  double wait(double t_s, OpId op);
  /// As wait, for every collective issued on `queue` so far (t_s when none is pending).
  double wait_all(double t_s, int queue);

 private:
  struct Op {
    double issued_s = 0.0;
    double work_left_s = 0.0;  ///< seconds at its speed alone still to run
    double slowdown = 1.0;
    OpId after;
    double end_s = -1.0;  ///< when it was done; < 0 while pending
  };
  struct Queue {
    std::vector<Op> ops;
    std::size_t next = 0;  ///< the first op not done
    double clock_s = 0.0;  ///< the queue has been run up to here
  };
  double start_s(const Queue& q) const;  // when q's next op can run from; +inf while blocked
  void run_until(double t_s, bool computing);
  void check_time(double t_s) const;
  std::vector<Queue> queues_;
  double now_s_ = 0.0;  ///< every queue has been run up to here
};

}  // namespace fsdp::planner
