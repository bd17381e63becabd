// The FSDP side of activation checkpointing (internal): which unit uses an activation-checkpointed
// region's forward made, so that its recompute in backward replays exactly those uses.
// docs/architecture.md, "[Note: activation checkpointing]".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp {
class FSDPUnit;

namespace detail {

/// The unit uses of one region's forward, in order: (unit, its index in the tree's forward order).
/// Recorded by FSDPUnit::pre_forward during the region's forward (grad disabled), replayed by
/// FSDPUnit::pre_forward_recompute during the recompute in backward. One thread.
struct CheckpointRegion {
  struct Use {
    std::weak_ptr<FSDPUnit> unit;
    int64_t forward_index = 0;
  };
  std::vector<Use> uses;
  size_t next = 0;  // the next use to replay

  /// Queues the end-of-backward callback of the recorded units' tree (on the backward pass that
  /// runs the caller: the outer one, before the recompute's nested backward starts).
  void ensure_final_callback() const;
};

/// Replays the region's next use: checks that it is `unit` (fsdp::Error kState at `where`
/// otherwise: the recompute took another path than the forward) and returns its forward index.
int64_t take_replayed_use(CheckpointRegion& region, const FSDPUnit& unit, const ErrorContext& where);

/// The region whose forward records now (nullptr outside a region's forward) / whose recompute
/// replays now (nullptr outside a recompute). At most one of them is set on a thread.
CheckpointRegion* recording_region();
CheckpointRegion* replaying_region();

/// Sets the thread's recording (or replaying) region for the scope's lifetime. Throws fsdp::Error
/// (kUnsupported) when a region is already active on this thread (nested checkpointing).
class RegionScope {
 public:
  enum class Mode { kRecord, kReplay };
  RegionScope(CheckpointRegion& region, Mode mode);
  ~RegionScope();
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;
};

}  // namespace detail
}  // namespace fsdp
