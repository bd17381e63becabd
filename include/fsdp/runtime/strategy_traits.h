// One row of traits per sharding strategy: what each shards, gathers and reduces, read by the
// runtime's units and by the planner alike (docs/architecture.md, "Strategies").
#pragma once

#include <cstdint>

#include "fsdp/common/check.h"
#include "fsdp/runtime/options.h"

namespace fsdp {

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

/// What a strategy does: the unit (src/runtime) and the planner (src/planner) ask these instead of
/// naming strategies.
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
  /// The stage of the ZeRO paper (Rajbhandari et al. 2020, section 5) whose model-state formula
  /// describes the strategy: 0 (DDP: nothing sharded), 1 (optimizer state), 2 (and gradients),
  /// 3 (and parameters). hybrid_shard is stage 3 within its shard group.
  int zero_stage;
};

/// The traits row of s. Throws fsdp::Error (kInvalidArgument) for a value outside the enum.
const StrategyTraits& traits_of(ShardingStrategy s);

/// The shard group size of strategy s over group_size ranks: group_size (full_shard,
/// shard_grad_op, zero1), 1 (no_shard), or hybrid_shard_group_size (0: the whole group) for
/// hybrid_shard. The one rule the runtime's units and the planner both apply. Throws fsdp::Error
/// (kInvalidArgument, at `where`) when hybrid_shard_group_size is given to another strategy, is
/// negative, or does not divide group_size.
int64_t shard_group_size_of(ShardingStrategy s, int64_t hybrid_shard_group_size, int64_t group_size,
                            const ErrorContext& where);

/// A strategy that gathers a unit's params once per step and keeps them through its backward
/// (shard_grad_op): sharded at rest, not resharded after forward.
inline bool gathers_once_per_step(const StrategyTraits& t) {
  return t.gathers_params && !t.keeps_full_params && !t.reshard_after_forward;
}

}  // namespace fsdp
