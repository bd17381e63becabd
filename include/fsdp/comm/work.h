// Work: the handle of one asynchronous collective (the c10d pattern). WorkHandle is the interface
// every backend's handle implements; Work is the CPU one, completed by a communication thread.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace fsdp::comm {

/// Handle of one collective issued on a ProcessGroup; it completes when the op has finished on
/// this rank. Implementations are thread-safe: any thread may wait(), poll is_completed() or join
/// a stream. A device backend's handle completes on its device (an event on the communication
/// stream) and joins the caller's stream to it; the CPU's (Work) completes on the group's
/// communication thread.
class WorkHandle {
 public:
  virtual ~WorkHandle() = default;

  /// Blocks the calling thread until the op has finished on this rank; rethrows the op's error
  /// (fsdp::Error) if it failed. May be called more than once, from any thread; each call throws
  /// its own copy of the same error (no exception object is shared between threads).
  virtual void wait() = 0;

  /// Non-blocking: true once the op has finished (successfully or not).
  virtual bool is_completed() const = 0;

  /// Seconds the op spent running (0 until completed).
  virtual double duration_s() const = 0;

  /// Non-blocking: makes the calling thread's current stream wait for the op, so that kernels
  /// queued after this call read its output. No-op on the CPU (there is no stream: the CPU
  /// reads the output once wait() has returned). Errors are reported by wait(), not here.
  virtual void block_current_stream() {}
};

using WorkPtr = std::shared_ptr<WorkHandle>;

/// The CPU handle: completed by the group's communication thread (or inline, for ops that finish
/// synchronously) through finish().
class Work final : public WorkHandle {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// Blocks until finish() has been called; throws a copy of its error made under the handle's
  /// lock (the communication thread keeps the original). A wait that blocks is counted as
  /// exposed communication of the calling thread's phase (exposed_wait.h).
  void wait() override;
  bool is_completed() const override;
  /// Seconds the op spent running on the communication thread (0 until completed).
  double duration_s() const override;

  /// Completes the handle (once): `error` null for success. Wakes every waiter. Called by the
  /// thread that ran the op.
  void finish(std::exception_ptr error, double duration_s);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double duration_s_ = 0.0;
};

/// A Work that is already complete (for ops that finish synchronously, e.g. world size 1).
WorkPtr completed_work();

}  // namespace fsdp::comm
