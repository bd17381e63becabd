// This machine as a calibration sees it (internal to fsdp-plan --calibrate): the copy rate, the
// cores the ranks may run on, the ranks on this node.
#pragma once

#include <cstdint>

#include "fsdp/comm/process_group.h"
#include "plan/calibration/work_timer.h"

namespace apps::plan::calibration {

// Bytes read + written per second by at::Tensor::copy_ of a 16 MiB fp32 tensor into another (a
// unit's size: the engine copies a unit at a time), 4 at a time, caches flushed before each run
// (a 128 MiB buffer is written: a step's compute leaves them full of other data), all ranks at
// once, timed by `timer` ([Note: timing together]), median of 9 after a warm-up, the slowest rank.
/// Blocking; collective.
double memory_copy_rate(WorkTimer& timer);

// The cores the ranks may run on together: the union of every rank's affinity mask (mpirun binds
// each of two ranks to a core of its own by default: each rank's own mask then holds 1 core, the
// node's ranks 2). Collective: every rank calls it.
int64_t cores_available(fsdp::comm::ProcessGroup& g);

/// The ranks on this node: the launcher's OMPI_COMM_WORLD_LOCAL_SIZE (torchrun: LOCAL_WORLD_SIZE), else every rank of `world`.
int64_t ranks_on_this_node(int64_t world);

}  // namespace apps::plan::calibration
