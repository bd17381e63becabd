#include "issue_order_executor.h"

#include "collective_check.h"
#include "fsdp/comm/exposed_wait.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"

namespace fsdp::comm::detail {

IssueOrderExecutor::IssueOrderExecutor(GroupState& group, bool threaded) : group_(group) {
  if (threaded) thread_ = std::thread([this] { loop(); });
}

IssueOrderExecutor::~IssueOrderExecutor() { stop(); }

void IssueOrderExecutor::push(Op op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CHECK(!stopping_ && thread_.joinable(), ErrorKind::kState,
               (ErrorContext{group_.rank(), op.unit, to_string(op.kind)}),
               "issued on a process group that is shutting down");
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
}

void IssueOrderExecutor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool IssueOrderExecutor::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void IssueOrderExecutor::loop() {
  // A memory budget never refuses this thread's allocations (the collective check's signatures,
  // reduction scratch): a refusal here would fail one rank's op while its peers wait in it.
  const BudgetExemptScope exempt;
  // Its waits (an op chained after another group's) are not compute's: exposed_wait.h.
  const CommunicationThreadScope communication_thread;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    run(op);
  }
}

void IssueOrderExecutor::run(Op& op) {
  const ErrorContext where{group_.rank(), op.signature.unit, to_string(op.kind)};
  if (op.after) {
    // A dependency on another group's op: its error is reported by its own Work; this op runs
    // regardless, so that every rank of this group keeps the same sequence of ops.
    try {
      op.after->wait();
    } catch (...) {
    }
    op.after.reset();
  }
  // [Note: chained ops] The op's own preparation, outside its deadline. Its failure fails this
  // rank's op once the op has run with the peers, so that none of them waits for this rank.
  std::exception_ptr before_err;
  if (op.before) {
    try {
      op.before();
    } catch (...) {
      before_err = std::current_exception();
    }
    op.before = nullptr;
  }
  const double t0 = now_s();
  group_.recorder().mark_running(op.record_id, t0);
  std::exception_ptr err;
  std::string failure;
  bool timed_out = false;
  bool abandoned = false;  // a peer's abandoned step: not a fault worth a flight-recorder dump
  try {
    {
      const std::string broken = group_.broken();
      if (!broken.empty()) {
        throw Error(ErrorKind::kTimeout, where,
                    str_cat("collective #", op.seq, " of group '", group_.name(),
                            "' not run: the group is unusable since ", broken));
      }
      const std::string diverged = group_.diverged();
      if (!diverged.empty()) {
        throw Error(ErrorKind::kMismatch, where,
                    str_cat("collective #", op.seq, " of group '", group_.name(), "' not run: ", diverged));
      }
    }
    if (group_.size() > 1) {
      // One deadline for the check (on the control channel) and the op (on the data backend).
      const double deadline_s = t0 + group_.options().timeout_s;
      group_.control().set_deadline(deadline_s);
      group_.backend().set_deadline(deadline_s);
      check_same_op(group_, op);
    } else {
      settle_alone(op);
    }
    op.fn();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kTimeout && e.message().find("the group is unusable since") == std::string::npos) {
      const std::string what =
          str_cat("collective #", op.seq, " of group '", group_.name(), "' (", describe(op.signature, &op), ", ",
                  op.bytes, " bytes) did not complete within ", group_.options().timeout_s, " s on rank ",
                  group_.rank(), " (world rank ", group_.family().root_rank, ")");
      // The record says how the op ended before on_unrecoverable writes the dump: a rank woken
      // from a stop (SIGSTOP, then the launcher's SIGCONT and SIGTERM) may be killed right after
      // that one write, and a dump showing the op still running would hide why it timed out.
      failure = e.what();
      group_.recorder().mark_done(op.record_id, now_s(), OpState::kTimedOut, failure);
      group_.on_unrecoverable(what);
      timed_out = true;
      err = std::make_exception_ptr(Error(
          ErrorKind::kTimeout, where,
          what + "; the group is unusable and the job will be aborted" + group_.flight_recorder_note()));
    } else {
      err = std::current_exception();
      abandoned = e.kind() == ErrorKind::kStepAbandoned;
    }
    failure = e.what();
  } catch (const std::exception& e) {
    err = std::current_exception();
    failure = e.what();
  } catch (...) {
    err = std::current_exception();
    failure = "unknown error";
  }
  if (before_err && !err) {
    err = before_err;
    try {
      std::rethrow_exception(before_err);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "unknown error";
    }
  }
  op.fn = nullptr;  // release the op's tensors before signalling completion
  const double t1 = now_s();
  if (!timed_out) {  // a timeout's record was marked before its dump
    group_.recorder().mark_done(op.record_id, t1, !err ? OpState::kCompleted : OpState::kFailed, failure);
  }
  if (!timed_out && err && !abandoned && failure.find("the group is unusable") == std::string::npos &&
      failure.find("not run: ranks left a step") == std::string::npos) {
    group_.dump_flight_recorder(failure);  // a mismatch or a transport failure: worth the record
  }
  if (op.counted) group_.stats().record_time(op.kind, t0, t1, op.bytes, op.seq);
  op.work->finish(err, t1 - t0);
}

}  // namespace fsdp::comm::detail
