// Helpers shared by the planner's unit tests (test_planner*.cpp).
#pragma once

#include <cstdint>

#include "fsdp/planner/setup.h"

namespace planner_test {

/// A parallelism of `world_size` ranks with `strategy`; hybrid_shard's group size
/// `hybrid_shard_group_size` (0: the planner's default), `ranks_per_node` (0: the profile's).
inline fsdp::planner::Parallelism par(fsdp::ShardingStrategy strategy, int64_t world_size,
                                      int64_t hybrid_shard_group_size = 0, int64_t ranks_per_node = 0) {
  fsdp::planner::Parallelism p;
  p.strategy = strategy;
  p.world_size = world_size;
  p.hybrid_shard_group_size = strategy == fsdp::ShardingStrategy::kHybridShard ? hybrid_shard_group_size : 0;
  p.ranks_per_node = ranks_per_node;
  return p;
}

}  // namespace planner_test
