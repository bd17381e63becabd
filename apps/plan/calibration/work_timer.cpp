#include "plan/calibration/work_timer.h"

#include <algorithm>
#include <vector>

#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {

using fsdp::comm::now_s;

WorkTimer::WorkTimer(fsdp::comm::ProcessGroup& g, bool together) : g_(g), together_(together) {
  if (!together_) return;
  std::vector<double> empty;
  for (int r = 0; r < 9; ++r) empty.push_back(interval([] {}));
  barrier_s_ = median(empty);
}

double WorkTimer::seconds(const std::function<void()>& work) {
  if (!together_) {
    const double t0 = now_s();
    work();
    return now_s() - t0;
  }
  return std::max(0.0, interval(work) - barrier_s_);
}

double WorkTimer::seconds_to_own_end(const std::function<void()>& work) {
  if (!together_) return seconds(work);
  g_.barrier()->wait();
  const double t0 = now_s();
  work();
  const double d = now_s() - t0;
  g_.barrier()->wait();
  return d;
}

double WorkTimer::interval(const std::function<void()>& work) {
  g_.barrier()->wait();
  const double t0 = now_s();
  work();
  g_.barrier()->wait();
  return now_s() - t0;
}

}  // namespace apps::plan::calibration
