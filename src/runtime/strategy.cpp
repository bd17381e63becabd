#include "strategy.h"

#include <algorithm>

namespace fsdp {
namespace {

using S = ShardingStrategy;

// strategy, shard over, replicates over group, keeps full, alias, gathers, lazy, reshard default,
// may reshard, grad sync, uses hybrid size, uses bucket cap, ZeRO stage
const StrategyTraits kTraits[] = {
    {S::kFullShard, ShardOver::kWholeGroup, false, false, false, true, false, true, true,
     GradSync::kReduceScatter, false, false, 3},
    {S::kShardGradOp, ShardOver::kWholeGroup, false, false, false, true, false, false, true,
     GradSync::kReduceScatter, false, false, 2},
    {S::kNoShard, ShardOver::kThisRank, true, true, true, false, false, false, false, GradSync::kBuckets,
     false, true, 0},
    {S::kHybridShard, ShardOver::kHybridGroup, false, false, false, true, false, true, true,
     GradSync::kReduceScatter, true, false, 3},
    {S::kZero1, ShardOver::kWholeGroup, false, true, false, true, true, false, false,
     GradSync::kReduceScatter, false, false, 1},
};

}  // namespace

int64_t shard_group_size_of(ShardingStrategy s, int64_t hybrid_shard_group_size, int64_t group_size,
                            const ErrorContext& where) {
  const StrategyTraits& t = traits_of(s);
  FSDP_CHECK(t.uses_hybrid_shard_group_size || hybrid_shard_group_size == 0, ErrorKind::kInvalidArgument,
             where, "hybrid_shard_group_size ", hybrid_shard_group_size,
             " applies to hybrid_shard only, not to strategy ", to_string(s), " (leave it 0)");
  switch (t.shard_over) {
    case ShardOver::kWholeGroup: return group_size;
    case ShardOver::kThisRank: return 1;
    case ShardOver::kHybridGroup: {
      const int64_t g = hybrid_shard_group_size;
      FSDP_CHECK(g >= 0 && (g == 0 || group_size % g == 0), ErrorKind::kInvalidArgument, where,
                 "hybrid_shard_group_size ", g, " must divide the group size ", group_size,
                 " (or be 0 for the whole group)");
      return g == 0 ? group_size : g;
    }
  }
  return group_size;
}

const StrategyTraits& traits_of(ShardingStrategy s) {
  for (const auto& t : kTraits) {
    if (t.strategy == s) return t;
  }
  throw Error(ErrorKind::kInvalidArgument, ErrorContext{}, str_cat("unknown sharding strategy ", static_cast<int>(s)));
}

}  // namespace fsdp

namespace fsdp::detail {

int validated_shard_size(const FullyShardOptions& o, int group_size, const ErrorContext& where) {
  const StrategyTraits& t = traits_of(o.strategy);
  const std::string name = to_string(o.strategy);
  FSDP_CHECK(!o.max_unsharded_units || *o.max_unsharded_units >= 1, ErrorKind::kInvalidArgument, where,
             "max_unsharded_units must be >= 1, got ", o.max_unsharded_units.value_or(0));
  FSDP_CHECK(t.may_reshard_after_forward || !o.reshard_after_forward.value_or(false),
             ErrorKind::kInvalidArgument, where, "reshard_after_forward=true contradicts strategy ",
             name, " (its full params stay on every rank)");
  FSDP_CHECK(t.uses_bucket_cap || !o.bucket_cap_bytes, ErrorKind::kInvalidArgument, where,
             "bucket_cap_bytes applies to no_shard only; strategy ", name,
             " reduces each unit's gradients in one collective (leave it unset)");
  FSDP_CHECK(!o.bucket_cap_bytes || *o.bucket_cap_bytes > 0, ErrorKind::kInvalidArgument, where,
             "bucket_cap_bytes must be > 0, got ", o.bucket_cap_bytes.value_or(0));
  FSDP_CHECK(t.gathers_params || o.all_gather_codec == WireCodec::kNone, ErrorKind::kInvalidArgument, where,
             "all_gather_codec ", to_string(o.all_gather_codec), " applies to strategies that all-gather params; ",
             name, " keeps every param on every rank (leave it none)");
  FSDP_CHECK(t.grad_sync == GradSync::kReduceScatter || o.reduce_scatter_codec == WireCodec::kNone,
             ErrorKind::kInvalidArgument, where, "reduce_scatter_codec ", to_string(o.reduce_scatter_codec),
             " applies to strategies that reduce-scatter gradients; ", name,
             " all-reduces them in buckets (leave it none)");
  FSDP_CHECK(o.collective_host_size == 0 || t.grad_sync == GradSync::kReduceScatter, ErrorKind::kInvalidArgument,
             where, "collective_host_size ", o.collective_host_size, " applies to strategies that all-gather params and ",
             "reduce-scatter gradients; ", name, " all-reduces them in buckets (leave it 0)");
  const int shard_size = static_cast<int>(shard_group_size_of(o.strategy, o.hybrid_shard_group_size, group_size, where));
  FSDP_CHECK(o.collective_host_size >= 0 && (o.collective_host_size == 0 || shard_size % o.collective_host_size == 0),
             ErrorKind::kInvalidArgument, where, "collective_host_size ", o.collective_host_size,
             " must divide the shard group size ", shard_size, " (or be 0: off)");
  if (o.reshard_after_forward_group_size != 0) {
    const int g = o.reshard_after_forward_group_size;
    FSDP_CHECK(o.reshard_after_forward.value_or(t.reshard_after_forward), ErrorKind::kInvalidArgument, where,
               "reshard_after_forward_group_size ", g, " applies to units that reshard after forward (full_shard, ",
               "hybrid_shard); strategy ", name,
               o.reshard_after_forward ? " with reshard_after_forward=false" : "", " keeps its params until backward");
    FSDP_CHECK(g > 0 && shard_size % g == 0, ErrorKind::kInvalidArgument, where, "reshard_after_forward_group_size ", g,
               " must divide the shard group size ", shard_size, " (or be 0: off)");
  }
  return shard_size;
}

UnitGroups SubGroupCache::get(const comm::ProcessGroupPtr& group, int shard_size) {
  const int n = group->size();
  if (shard_size == n) return {group, nullptr};
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [](const Entry& e) { return e.parent.expired() || e.shard.expired(); }),
                   entries_.end());
    for (const auto& e : entries_) {
      if (e.shard_size != shard_size || e.parent.lock() != group) continue;
      auto shard = e.shard.lock();
      auto replicate = shard_size == 1 ? group : e.replicate.lock();
      if (shard && replicate) return {shard, replicate};
    }
  }
  comm::ProcessGroupPtr shard = group->split_blocks(shard_size, /*strided=*/false);
  comm::ProcessGroupPtr replicate = shard_size == 1 ? group : group->split_blocks(shard_size, /*strided=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({group, shard, shard_size == 1 ? nullptr : replicate, shard_size});
  return {shard, replicate};
}

comm::ProcessGroupPtr SubGroupCache::blocks(const comm::ProcessGroupPtr& group, int size) {
  if (size == group->size()) return group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    block_entries_.erase(std::remove_if(block_entries_.begin(), block_entries_.end(),
                                        [](const BlockEntry& e) { return e.parent.expired() || e.blocks.expired(); }),
                         block_entries_.end());
    for (const auto& e : block_entries_) {
      if (e.size != size || e.parent.lock() != group) continue;
      if (auto b = e.blocks.lock()) return b;
    }
  }
  comm::ProcessGroupPtr b = group->split_blocks(size, /*strided=*/false);
  std::lock_guard<std::mutex> lock(mu_);
  block_entries_.push_back({group, b, size});
  return b;
}

}  // namespace fsdp::detail
