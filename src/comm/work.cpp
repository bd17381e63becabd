#include "fsdp/comm/work.h"

#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/exposed_wait.h"

namespace fsdp::comm {

void Work::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {  // blocking: communication the caller's compute did not hide (exposed_wait.h)
    const double start_s = now_s();
    cv_.wait(lock, [this] { return done_; });
    const std::exception_ptr error = error_;
    lock.unlock();
    record_blocking_wait(start_s, now_s());
    if (error) std::rethrow_exception(error);
    return;
  }
  if (error_) std::rethrow_exception(error_);
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
