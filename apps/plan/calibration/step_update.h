// The step update's seconds per tensor (internal to fsdp-plan --calibrate).
#pragma once

#include <vector>

#include "fsdp/planner/profile.h"
#include "fsdp/planner/setup.h"
#include "plan/calibration/work_timer.h"

namespace apps::plan::calibration {

// [Note: step update calibration] Seconds of the step update of one fp32 tensor by its size
// (profile.h step_update_points_*), for an optimizer: for each size, a set of tensors of that size
// (2^20 elements in all, at least one tensor) with gradients; as fsdp-train runs them after
// backward, tensor by tensor, the 2-norm (fsdp::sum_of_squares, as clip_grad_norm) and the clip scale (the
// gradients' own finite check runs only when the norm is not finite: not timed); then the
// optimizer's step and zero_grad (set to none). Before each timed run the caches are
// flushed (a 128 MiB buffer is written), as a step's forward and backward leave them; all ranks at
// once, median of 5 after a warm-up (9 where compute oversubscribes the cores); seconds per
// tensor = the run / the tensors. Each rank's own time, from a start all ranks share to its own
// end (WorkTimer::seconds_to_own_end): no collective ends a step's update, so each rank leaves it
// at its own pace. The slowest rank's where each rank computes on cores of its own; the mean over
// ranks where compute time-shares the cores ([Note: timing together]): there a rank that finishes
// later got less of the cores because the others got more, and what the step pays is the cores'
// total work, which the mean counts (the slowest of 4 noisy ranks over-counts it: micro's update
// at N = 4 on 2 cores was timed 10-17 ns per element from barrier to barrier, slowest rank, and
// took 8 in training).
/// Blocking; collective.
std::vector<fsdp::planner::UpdatePoint> step_update_points(fsdp::planner::OptimizerKind kind, WorkTimer& timer);

}  // namespace apps::plan::calibration
