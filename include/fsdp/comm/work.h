// Work: the handle of one asynchronous collective (the c10d pattern).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace fsdp::comm {

/// Handle of one collective issued on a ProcessGroup. Collectives of one group run in issue order on
/// that group's communication thread; the handle completes when the op has finished on this rank.
/// Thread-safe: any thread may wait() or poll is_completed().
class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// Blocks until the op has finished on this rank; rethrows the op's error (fsdp::Error) if it
  /// failed. May be called more than once; each call rethrows the same error. A wait that blocks
  /// is counted as exposed communication of the calling thread's phase (exposed_wait.h).
  void wait();

  /// Non-blocking: true once the op has finished (successfully or not).
  bool is_completed() const;

  /// Seconds the op spent running on the communication thread (0 until completed).
  double duration_s() const;

  // Called by the communication thread when the op ends.
  void finish(std::exception_ptr error, double duration_s);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double duration_s_ = 0.0;
};

using WorkPtr = std::shared_ptr<Work>;

/// A Work that is already complete (for ops that finish synchronously, e.g. world size 1).
WorkPtr completed_work();

}  // namespace fsdp::comm
