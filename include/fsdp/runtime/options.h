// Options of fully_shard: sharding strategy, mixed precision policy, prefetch.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace fsdp {

/// Which training state is sharded (ZeRO stages; docs/architecture.md, "Strategies").
///  kFullShard   (ZeRO-3): params, grads and optimizer state sharded; params all-gathered before
///                forward and again before backward.
///  kShardGradOp (ZeRO-2): like kFullShard but params stay unsharded from forward to the end of
///                backward (no second all-gather).
///  kNoShard    (DDP): every rank holds the full params, grads and optimizer state; gradients are
///                all-reduced (average) in buckets of at most bucket_cap_bytes, issued during backward.
///  kHybridShard: kFullShard inside shard groups of hybrid_shard_group_size consecutive ranks; the
///                reduce-scattered gradient is then all-reduced (average) across the replica groups
///                (ranks with the same position in their shard group).
///  kZero1      (ZeRO-1): full params and (transient) full grads on every rank, optimizer state and
///                fp32 master rows sharded; grads reduce-scattered, updated rows all-gathered lazily
///                at the next pre-forward (only when the sharded rows changed since the last gather).
/// Memory and traffic per strategy: docs/architecture.md, "Strategies".
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kZero1 };

/// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "zero1".
std::string to_string(ShardingStrategy s);
/// Inverse of to_string; throws fsdp::Error naming the accepted values.
ShardingStrategy parse_sharding_strategy(const std::string& name);

/// What a unit's params become on the wire of its all-gathers.
///  kNone: param_dtype's bytes (exact).
///  kInt8: block-wise int8 (ZeRO++'s qwZ, Wang et al. 2023, section 3.1): each rank quantises its
///         shard of the master params in blocks of 256 elements with one fp32 scale per block
///         (include/fsdp/comm/block_quant.h), all-gathers the int8 payload (1 + 4/256 bytes per
///         element) and decodes it into param_dtype. The master params, the gradients and the
///         optimizer state stay exact; forward and backward compute with the decoded values
///         (|error| <= max|x| / 254 per block). State dicts and checkpoints read the master shards,
///         never the decoded params.
enum class WireCodec { kNone, kInt8 };

/// "none", "int8".
std::string to_string(WireCodec c);
/// Inverse of to_string; throws fsdp::Error (kInvalidArgument) naming the accepted values.
WireCodec parse_wire_codec(const std::string& name);

/// Mixed precision policy of a unit (PyTorch FSDP2's MixedPrecisionPolicy). Unset fields mean "the
/// sharded parameter's dtype" (no cast). The sharded parameter, the sharded gradient and the
/// optimizer state always keep the dtype the module was built with (fp32 master weights).
struct MixedPrecisionPolicy {
  /// dtype of the unsharded parameters used in forward/backward and of the all-gather.
  std::optional<c10::ScalarType> param_dtype;
  /// dtype in which gradients are reduce-scattered / all-reduced.
  std::optional<c10::ScalarType> reduce_dtype;
  /// dtype the unit's floating-point outputs are cast to (none: left as computed).
  std::optional<c10::ScalarType> output_dtype;
  /// Cast the unit's floating-point tensor inputs to param_dtype before forward.
  bool cast_forward_inputs = true;
  /// dtype the unit's floating-point buffers (running statistics and other non-parameter state)
  /// are computed with during its forward (none: their own dtype). The stored buffers keep their
  /// dtype: the forward sees cast copies, whose values (statistics updated in forward) are written
  /// back afterwards, so state dicts and checkpoints keep full precision.
  std::optional<c10::ScalarType> buffer_dtype;
};

/// Default of FullyShardOptions::max_unsharded_units and ::bucket_cap_bytes.
constexpr int kDefaultMaxUnshardedUnits = 2;
constexpr int64_t kDefaultBucketCapBytes = 25 * 1024 * 1024;

/// Options of one fully_shard call.
struct FullyShardOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  /// Free the unsharded params after forward (re-gather in backward). Unset: true for kFullShard,
  /// false for kShardGradOp. The root unit never reshards after a forward run with grad enabled
  /// (its params are needed first in backward), but always after a no-grad forward.
  std::optional<bool> reshard_after_forward;
  MixedPrecisionPolicy mixed_precision;
  /// Issue the next unit's all-gather (in the last forward's order) at each pre-forward. Off by
  /// default as in PyTorch FSDP2 (one gathered unit at a time in forward); fsdp-train turns it on.
  bool forward_prefetch = false;
  /// Issue the previous unit's all-gather (reverse forward order) at each pre-backward.
  bool backward_prefetch = true;
  /// Overwrite every buffer of the tree with rank 0's values at each forward of the root in
  /// training mode (DDP's broadcast_buffers): running statistics stay equal across ranks, and
  /// checkpoints hold the same values whichever rank writes them. One broadcast per buffer dtype;
  /// none for a model without buffers. Read from the root unit.
  bool sync_buffers = true;
  /// Upper bound on units of one tree holding unsharded params at once, prefetched ones included;
  /// the root unit (unsharded through the whole step) and units whose strategy keeps full params
  /// (kNoShard, kZero1) are not counted. Prefetch is skipped when the bound is reached. A property
  /// of the tree, read from the root unit (unset there: 2). A non-root unit may leave it unset or
  /// give the root's value; another value is an fsdp::Error at the first forward. >= 1.
  std::optional<int> max_unsharded_units;
  /// kHybridShard only: ranks per shard group (consecutive ranks of the fully_shard group). Must
  /// divide the group size (fsdp::Error otherwise). 0 (default) means the whole group: one shard
  /// group, no replication, i.e. exactly kFullShard behaviour. Any other value with another
  /// strategy is an fsdp::Error (it would be ignored).
  int hybrid_shard_group_size = 0;
  /// kNoShard only: upper bound in bytes (in reduce_dtype) of one gradient all-reduce bucket (a
  /// single parameter larger than this gets a bucket of its own). > 0. Unset: 25 MiB, like DDP.
  /// Setting it with another strategy is an fsdp::Error (it would be ignored).
  std::optional<int64_t> bucket_cap_bytes;
  /// How the params travel in the unit's all-gathers (forward, backward and zero1's lazy gather).
  /// kInt8 needs a strategy that all-gathers params (not no_shard: fsdp::Error otherwise).
  WireCodec all_gather_codec = WireCodec::kNone;
  /// Reshard after forward to a node-local group (ZeRO++'s hpZ; FSDP2's reshard_after_forward=<int>):
  /// g > 0 keeps, after a forward with grad enabled, this rank's rows of the unit's params (as the
  /// forward computed with them, in param_dtype) sharded over g consecutive ranks of the shard group
  /// (one host's ranks, when the launcher places a host's ranks together), and the unit's backward
  /// all-gathers them over those g ranks only. Costs S_g x param bytes per unit from its forward to
  /// its backward (S_g: a shard over g ranks, about 1/g of the unit). 0 (default): off. g equal
  /// to the shard group size: off too (the backward gathers over that group anyway). Needs a unit
  /// that reshards after forward (full_shard, hybrid_shard; not with reshard_after_forward=false)
  /// and g dividing the shard group size: fsdp::Error otherwise. The root unit never reshards
  /// after a grad-enabled forward, so it keeps nothing.
  int reshard_after_forward_group_size = 0;
  /// How the gradients travel in the unit's reduce-scatter (ZeRO++'s qgZ, Wang et al. 2023,
  /// section 3.3). kInt8: each rank block-quantises the blocks it sends (256 elements, one float32
  /// scale per block, blocks restarting at every param, as the int8 all-gather), they move as bytes
  /// in one all-to-all, and the receiver dequantises and averages them in float32 in rank order, so
  /// each value is quantised once. With collective_host_size the host stage runs at reduce_dtype and
  /// only the cross-host stage is int8. The sharded gradients, the optimizer and hybrid_shard's
  /// replica all-reduce stay at reduce_dtype. Needs a strategy that reduce-scatters (not no_shard:
  /// fsdp::Error otherwise); a shard group of one rank has nothing on the wire.
  WireCodec reduce_scatter_codec = WireCodec::kNone;
  /// Host-aware all-gathers and reduce-scatters ([Note: host-aware collectives]): with h > 0 the
  /// shard group's ranks are taken as hosts of h consecutive ranks, and each of the unit's
  /// all-gathers runs in two stages, across hosts among the ranks of equal place on each host, then
  /// inside the host; each reduce-scatter inside the host first (the host's average of the blocks
  /// of its place on every host), then across hosts; so a byte crosses a host link once per host pair instead of
  /// once per rank. The stages chain on the communication threads (the compute thread never waits
  /// in between). 0 (default): off. h of 1 or of the shard group size: off too (one stage is the
  /// whole collective). h must divide the shard group size: fsdp::Error otherwise. The node-local
  /// reshard's backward gathers already stay inside the node and are unchanged.
  int collective_host_size = 0;
};

}  // namespace fsdp
