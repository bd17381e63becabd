// The profile file's shared names (internal to the planner): the context its errors carry, the
// JSON keys of the collective kinds and optimizers, and the bounds of its figures. Read and written
// by profile_json.cpp and profile_from_json.cpp; docs/planner.md, "Profile file".
#pragma once

#include <cstdint>

#include "fsdp/common/check.h"
#include "fsdp/planner/profile.h"

namespace fsdp::planner::profile_file {

/// The context of every error about a profile ("planner profile").
inline const ErrorContext kWhere{-1, "", "planner profile"};

/// The collective kinds' keys, in CollectiveKind order: all_gather, reduce_scatter, all_reduce.
inline const char* const kKinds[] = {"all_gather", "reduce_scatter", "all_reduce"};
/// The optimizers' keys, in OptimizerKind order: adamw, sgd-momentum, sgd.
inline const char* const kOptimizerKeys[] = {"adamw", "sgd-momentum", "sgd"};

// Upper bounds of a profile's figures: well past any machine, so that an edited file cannot make
// the time model overflow (one collective step or one tensor's update within an hour; a rate
// below 1e18 per second; memory below 1 EiB).
inline constexpr double kMaxSeconds = 3600.0;
inline constexpr double kMaxRate = kMaxProfileRatePerS;
inline constexpr int64_t kMaxBytes = int64_t{1} << 60;
inline constexpr int64_t kMaxNumel = int64_t{1} << 50;
inline constexpr double kMaxSharedCoreFactor = 1000.0;
inline constexpr int64_t kMaxRanks = int64_t{1} << 20;

}  // namespace fsdp::planner::profile_file
