// The validation of a unit's options against its strategy's traits, and the cache of the
// sub-groups strategies shard and replicate over (internal). docs/architecture.md, "Strategies".
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/strategy_traits.h"

namespace fsdp::detail {

// The traits table is public (fsdp/runtime/strategy_traits.h): the planner reads the same rows.
using fsdp::GradSync;
using fsdp::ShardOver;
using fsdp::StrategyTraits;
using fsdp::traits_of;

/// Shard group size of a unit over a group of group_size ranks with these options. Throws
/// fsdp::Error (kInvalidArgument, at `where`) for options that do not apply to the strategy or
/// are out of range: hybrid_shard_group_size not dividing the group, reshard_after_forward=true
/// for a strategy that keeps full params, bucket_cap_bytes <= 0, max_unsharded_units < 1, an
/// all_gather_codec for a strategy that gathers nothing, a reshard_after_forward_group_size for a
/// unit that does not reshard after forward or not dividing the shard group size.
int validated_shard_size(const FullyShardOptions& options, int group_size, const ErrorContext& where);

/// The shard group (ranks holding distinct rows) and replicate group (ranks holding the same rows;
/// null when every rank's rows are distinct) of a unit.
struct UnitGroups {
  comm::ProcessGroupPtr shard;
  comm::ProcessGroupPtr replicate;
};

/// [Note: strategy sub-groups] hybrid_shard and no_shard split the data-parallel group into shard
/// groups (consecutive ranks) and replica groups (same position). split() is collective, so it runs
/// at fully_shard time, which every rank runs in the same order; the result is cached per (group,
/// shard size) and shared by every unit of that group (held weakly here, strongly by the units).
/// Entries expire together on all ranks when the units die (SPMD programs free them at the same
/// point). Thread-safe; the collective split runs outside the lock (the ranks of a threaded world
/// share one cache).
class SubGroupCache {
 public:
  /// Collective over group when the pair is not cached yet (all ranks of group call it in the same
  /// order). shard_size == group size: {group, null}; 1: {this rank alone, group}.
  UnitGroups get(const comm::ProcessGroupPtr& group, int shard_size);
  /// The group of `size` consecutive ranks of `group` holding this rank (a node-local group,
  /// [Note: node-local reshard]), without a replica split; cached per (group, size) apart from
  /// get()'s pairs. Collective over group when not cached yet. size == group size: group.
  comm::ProcessGroupPtr blocks(const comm::ProcessGroupPtr& group, int size);

 private:
  struct Entry {
    std::weak_ptr<comm::ProcessGroup> parent, shard, replicate;
    int shard_size;
  };
  struct BlockEntry {
    std::weak_ptr<comm::ProcessGroup> parent, blocks;
    int size;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<BlockEntry> block_entries_;
};

}  // namespace fsdp::detail
