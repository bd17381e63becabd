#include "node_shard.h"

#include <ATen/ATen.h>

namespace fsdp::detail {

NodeShard::NodeShard(comm::ProcessGroupPtr group, const std::vector<std::vector<int64_t>>& shapes,
                     c10::ScalarType dtype, c10::Device device)
    : group_(std::move(group)), layout_(shard::FlatLayout::make(shapes, group_->size())), dtype_(dtype), device_(device) {}

int64_t NodeShard::keep(const std::vector<FSDPParam>& params, int64_t pass) {
  at::NoGradGuard no_grad;
  const int64_t j = group_->rank();
  shard_ = at::zeros({layout_.shard_numel()}, at::dtype(dtype_).device(device_));
  for (size_t i = 0; i < params.size(); ++i) {
    const shard::ParamShardSpec& s = layout_.params[i];
    const int64_t rows = s.real_rows(j);
    if (rows == 0 || s.row_numel == 0) continue;
    shard_.narrow(0, layout_.offsets[i], rows * s.row_numel)
        .view({rows, s.row_numel})
        .copy_(params[i].module_param.detach().reshape({s.dim0, s.row_numel}).narrow(0, s.row_offset(j), rows));
  }
  pass_ = pass;
  return bytes();
}

AllGatherResult NodeShard::gather(const comm::OpTag& tag) {
  AllGatherResult r = foreach_all_gather(shard_, *group_, comm::CommContext::for_group(*group_), dtype_, tag);
  shard_ = at::Tensor();  // r.input holds it until decoded
  pass_ = -1;
  return r;
}

void NodeShard::copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params) const {
  if (gather.work) {
    gather.work->wait();
    gather.work->block_current_stream();
  }
  at::NoGradGuard no_grad;
  const int64_t g = layout_.world_size;
  const at::Tensor blocks = gather.output.view({g, layout_.shard_numel()});
  for (size_t i = 0; i < params.size(); ++i) {
    const shard::ParamShardSpec& s = layout_.params[i];
    params[i].alloc_unsharded();
    if (s.numel() == 0) continue;  // no rows, or rows of no element
    at::Tensor rows_out = params[i].unsharded_padded.view({-1, s.row_numel});
    for (int64_t r = 0; r < g; ++r) {
      const int64_t rows = s.real_rows(r);
      if (rows == 0) continue;
      rows_out.narrow(0, s.row_offset(r), rows)
          .copy_(blocks[r].narrow(0, layout_.offsets[i], rows * s.row_numel).view({rows, s.row_numel}));
    }
  }
  gather = AllGatherResult{};
}

int64_t NodeShard::drop() {
  const int64_t n = bytes();
  shard_ = at::Tensor();
  pass_ = -1;
  return n;
}

int64_t NodeShard::bytes() const { return shard_.defined() ? static_cast<int64_t>(shard_.nbytes()) : 0; }

}  // namespace fsdp::detail
