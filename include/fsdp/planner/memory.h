// Memory per rank (pure math): the model state by the engine's kinds, exact to the padding row
// (include/fsdp/shard/layout.h), the closed forms, and the peak of a training step.
// docs/planner.md, "Model state" and "Peak".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/setup.h"

namespace fsdp::planner {

/// Element counts of one unit under a shard group of `shard_group_size` ranks, seen from the rank
/// at position `shard_rank` in it (the engine's FlatLayout: every rank stores ceil(d0/G) rows of
/// every parameter).
struct UnitNumbers {
  int64_t numel = 0;                 ///< all params, unpadded
  int64_t trainable_numel = 0;       ///< trainable params, unpadded
  int64_t shard_numel = 0;           ///< one rank's flat shard, all params, padding included
  int64_t reduce_shard_numel = 0;    ///< one rank's flat shard of the trainable params
  int64_t gathered_numel = 0;        ///< all-gather output: G x shard_numel
  int64_t reduce_numel = 0;          ///< reduce-scatter input: G x reduce_shard_numel
  int64_t real_trainable_numel = 0;  ///< this rank's real (unpadded) rows of trainable params
  int64_t largest_real_param = 0;    ///< this rank's largest real trainable shard (optimizer temporaries)
};
/// Throws fsdp::Error (kInvalidArgument) for shard_group_size < 1 or shard_rank out of range.
UnitNumbers unit_numbers(const UnitSpec& unit, int64_t shard_group_size, int64_t shard_rank);

/// This rank's model state after an optimizer step, by the kinds of accounting::ModelStateBytes
/// (what fsdp-train reports as mem.resident_bytes; the counting allocator measures exactly this in
/// tests/mpi/test_strategies.cpp).
struct ModelStateBytes {
  int64_t sharded_param_bytes = 0;  ///< fp32 master rows incl. padding: 4 x shard_numel (no_shard: 4P)
  int64_t sharded_grad_bytes = 0;   ///< fp32 gradient of this rank's real trainable rows
  int64_t optim_state_bytes = 0;    ///< optimizer state of those rows (AdamW 8, SGD momentum 4 B/elem)
  /// Unsharded params kept between steps: zero1's full params (gathered numel x param bytes).
  int64_t resident_unsharded_param_bytes = 0;
  int64_t total_bytes() const {
    return sharded_param_bytes + sharded_grad_bytes + optim_state_bytes + resident_unsharded_param_bytes;
  }
};
/// Exact, padding included, for the rank `rank` of the world (its shard rank: rank % shard group
/// size; rank 0 holds the most real rows). Throws fsdp::Error (kInvalidArgument) for a bad
/// parallelism or rank.
ModelStateBytes model_state_bytes(const ModelSpec& model, const Parallelism& par, const StepSetup& setup,
                                  int64_t rank = 0);

/// Bytes per parameter of the model state by kind (P params at one rank, unsharded).
struct BytesPerParam {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
/// The engine's kinds: fp32 master params 4 + fp32 grads 4 + optimizer state (AdamW 8) = 16 for
/// every precision; bf16/fp16 only add transient unsharded copies (PeakBytes).
BytesPerParam engine_bytes_per_param(Precision precision, OptimizerKind optimizer);
/// ZeRO (Rajbhandari et al. 2020, section 3.1: 2 Psi + 2 Psi + K Psi): mixed precision keeps
/// 2-byte params and grads and K bytes of optimizer state, K = 12 for Adam (fp32 master copy 4 +
/// momentum 4 + variance 4): 2 + 2 + 12 = 16. In fp32 there is no separate master copy: 4 + 4 +
/// 8 (DESIGN.md's table).
BytesPerParam zero_paper_bytes_per_param(Precision precision, OptimizerKind optimizer);
/// ZeRO section 5's per-rank formulas (figure 1) with those bytes (Psi = num_params, N_d =
/// world_size): no_shard (a+b+K)Psi; zero1 (P_os) (a+b)Psi + K Psi/N; shard_grad_op (P_os+g)
/// a Psi + (b+K)Psi/N; full_shard (P_os+g+p) (a+b+K)Psi/N; hybrid_shard (a+b+K)Psi/G.
double zero_paper_model_state_bytes(const Parallelism& par, double num_params, const BytesPerParam& b);
/// The engine's closed form without padding: (4 + 4 + k) x P / shard group size, plus zero1's full
/// params (param bytes x P). model_state_bytes() differs from it only by padding rows.
double closed_form_model_state_bytes(const Parallelism& par, double num_params, const StepSetup& setup);

/// no_shard's all-reduce buckets of one unit, in issue order (elements each): the unit's trainable
/// params in reverse registration order, packed greedily up to cap_bytes / reduce bytes elements
/// (the engine's BucketPlan).
std::vector<int64_t> ddp_bucket_numels(const UnitSpec& unit, int64_t cap_bytes, int64_t reduce_bytes);

/// The estimated peak of one training step on this rank and what is alive at that moment
/// (docs/planner.md, "Peak"): the largest of the moments of a step (end of forward / start of
/// backward, each block's backward, the end of backward, the optimizer step).
struct PeakBytes {
  std::string moment;                     ///< e.g. "start of backward", "backward of h.11"
  int64_t persistent_bytes = 0;           ///< sharded params + optimizer state + resident full params
  int64_t sharded_grad_bytes = 0;         ///< sharded grads existing at that moment
  int64_t unsharded_param_bytes = 0;      ///< transient full params alive (gathered units, casts)
  /// Node-local shards kept from each unit's forward to its backward (Parallelism::
  /// reshard_after_forward_group_size): S_g x param bytes per unit not yet in backward.
  int64_t node_shard_bytes = 0;
  int64_t unsharded_grad_bytes = 0;       ///< full grads and reduce-scatter / bucket buffers alive
  /// Of unsharded_grad_bytes, what the reduce-scatter beside this moment holds only while it runs:
  /// on the all-to-all route the blocks it receives (and for bf16/fp16 the float32 sum and the block
  /// being widened), freed by the communication thread when it finishes (its input and output stay
  /// until the next unit's reduce-scatter is issued). The moment assumes it still runs (the worst
  /// case); a run whose communication finishes sooner peaks up to this much lower. 0 on the in-place
  /// route, at N = 1, for no_shard (buckets) and for moments without a reduce-scatter beside them;
  /// at the end of backward only what block 1's holds beyond the root's own, which runs anyway.
  int64_t reduce_in_flight_bytes = 0;
  int64_t activation_bytes = 0;           ///< saved activations alive
  int64_t loss_transient_bytes = 0;       ///< logits-sized gradient buffers of the loss
  int64_t optimizer_temp_bytes = 0;       ///< AdamW's denominator temporaries (2 x largest shard)
  int64_t peak_bytes = 0;                 ///< the sum
  bool activations_known = true;          ///< false for a parameter-count model (activations 0)
};
/// Throws fsdp::Error (kInvalidArgument) for a bad parallelism, setup or rank.
PeakBytes peak_bytes(const ModelSpec& model, const Parallelism& par, const StepSetup& setup, int64_t rank = 0);

}  // namespace fsdp::planner
