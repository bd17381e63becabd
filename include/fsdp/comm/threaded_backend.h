// In-process backend: N ranks as N threads of one process, for fast tests of many ranks.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// ProcessGroupOptions::from_env() with abort_after_timeout off (one process holds every rank).
inline ProcessGroupOptions threaded_defaults() {
  ProcessGroupOptions o = ProcessGroupOptions::from_env();
  o.abort_after_timeout = false;
  return o;
}

/// A world of world_size ranks on one host whose ops exchange tensors through shared memory; element r is rank
/// r's group. Same semantics, call-order rule and validation as the MPI backend (CPU tensors, sums
/// in rank order so that all ranks see bitwise the same all-reduce). A rank is typically driven by
/// one std::thread; each group also runs its ops on its own communication thread. Not collective
/// (one call creates every rank). Default options: FSDP_COLLECTIVE_TIMEOUT_S and
/// FSDP_FLIGHT_RECORDER_DIR apply, but a timeout fails the ops without aborting the process.
/// Throws fsdp::Error for world_size < 1.
std::vector<ProcessGroupPtr> threaded_world(int world_size, ProcessGroupOptions options = threaded_defaults());

/// threaded_world(world_size, options) whose ranks pretend to sit on world_size / ranks_per_host
/// hosts: ranks 0..ranks_per_host-1 on host 0, and so on (ProcessGroup::host_of_ranks, the host
/// split of CommStats). Throws fsdp::Error unless ranks_per_host >= 1 divides world_size.
std::vector<ProcessGroupPtr> threaded_world(int world_size, int ranks_per_host,
                                            ProcessGroupOptions options = threaded_defaults());

/// The backends of one in-process world of world_size ranks (element r: rank r's), with hosts as
/// in threaded_world(world_size, ranks_per_host); what threaded_world wraps, for tests that build
/// a ProcessGroup over a backend of their own (e.g. one that counts the calls it forwards). Each
/// backend's make_control_channel() is collective over the world's ranks (call it from every
/// rank's thread). Not collective. Throws fsdp::Error (kInvalidArgument) for world_size < 1 or
/// a ranks_per_host that does not divide it.
std::vector<std::unique_ptr<Backend>> threaded_backends(int world_size, int ranks_per_host);

}  // namespace fsdp::comm
