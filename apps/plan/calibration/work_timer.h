// Timing a piece of compute-thread work on every rank of a calibration at once (internal to
// fsdp-plan --calibrate).
#pragma once

#include <functional>

#include "fsdp/comm/process_group.h"

namespace apps::plan::calibration {

// [Note: timing together] Seconds of a piece of compute-thread work (a training pass, copies, a
// step update), all ranks at once. Where the ranks' compute threads oversubscribe the cores
// (`together`), what one rank's clock says of its own work depends on which ranks the scheduler
// ran meanwhile (a 16 MiB copy timed per rank measured 6 to 20 GB/s in five calibrations of micro
// at N = 4 on 2 cores), while a step's collectives keep its ranks together: there the work runs
// from one barrier to the next on every rank and its seconds are that interval less an empty
// interval's (the median of 9). Elsewhere each rank times its own work. Work that no collective
// ends in a step (the step update: the next collective comes in the next forward or backward)
// is timed by seconds_to_own_end instead ([Note: step update calibration]). Blocking; collective
// when `together` (every rank calls it the same number of times).
class WorkTimer {
 public:
  /// `together`: the ranks' compute threads oversubscribe the cores (time from barrier to barrier,
  /// less an empty interval: the median of 9 measured here, collectively).
  WorkTimer(fsdp::comm::ProcessGroup& g, bool together);
  /// Seconds of `work`: this rank's own clock, or (together) the interval between the barriers
  /// around it less an empty interval's, at least 0.
  double seconds(const std::function<void()>& work);
  /// Seconds of `work` on this rank's clock from a start all ranks share (a barrier) to this
  /// rank's own end; a barrier after it (not timed) starts the next run together. Without
  /// `together`, as seconds().
  double seconds_to_own_end(const std::function<void()>& work);
  bool together() const { return together_; }
  fsdp::comm::ProcessGroup& group() const { return g_; }

 private:
  /// Seconds from a barrier before `work` to a barrier after it.
  double interval(const std::function<void()>& work);
  fsdp::comm::ProcessGroup& g_;
  bool together_;
  double barrier_s_ = 0.0;
};

}  // namespace apps::plan::calibration
