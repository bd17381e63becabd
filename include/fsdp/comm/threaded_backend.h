// In-process backend: N ranks as N threads of one process, for fast tests of many ranks.
#pragma once

#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// ProcessGroupOptions::from_env() with abort_after_timeout off (one process holds every rank).
inline ProcessGroupOptions threaded_defaults() {
  ProcessGroupOptions o = ProcessGroupOptions::from_env();
  o.abort_after_timeout = false;
  return o;
}

/// A world of world_size ranks whose ops exchange tensors through shared memory; element r is rank
/// r's group. Same semantics, call-order rule and validation as the MPI backend (CPU tensors, sums
/// in rank order so that all ranks see bitwise the same all-reduce). A rank is typically driven by
/// one std::thread; each group also runs its ops on its own communication thread. Not collective
/// (one call creates every rank). Default options: FSDP_COLLECTIVE_TIMEOUT_S and
/// FSDP_FLIGHT_RECORDER_DIR apply, but a timeout fails the ops without aborting the process.
/// Throws fsdp::Error for world_size < 1.
std::vector<ProcessGroupPtr> threaded_world(int world_size, ProcessGroupOptions options = threaded_defaults());

}  // namespace fsdp::comm
