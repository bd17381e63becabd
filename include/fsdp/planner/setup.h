// What the planner is asked about (pure math): how the model is sharded and what one training
// step does. docs/planner.md, "Inputs".
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/runtime/options.h"

namespace fsdp::planner {

/// Mixed precision as fsdp-train's --mixed-precision sets it: param_dtype = reduce_dtype = the
/// named dtype; the sharded master params, sharded grads and optimizer state stay fp32.
enum class Precision { kFp32, kBf16, kFp16 };
/// "fp32", "bf16", "fp16".
std::string to_string(Precision p);
/// Inverse of to_string; throws fsdp::Error (kInvalidArgument) naming the accepted values.
Precision parse_precision(const std::string& name);
/// Bytes per element of the unsharded params, the all-gather and the activations: 4 or 2.
int64_t param_bytes_per_elem(Precision p);
/// Bytes per element of the gradient reduction (reduce_dtype): 4 or 2.
int64_t reduce_bytes_per_elem(Precision p);

struct StepSetup;
struct UnitSpec;
/// Logical bytes of one unit's all-gather (its output) over a shard group of `shard_group_size`
/// ranks, each contributing its padded shard of every param (S elements): G x S x param bytes, or
/// with the int8 codec G x comm::int8_payload_bytes(the params' padded shards) (blocks restart at
/// every param; the engine's CommStats count exactly this).
int64_t all_gather_bytes(const StepSetup& setup, const UnitSpec& unit, int64_t shard_group_size);

/// The int8 all-to-all that replaces a reduce-scatter over `ranks` ranks (StepSetup::
/// reduce_scatter_codec): ranks x comm::int8_payload_bytes(segments), the segments being the
/// padded shard numel of each trainable param of `unit` over `shard_group_size` ranks (the engine's
/// reduce layout); 0 for a unit without trainable params.
int64_t int8_reduce_bytes(const UnitSpec& unit, int64_t shard_group_size, int64_t ranks);

/// The optimizer, for its state per trainable element (the engine's optimizer-state adapter).
enum class OptimizerKind {
  kAdamW,        ///< exp_avg + exp_avg_sq: 8 bytes per element (fp32)
  kSgdMomentum,  ///< momentum_buffer: 4 bytes per element
  kSgd,          ///< no state
};
/// "adamw", "sgd-momentum", "sgd".
std::string to_string(OptimizerKind o);
/// Inverse of to_string (also "adam"); throws fsdp::Error (kInvalidArgument).
OptimizerKind parse_optimizer(const std::string& name);
/// fp32 state bytes per trainable element: 8, 4 or 0.
int64_t optimizer_bytes_per_elem(OptimizerKind o);

/// How the units are sharded over the ranks.
struct Parallelism {
  fsdp::ShardingStrategy strategy = fsdp::ShardingStrategy::kFullShard;
  int64_t world_size = 1;
  /// hybrid_shard only: ranks per shard group (must divide world_size); 0 = the whole group.
  int64_t hybrid_shard_group_size = 0;
  /// Ranks per node (for intra- vs inter-node links); 0 = all ranks on one node.
  int64_t ranks_per_node = 0;
  /// full_shard, hybrid_shard: reshard after forward to g consecutive ranks
  /// (FullyShardOptions::reshard_after_forward_group_size, ZeRO++'s hpZ): each non-root unit keeps
  /// a shard over g ranks (param dtype) from its forward to its backward, whose all-gather runs over
  /// those g ranks (GroupKind::kNode). 0 = off; the shard group size: off as well.
  int64_t reshard_after_forward_group_size = 0;
  /// g when the node-local reshard is active (0 < g < shard_group_size()), else 0.
  int64_t node_group_size() const;
  /// Host-aware all-gathers and reduce-scatters (FullyShardOptions::collective_host_size): with h
  /// ranks per host, each all-gather runs across hosts (GroupKind::kCrossHost, G/h ranks) then inside
  /// the host (GroupKind::kHost, h ranks), each reduce-scatter inside the host then across hosts.
  /// 0 = off; 1 or the shard group size: off as well. Only with strategies that reduce-scatter.
  int64_t collective_host_size = 0;
  /// h when the host-aware collectives are active (1 < h < shard_group_size()), else 0.
  int64_t host_stage_size() const;

  /// Ranks a unit's rows are spread over: 1 (no_shard), G (hybrid_shard), else world_size.
  int64_t shard_group_size() const;
  /// Ranks holding the same rows: world_size / shard_group_size().
  int64_t num_replicas() const;
  /// ranks_per_node, or world_size when 0.
  int64_t node_size() const { return ranks_per_node > 0 ? ranks_per_node : world_size; }
  /// Throws fsdp::Error (kInvalidArgument) for world_size < 1, a hybrid size that does not divide
  /// the world size (or is set with another strategy), ranks_per_node < 0, a
  /// reshard_after_forward_group_size with a strategy that keeps its params until backward or not
  /// dividing the shard group size.
  void validate() const;
  /// "full_shard", or "hybrid_shard(G=8)"; with an active node-local reshard "full_shard(node=2)",
  /// "hybrid_shard(G=8,node=4)"; with host-aware collectives "full_shard(host=2)", ...
  std::string label() const;
};

/// How a reduce-scatter moves and adds the gradient blocks, which sets what it holds while it
/// runs (memory.h peak_bytes).
enum class ReduceScatterRoute {
  /// fsdp-cpp's MPI and Gloo backends: one all-to-all of the blocks, then a local sum in rank order
  /// ([Note: all-to-all reductions]): while it runs it holds the blocks it received (as many bytes
  /// as its input) and, for bf16/fp16, a float32 shard and the block being widened.
  kAllToAll,
  /// NCCL's ring (the planner's NCCL model: DeviceProfile::nics_per_node >= 1): the blocks pass
  /// through NCCL's own fixed-size buffers and are added in the gradient dtype, so it holds only
  /// its input and output.
  kInPlace,
};
/// "all_to_all", "in_place".
std::string to_string(ReduceScatterRoute r);
/// Inverse of to_string; throws fsdp::Error (kInvalidArgument) naming the accepted values.
ReduceScatterRoute parse_reduce_scatter_route(const std::string& name);

/// One training step as fsdp-train runs it.
struct StepSetup {
  Precision precision = Precision::kFp32;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  /// What peak_bytes charges a running reduce-scatter. make_plan and plan_strategy overwrite it
  /// (PlanInputs::reduce_scatter_route, else from the profile: plan.h reduce_scatter_route_for);
  /// direct callers of peak_bytes get fsdp-train's own route, kAllToAll, unless they set it.
  ReduceScatterRoute reduce_scatter_route = ReduceScatterRoute::kAllToAll;
  int64_t micro_batch_size = 1;    ///< sequences per forward per rank
  int64_t seq_len = 128;           ///< tokens per sequence
  int64_t accumulation_steps = 1;  ///< micro-batches per optimizer step (gradient sync on the last)
  /// Only each block's input is kept in forward; the block's forward runs again in its backward.
  bool activation_checkpointing = false;
  /// With activation_checkpointing: only every k-th block is checkpointed (blocks k, 2k, ...
  /// counting the first block as 1; per-block selective checkpointing), the others keep their
  /// activations and run their forward once. 1: every block.
  int64_t checkpoint_every = 1;
  bool forward_prefetch = true;    ///< fsdp-train's default (the library's is false)
  bool backward_prefetch = true;
  int max_unsharded_units = fsdp::kDefaultMaxUnshardedUnits;
  int64_t bucket_cap_bytes = fsdp::kDefaultBucketCapBytes;  ///< no_shard's all-reduce buckets
  /// fsdp-train computes the global grad norm every step: one all-reduce of 2 doubles (16 bytes).
  bool clip_grad_norm = true;
  /// What the all-gathers carry (FullyShardOptions::all_gather_codec): kInt8 makes each gather
  /// G x comm::int8_payload_bytes(shard numel) bytes instead of G x shard numel x param bytes, and
  /// adds the quantising and decoding passes to the unshard's copies. A strategy that gathers
  /// nothing (no_shard) has no all-gather for it to change.
  fsdp::WireCodec all_gather_codec = fsdp::WireCodec::kNone;
  /// What the reduce-scatters carry (FullyShardOptions::reduce_scatter_codec): kInt8 replaces the
  /// reduce-scatter (with host-aware collectives: its stage across hosts) by an all-to-all of
  /// n x comm::int8_payload_bytes(reduce shard) bytes (int8_reduce_bytes), and adds the quantising
  /// and decoding passes. A strategy that all-reduces (no_shard) has none for it to change.
  fsdp::WireCodec reduce_scatter_codec = fsdp::WireCodec::kNone;
  /// Loss scaling (fsdp-train uses it with fp16): one all-reduce of an int64 flag per step.
  bool loss_scaling = false;
  /// fsdp-train checks every step that the loss and the gradients are finite on every rank: one
  /// all-reduce of world_size int64 flags (8 x world_size bytes).
  bool nonfinite_check = true;
  /// Whether block `block` (1 = the first block) keeps only its input and recomputes its forward in
  /// backward: activation_checkpointing and block a multiple of checkpoint_every.
  bool checkpoints_block(int64_t block) const {
    return activation_checkpointing && block >= 1 && block % checkpoint_every == 0;
  }
  /// Throws fsdp::Error (kInvalidArgument) for non-positive sizes, and for checkpoint_every other
  /// than 1 without activation_checkpointing.
  void validate() const;
};

}  // namespace fsdp::planner
