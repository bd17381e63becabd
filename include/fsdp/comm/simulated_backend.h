// Simulated backend: one rank of an N-rank job in a single process, with no memory and no
// communication, for dry runs of the engine's layout and accounting (layer 1).
#pragma once

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// A group of `world_size` ranks of which this process plays rank `rank`; the other ranks do not
/// exist. Its device is the meta device: tensors carry shapes and dtypes but no values, so every
/// collective on meta tensors completes at once and moves nothing (its logical bytes are still
/// counted in stats()). CPU tensors, which only the library's own metadata exchanges use, follow
/// one rule: the simulated ranks run this same program, so an all-gather of a CPU tensor returns
/// this rank's input in every block (the cross-rank consistency checks and the collective check
/// then pass, as they would in a job whose ranks are built alike); every other collective of a
/// CPU tensor needs the other ranks' values and throws fsdp::Error (kUnsupported) naming the op.
/// split_blocks() works (its groups follow from the rank); all ranks count as one host; split(color, key) throws
/// fsdp::Error (kUnsupported): the other ranks' colors are unknown.
/// Not collective. Throws fsdp::Error (kInvalidArgument) unless 1 <= world_size and
/// 0 <= rank < world_size.
ProcessGroupPtr simulated_world(int world_size, int rank = 0,
                                ProcessGroupOptions options = ProcessGroupOptions::from_env());

/// The backend under simulated_world(world_size, rank): rank `rank` of a simulated group, by
/// the rules above. Also a control channel for a single-process stand-in of a group in tests
/// (its all-gather of CPU bytes returns this rank's input in every block, so the collective
/// check passes). Not collective. Throws fsdp::Error (kInvalidArgument) as simulated_world.
std::unique_ptr<Backend> simulated_backend(int world_size, int rank = 0);

}  // namespace fsdp::comm
