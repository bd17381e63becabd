// The collectives of one FSDP unit as free functions over its params (internal; FSDP2's
// foreach_all_gather / foreach_reduce_scatter). Tests call them directly. docs/architecture.md,
// "[Note: dim-0 sharding]" for the buffer layout.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <vector>

#include "fsdp/comm/comm_context.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fsdp_param.h"
#include "fsdp/runtime/options.h"
#include "fsdp/shard/layout.h"

namespace fsdp::detail {

/// The two groups of host-aware collectives ([Note: host-aware collectives] in
/// docs/architecture.md; FullyShardOptions::collective_host_size): the shard group's G = H x h
/// ranks as H hosts of h consecutive ranks. Inactive (both null) when off.
struct HostGroups {
  comm::ProcessGroupPtr host;   ///< the h ranks of this rank's host (the stage inside the host)
  comm::ProcessGroupPtr cross;  ///< the H ranks at this rank's place on every host (the stage across)
  bool active() const { return host != nullptr; }
  /// H (1 when inactive).
  int64_t hosts() const { return cross ? cross->size() : 1; }
};

/// An all-gather of a unit's params in flight (or done).
struct AllGatherResult {
  at::Tensor input;   ///< (S) this rank's padded shards in param_dtype (S = layout.shard_numel())
  /// (world * S) every rank's block, rank-major, or in the host-aware order ((h, H, S): rank k*h+l's
  /// block at [l][k]) when `hosts` > 1; aliases input at world 1
  at::Tensor output;
  comm::WorkPtr work; ///< the last (or only) stage; null for a local copy (no collective)
  at::Tensor staged;  ///< host-aware: (H * S) the cross-host stage's output, the host stage's input
  comm::WorkPtr first;  ///< host-aware: the cross-host stage (work starts once it is done)
  int64_t hosts = 1;    ///< H of output's order
};

/// Issues the all-gather of `input` ((n), any dtype the backend gathers) over `group`, or in two
/// chained stages over hosts.cross then hosts.host when hosts is active ([Note: host-aware
/// collectives]); the output ((world * n), ctx's device) is allocated here, aliasing input at
/// world 1. Non-blocking. Call order: every rank of the group (and of both host groups) issues the
/// same gathers in the same order.
AllGatherResult issue_all_gather(at::Tensor input, comm::ProcessGroup& group, const HostGroups& hosts,
                                 const comm::CommContext& ctx, const comm::OpTag& tag);

/// Waits for every stage of `gather` (the first stage first, rethrowing its error; then joins the
/// current stream to them, a no-op on the CPU). Blocking.
void wait_gathered(const AllGatherResult& gather);

/// Issues the all-gather of a unit whose flat shard buffer is `sharded_flat` ((S), original
/// dtype) over `group`: casts it to param_dtype first when that differs (one copy; the bytes on the
/// wire are param_dtype's), none otherwise; the output is allocated on ctx.buffer_device.
/// Non-blocking; keep the result alive until copy_out.
AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, comm::ProcessGroup& group,
                                   const comm::CommContext& ctx, c10::ScalarType param_dtype,
                                   const comm::OpTag& tag, const HostGroups& hosts = {});

/// The unshard of a strategy that does not communicate params (no_shard with a dtype cast): the
/// cast copy of `sharded_flat`, as the result of an all-gather over one rank.
AllGatherResult local_cast(const at::Tensor& sharded_flat, c10::ScalarType param_dtype);

/// Waits for `gather` (rethrowing its error; then joins the current stream to it, a no-op on the
/// CPU), then allocates every param's unsharded storage and
/// copies its rows out of the output blocks. Blocking. `gather` is released afterwards.
void copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout);

/// A reduce-scatter of a unit's gradients in flight (or done).
struct ReduceScatterResult {
  /// (world * S') unsharded gradients in reduce_dtype, rank-major blocks, or in the host-aware
  /// order ((h, H, S'), as AllGatherResult::output) with host groups
  at::Tensor input;
  at::Tensor output;  ///< (S') this rank's reduced block; aliases input at world 1
  comm::WorkPtr work;          ///< the last stage that moves data
  comm::WorkPtr first;         ///< host-aware: the stage inside the host (work starts after it)
  comm::WorkPtr replica_work;  ///< the all-reduce of output over the replicas (null without one)
  at::Tensor staged;           ///< host-aware: (H * S') the host stage's output
  at::Tensor payload_in, payload_out;  ///< int8: the quantised blocks sent and received (uint8)
  /// int8: dequantises payload_out and writes the float32 mean into output; run by the replicas'
  /// all-reduce before it starts, otherwise by accumulate_reduced (then cleared)
  std::function<void()> decode;
};

/// How a unit's gradients travel: FullyShardOptions::reduce_scatter_codec and the host groups.
struct ReduceScatterWire {
  WireCodec codec = WireCodec::kNone;
  std::vector<int64_t> segments;  ///< int8: the reduce layout's padded_shard_numel per param
  HostGroups hosts;
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
///
/// `wire` (default: one reduce-scatter at reduce_dtype): with host groups, the input is packed in
/// the host-aware order and reduced inside the host (average), then across hosts, chained; with
/// WireCodec::kInt8 the (last) stage sends each block block-quantised in one all-to-all of bytes
/// and the receiver averages the dequantised blocks in float32 in rank order ([Note: host-aware
/// collectives]).
ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<int>& index,
                                           const shard::FlatLayout& layout, comm::ProcessGroup& group,
                                           comm::ProcessGroup* replicate, const comm::CommContext& ctx,
                                           c10::ScalarType reduce_dtype, const comm::OpTag& tag,
                                           const ReduceScatterWire& wire = {});

/// Waits for every stage of `rs` (rethrowing the first error; joins the current stream to them).
/// Blocking. Used by accumulate_reduced and to make sure no collective still uses rs's buffers.
void wait_reduced(const ReduceScatterResult& rs);

/// Waits for `rs` (the reduce-scatter, then the replicas' all-reduce; rethrows the first error;
/// joins the current stream to them, a no-op on the CPU), then adds each param's real rows into its sharded grad. Blocking. `rs` is released afterwards.
void accumulate_reduced(ReduceScatterResult& rs, std::vector<FSDPParam>& params,
                        const std::vector<int>& index, const shard::FlatLayout& layout,
                        int64_t shard_rank);

}  // namespace fsdp::detail
