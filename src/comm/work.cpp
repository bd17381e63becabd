#include "fsdp/comm/work.h"

#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/exposed_wait.h"
#include "fsdp/common/check.h"

#include <typeinfo>

namespace fsdp::comm {

namespace {

// A copy of the exception `error` holds, owned by the calling thread alone. The op's exception
// object was thrown on the communication thread and stays referenced by the Work (and so by the
// communication thread's Op); rethrowing it as is would hand one object to two threads, whose
// reference count lives in uninstrumented runtime code: a thread sanitizer then reports its
// release on one thread against the waiter's reads. Called with the Work's lock held.
std::exception_ptr thread_own_copy(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // A subclass (fsdp::OutOfMemory) is never thrown on the communication thread, which is
    // exempt from the memory budget; were one to arrive, it is passed on whole, not sliced.
    if (typeid(e) == typeid(Error)) return std::make_exception_ptr(Error(e));
    return error;
  } catch (...) {
    return error;  // not ours (the ops throw fsdp::Error): shared, as std::rethrow_exception does
  }
}

}  // namespace

void Work::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {  // blocking: communication the caller's compute did not hide (exposed_wait.h)
    const double start_s = now_s();
    cv_.wait(lock, [this] { return done_; });
    const std::exception_ptr error = error_ ? thread_own_copy(error_) : nullptr;
    lock.unlock();
    record_blocking_wait(start_s, now_s());
    if (error) std::rethrow_exception(error);
    return;
  }
  if (!error_) return;
  const std::exception_ptr error = thread_own_copy(error_);
  lock.unlock();
  std::rethrow_exception(error);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

double Work::duration_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return duration_s_;
}

void Work::finish(std::exception_ptr error, double duration_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
    duration_s_ = duration_s;
  }
  cv_.notify_all();
}

WorkPtr completed_work() {
  auto w = std::make_shared<Work>();
  w->finish(nullptr, 0.0);
  return w;
}

}  // namespace fsdp::comm
