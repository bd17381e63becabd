// What collectives cost a training pass they run beside (internal to fsdp-plan --calibrate).
#pragma once

#include <cstdint>

#include "fsdp/comm/process_group.h"
#include "plan/calibration/training_pass.h"
#include "plan/calibration/work_timer.h"

namespace apps::plan::calibration {

// [Note: collectives beside compute] What a collective costs a training step where communication
// shares the compute cores. Each rank's communication thread runs `count` collectives of `kind`
// (fp32, each the size of the model's largest reduce-scatter at this world size, within 4 to 64 MiB:
// a collective's speed and its cost to compute change with its size, and the model's messages are
// what a step sends; over a pool of up to 16 buffer pairs, at most ~256 MiB, used in turn) beside a
// training pass
// as the engine's run: all-gathers issued at the start of its forward, reduce-scatters and
// all-reduces at the start of its backward; all ranks at once. The wall time until both the pass
// and the collectives are done, minus the pass alone, is what the collectives added; over their
// time alone (`op_alone_s` each, from the measured points) it is the shared-core factor (profile.h
// CollectiveLinks::shared_core_factor). `count` makes the collectives' time alone about half of
// the pass (of its backward for the reductions), as in a step, so that the difference stands well
// above the pass's own spread. The pass alone and the pass with collectives alternate (the
// machine's speed drifts); the median of 5 such pairs' differences after a warm-up pair; the
// slowest rank's. Where compute oversubscribes the cores the same runs give the duration factor:
// the collectives' own seconds on their thread beside the pass over their time alone.
struct BesideCompute {
  double shared_core_factor = 1.0;  ///< seconds added to the pass per second alone
  double duration_factor = 1.0;     ///< seconds on the communication thread per second alone
};
/// Measures BesideCompute for collectives of `kind` of `logical_bytes` each, which take `op_alone_s`
/// seconds alone, beside `pass` ([Note: collectives beside compute]). Blocking; collective.
BesideCompute beside_compute(WorkTimer& timer, fsdp::comm::CollectiveKind kind, int64_t logical_bytes,
                             double op_alone_s, TrainingPass& pass);

}  // namespace apps::plan::calibration
