// IssueOrderExecutor: runs a CPU group's ops one at a time in issue order, on the group's
// communication thread (or inline for a group of one rank), each under its deadline, with the
// flight recorder and the stats told when it starts and ends (internal).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "group_state.h"

namespace fsdp::comm::detail {

/// The executor of the blocking backends (MPI, threads, Gloo). [Note: issue order] The ops of a
/// group run in the order they were pushed; the caller pushes under its own lock right after
/// numbering an op, so issue order is sequence order. For each op, run() waits for the op's
/// dependency (its `after`), refuses it when the group is unusable or diverged, sets the
/// deadline of the data backend and of the control channel (now + timeout_s), runs the
/// collective check on the control channel (two or more ranks), then the op's fn; it records start and end in the flight recorder, the time in the stats, turns a
/// timeout into an unusable group (dump, abort armed), dumps the recorder on a mismatch or a
/// transport failure, releases the op's tensors, and completes the op's Work last.
class IssueOrderExecutor {
 public:
  /// threaded: start the communication thread (groups of two or more ranks); otherwise push()
  /// is not used and the caller runs each op inline through run().
  IssueOrderExecutor(GroupState& group, bool threaded);
  /// stop(), if not called before.
  ~IssueOrderExecutor();
  IssueOrderExecutor(const IssueOrderExecutor&) = delete;
  IssueOrderExecutor& operator=(const IssueOrderExecutor&) = delete;

  /// Queues `op` behind every op pushed before it. Non-blocking. Throws fsdp::Error (kState)
  /// after stop().
  void push(Op op);
  /// Runs `op` on the calling thread (blocking) and completes its Work; never throws (the
  /// op's error goes to its Work).
  void run(Op& op);
  /// Runs every queued op, then joins the thread. Blocking; idempotent.
  void stop();
  /// True once stop() has begun: no op may be pushed.
  bool stopping() const;

 private:
  void loop();

  GroupState& group_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;  // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace fsdp::comm::detail
