// Timing the collectives of a calibration (internal to fsdp-plan --calibrate): one collective as
// the engine issues it, its seconds at a size, and the sizes a calibration times.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/setup.h"

namespace apps::plan::calibration {

/// Issues one collective of `kind` over (world x S) `big` and (S) `small`, as the engine does: the
/// reductions average (a sum, then a division on the communication thread). Non-blocking.
fsdp::comm::WorkPtr issue_collective(fsdp::comm::ProcessGroup& g, fsdp::comm::CollectiveKind kind,
                                     const at::Tensor& big, const at::Tensor& small);

/// This rank's seconds of one collective of `bytes` logical bytes (fp32, a whole multiple of the
/// world size of elements), measured `reps` times after a warm-up, each after a barrier.
/// Blocking; collective.
std::vector<double> time_collective(fsdp::comm::ProcessGroup& g, fsdp::comm::CollectiveKind kind, int64_t bytes,
                                    int reps);

// [Note: collective sizes] The logical bytes the collectives are timed at: a grid (4 KiB to 32 MiB)
// and the model's own messages at this world size and the step's precision (each unit's all-gather
// and reduce-scatter, no_shard's buckets), up to kMaxCollectiveBytes.
// The time model interpolates between the points (time_model.h collective_time_s): a machine's
// collectives are not one line (Open MPI's reduce-scatter over 4 ranks on 2 cores ran 1.4 GB/s at
// 12 MiB and 0.5 GB/s at 16 MiB), so the sizes a step sends are measured, not extrapolated. A
// model message within 5% of a size already in the list is left out. Ascending.
std::vector<int64_t> collective_sizes(const fsdp::planner::ModelSpec& m, const fsdp::planner::StepSetup& step,
                                      int64_t n);

}  // namespace apps::plan::calibration
