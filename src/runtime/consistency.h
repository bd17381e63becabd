// The cross-rank check that every rank builds the same unit (internal).
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp::detail {

/// Collective and blocking over group: every rank passes a description of what it is about to do,
/// one line per item (e.g. "h.0.weight [4, 8] Float trainable"); any difference from another
/// rank throws fsdp::Error (kMismatch, at `where`) on every rank, naming the first differing line
/// of this rank and of the other rank, and `remedy`, before any training collective could hang.
void check_same_on_every_rank(comm::ProcessGroup& group, const ErrorContext& where,
                              const std::vector<std::string>& lines, const std::string& remedy);

}  // namespace fsdp::detail
