// In-process backend: N ranks as N threads of one process, for fast tests of many ranks.
#pragma once

#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// A world of world_size ranks whose ops exchange tensors through shared memory; element r is rank
/// r's group. Same semantics, call-order rule and validation as the MPI backend (CPU tensors, sums
/// in rank order so that all ranks see bitwise the same all-reduce). A rank is typically driven by
/// one std::thread; each group also runs its ops on its own communication thread. Not collective
/// (one call creates every rank). Throws fsdp::Error for world_size < 1.
std::vector<ProcessGroupPtr> threaded_world(int world_size);

}  // namespace fsdp::comm
