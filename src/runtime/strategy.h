// One row of traits per sharding strategy, and the cache of the sub-groups strategies shard and
// replicate over (internal). docs/architecture.md, "Strategies".
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/options.h"

namespace fsdp::detail {

/// Which ranks a unit's rows are spread over.
enum class ShardOver {
  kWholeGroup,   ///< every rank of the fully_shard group
  kHybridGroup,  ///< hybrid_shard_group_size consecutive ranks (the whole group when 0)
  kThisRank,     ///< this rank alone: every rank holds all rows
};

/// How a unit's gradients leave it after backward.
enum class GradSync {
  kReduceScatter,  ///< reduce-scatter over the shard group at post-backward, then an all-reduce
                   ///< over the replicate group when there is one (hybrid_shard)
  kBuckets,        ///< DDP buckets all-reduced over the replicate group from AccumulateGrad hooks
};

/// What a strategy does; the unit (fsdp_unit.cpp and its unit_*.cpp) asks these instead of naming
/// strategies.
struct StrategyTraits {
  ShardingStrategy strategy;
  ShardOver shard_over;
  /// The whole fully_shard group holds the same rows and is the replicate group (no_shard), even at
  /// world size 1; otherwise the replicate group is the sub-group of equal positions, if any.
  bool replicates_over_group;
  /// The module params keep full data between steps (not counted against max_unsharded_units).
  bool keeps_full_params;
  /// Without a dtype cast the module params are the shard storage itself (all rows, no copy).
  bool params_alias_shards;
  /// Unshard all-gathers over the shard group; false: a local cast copy, no collective.
  bool gathers_params;
  /// The full params are re-gathered only when the sharded rows may have changed (zero1).
  bool lazy_gather;
  /// Default of FullyShardOptions::reshard_after_forward, and whether true is allowed.
  bool reshard_after_forward;
  bool may_reshard_after_forward;
  GradSync grad_sync;
  /// FullyShardOptions fields that apply (given to another strategy they are rejected).
  bool uses_hybrid_shard_group_size;
  bool uses_bucket_cap;
};

/// The traits row of s.
const StrategyTraits& traits_of(ShardingStrategy s);

/// Shard group size of a unit over a group of group_size ranks with these options. Throws
/// fsdp::Error (kInvalidArgument, at `where`) for options that do not apply to the strategy or
/// are out of range: hybrid_shard_group_size not dividing the group, reshard_after_forward=true
/// for a strategy that keeps full params, bucket_cap_bytes <= 0, max_unsharded_units < 1.
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

 private:
  struct Entry {
    std::weak_ptr<comm::ProcessGroup> parent, shard, replicate;
    int shard_size;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace fsdp::detail
