// The collectives of one FSDP unit as free functions over its params (internal; FSDP2's
// foreach_all_gather / foreach_reduce_scatter). Tests call them directly. docs/architecture.md,
// "[Note: dim-0 sharding]" for the buffer layout.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "fsdp/comm/comm_context.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fsdp_param.h"
#include "fsdp/shard/layout.h"

namespace fsdp::detail {

/// An all-gather of a unit's params in flight (or done).
struct AllGatherResult {
  at::Tensor input;   ///< (S) this rank's padded shards in param_dtype (S = layout.shard_numel())
  at::Tensor output;  ///< (world * S) every rank's block, rank-major; aliases input at world 1
  comm::WorkPtr work; ///< null for a local copy (no collective)
};

/// Issues the all-gather of a unit whose flat shard buffer is `sharded_flat` ((S), original
/// dtype) over `group`: casts it to param_dtype first when that differs (one copy; the bytes on the
/// wire are param_dtype's), none otherwise; the output is allocated on ctx.buffer_device.
/// Non-blocking; keep the result alive until copy_out.
AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, comm::ProcessGroup& group,
                                   const comm::CommContext& ctx, c10::ScalarType param_dtype,
                                   const comm::OpTag& tag);

/// The unshard of a strategy that does not communicate params (no_shard with a dtype cast): the
/// cast copy of `sharded_flat`, as the result of an all-gather over one rank.
AllGatherResult local_cast(const at::Tensor& sharded_flat, c10::ScalarType param_dtype);

/// Waits for `gather` (rethrowing its error; then joins the current stream to it, a no-op on the
/// CPU), then allocates every param's unsharded storage and
/// copies its rows out of the output blocks. Blocking. `gather` is released afterwards.
void copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout);

/// A reduce-scatter of a unit's gradients in flight (or done).
struct ReduceScatterResult {
  at::Tensor input;   ///< (world * S') unsharded gradients in reduce_dtype, rank-major blocks
  at::Tensor output;  ///< (S') this rank's reduced block; aliases input at world 1
  comm::WorkPtr work;
  comm::WorkPtr replica_work;  ///< the all-reduce of output over the replicas (null without one)
};

/// Packs the unsharded gradients of params[index[j]] (layout.params[j]) into one reduce_dtype
/// buffer (rank-major rows, zero padding, zeros for params without a gradient on this rank),
/// frees them, and issues the reduce-scatter (average) over `group` (buffers on
/// ctx.buffer_device); when `replicate` is given
/// (hybrid_shard's replicas), also the all-reduce (average) of the reduced block over it, which
/// starts on its communication thread once the reduce-scatter is done (FSDP2's HSDP order: the
/// compute thread never waits in between). Non-blocking. Call order: every rank of `group` and of
/// `replicate` issues the same units' reductions in the same order.
/// `tag` names the unit and phase (also in errors: a gradient whose shape differs from its param's).
ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<int>& index,
                                           const shard::FlatLayout& layout, comm::ProcessGroup& group,
                                           comm::ProcessGroup* replicate, const comm::CommContext& ctx,
                                           c10::ScalarType reduce_dtype, const comm::OpTag& tag);

/// Waits for `rs` (the reduce-scatter, then the replicas' all-reduce; rethrows the first error;
/// joins the current stream to them, a no-op on the CPU), then adds each param's real rows into its sharded grad. Blocking. `rs` is released afterwards.
void accumulate_reduced(ReduceScatterResult& rs, std::vector<FSDPParam>& params,
                        const std::vector<int>& index, const shard::FlatLayout& layout,
                        int64_t shard_rank);

}  // namespace fsdp::detail
