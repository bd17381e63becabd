// Values agreed over the ranks of a calibration (internal to fsdp-plan --calibrate): the slowest
// rank's, the fastest's, the mean, and the median of a run's samples.
#pragma once

#include <vector>

#include "fsdp/comm/process_group.h"

namespace apps::plan::calibration {

/// The slowest rank's value of every entry (a max all-reduce of doubles); with `min`, the smallest
/// (for rates: the slowest rank's rate). Blocking; collective (every rank passes as many entries).
std::vector<double> across_ranks(fsdp::comm::ProcessGroup& g, std::vector<double> v, bool min);

/// The mean over ranks of every entry (an average all-reduce). Blocking; collective.
std::vector<double> mean_across_ranks(fsdp::comm::ProcessGroup& g, const std::vector<double>& v);

/// The median of `v` (the upper one of an even count); `v` must not be empty.
double median(std::vector<double> v);

}  // namespace apps::plan::calibration
