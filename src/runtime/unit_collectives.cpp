#include "unit_collectives.h"

#include <ATen/ATen.h>

namespace fsdp::detail {

AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, comm::ProcessGroup& group,
                                   const comm::CommContext& ctx, c10::ScalarType param_dtype,
                                   const comm::OpTag& tag) {
  at::NoGradGuard no_grad;
  AllGatherResult r;
  r.input = sharded_flat.scalar_type() == param_dtype ? sharded_flat : sharded_flat.to(param_dtype);
  // One rank: the all-gather is the identity, so the output is the input (no buffer, no copy).
  r.output = group.size() == 1 ? r.input : at::empty({group.size() * r.input.numel()}, ctx.buffer_options(param_dtype));
  r.work = group.all_gather_into_tensor(r.output, r.input, tag);
  return r;
}

AllGatherResult local_cast(const at::Tensor& sharded_flat, c10::ScalarType param_dtype) {
  at::NoGradGuard no_grad;
  AllGatherResult r;
  r.input = sharded_flat.to(param_dtype);
  r.output = r.input;
  return r;
}

void copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) {
  if (gather.work) {
    gather.work->wait();
    gather.work->block_current_stream();
  }
  const int64_t S = layout.shard_numel();
  at::Tensor blocks = gather.output.view({layout.world_size, S});
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_in_unsharded(blocks, layout.offsets[i]);
  gather = AllGatherResult{};
}

ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<int>& index,
                                           const shard::FlatLayout& layout, comm::ProcessGroup& group,
                                           comm::ProcessGroup* replicate, const comm::CommContext& ctx,
                                           c10::ScalarType reduce_dtype, const comm::OpTag& tag) {
  at::NoGradGuard no_grad;
  const int64_t world = layout.world_size, S = layout.shard_numel();
  ReduceScatterResult r;
  const auto options = ctx.buffer_options(reduce_dtype);  // meta on a simulated group
  r.input = at::empty({world * S}, options);
  at::Tensor blocks = r.input.view({world, S});
  for (size_t j = 0; j < index.size(); ++j) {
    params[index[j]].take_unsharded_grad(blocks, layout.offsets[j], tag.unit);
  }
  r.output = world == 1 ? r.input : at::empty({S}, options);
  r.work = group.reduce_scatter_tensor(r.output, r.input, comm::ReduceOp::kAvg, tag);
  if (replicate) r.replica_work = replicate->all_reduce(r.output, comm::ReduceOp::kAvg, tag, r.work);
  return r;
}

void accumulate_reduced(ReduceScatterResult& rs, std::vector<FSDPParam>& params,
                        const std::vector<int>& index, const shard::FlatLayout& layout,
                        int64_t shard_rank) {
  rs.work->wait();
  if (rs.replica_work) rs.replica_work->wait();
  rs.work->block_current_stream();
  if (rs.replica_work) rs.replica_work->block_current_stream();
  for (size_t j = 0; j < index.size(); ++j) {
    const auto& s = layout.params[j];
    params[index[j]].accumulate_sharded_grad(
        rs.output.narrow(0, layout.offsets[j], s.real_numel(shard_rank)));
  }
  rs = ReduceScatterResult{};
}

}  // namespace fsdp::detail
