// Full tensors <-> the (G, S) flat shards of a FlatLayout, written independently of the runtime's
// own copy-in and copy-out: the oracle side of codec and host-aware tests.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "fsdp/shard/layout.h"

namespace fsdp_test {

/// The tensors `full` (shapes as in `layout`, float32) as (G, S) float32 flat shards: row r is
/// rank r's padded shard, params at layout.offsets, zero padding.
inline at::Tensor to_blocks(const std::vector<at::Tensor>& full, const fsdp::shard::FlatLayout& layout) {
  const int64_t G = layout.world_size;
  at::Tensor blocks = at::zeros({G, layout.shard_numel()});
  for (size_t i = 0; i < full.size(); ++i) {
    const auto& spec = layout.params[i];
    const at::Tensor rows = full[i].reshape({spec.dim0, spec.row_numel});
    for (int64_t r = 0; r < G; ++r) {
      blocks[r].narrow(0, layout.offsets[i], spec.real_numel(r))
          .copy_(rows.narrow(0, spec.row_offset(r), spec.real_rows(r)).reshape({-1}));
    }
  }
  return blocks;
}

/// The inverse: full tensors shaped as `like` from (G, S) blocks (views into `blocks`).
inline std::vector<at::Tensor> from_blocks(const at::Tensor& blocks, const fsdp::shard::FlatLayout& layout,
                                           const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < like.size(); ++i) {
    const auto& spec = layout.params[i];
    out.push_back(blocks.narrow(1, layout.offsets[i], spec.padded_shard_numel())
                      .reshape({layout.world_size * spec.rows_per_rank, spec.row_numel})
                      .narrow(0, 0, spec.dim0)
                      .reshape(like[i].sizes()));
  }
  return out;
}

}  // namespace fsdp_test
