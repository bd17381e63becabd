// The matmul rates of a calibration (internal to fsdp-plan --calibrate).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "fsdp/comm/process_group.h"
#include "fsdp/planner/model_spec.h"

namespace apps::plan::calibration {

/// FLOP/s of at::mm(x (rows, in), w (out, in)^T) in `dtype` over the forward matmul shapes of one
/// block and the head of `m` (a parameter-count model: one 1024 x 1024 layer), each weighted by
/// its FLOPs in the model; all ranks at once, the slowest rank's rate. Blocking; collective.
double matmul_rate(const fsdp::planner::ModelSpec& m, int64_t rows, at::ScalarType dtype,
                   fsdp::comm::ProcessGroup& g);

}  // namespace apps::plan::calibration
