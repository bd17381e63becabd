// NodeShard: a unit's params kept after forward sharded over a node-local group (internal; ZeRO++'s
// hpZ, Wang et al. 2023, section 3.2; FSDP2's reshard_after_forward=<int>). After a forward with
// grad enabled the unit keeps, instead of nothing, this rank's rows of the decoded params over
// FullyShardOptions::reshard_after_forward_group_size consecutive ranks of its shard group (param
// dtype, FlatLayout at that size); its backward all-gathers them over that group only, so the
// second gather of full_shard never leaves the node and carries exactly the values the forward
// computed with. docs/architecture.md, "[Note: node-local reshard]".
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fsdp_param.h"
#include "fsdp/shard/layout.h"
#include "unit_collectives.h"

namespace fsdp::detail {

/// One unit's node-local shard. Used on the thread that runs the unit's forward and backward.
class NodeShard {
 public:
  /// `group`: the node-local group (g consecutive ranks of the unit's shard group, split once);
  /// `shapes`: the unit's params' unsharded shapes in order; `dtype`/`device`: param_dtype and the
  /// shards' device.
  NodeShard(comm::ProcessGroupPtr group, const std::vector<std::vector<int64_t>>& shapes, c10::ScalarType dtype,
            c10::Device device);

  /// Copies this rank's rows of every param's unsharded value (`params[i].module_param`, which must
  /// hold the full rows in param_dtype) into a new (S_g) buffer, zero padding, and remembers the
  /// tree's forward pass `pass`. Not collective. Returns its bytes (S_g x param bytes).
  int64_t keep(const std::vector<FSDPParam>& params, int64_t pass);
  /// Whether a shard kept in forward pass `pass` is held (a later pass's forward never uses it).
  bool held_for(int64_t pass) const { return shard_.defined() && pass_ == pass; }
  bool held() const { return shard_.defined(); }
  /// Issues the all-gather of the kept shard over the node-local group (non-blocking) and lets go
  /// of it (the result holds it until decoded). Collective over the node-local group: every rank of
  /// it gathers the same units in the same order, which the same program gives.
  AllGatherResult gather(const comm::OpTag& tag);
  /// Writes the params' real rows from a finished gather (blocking: waits for it) into their
  /// unsharded storage (allocating it), then releases the gather.
  void copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params) const;
  /// Frees the kept shard (no-op when none). Returns the bytes freed.
  int64_t drop();
  /// Bytes held now.
  int64_t bytes() const;
  const comm::ProcessGroupPtr& group() const { return group_; }
  const shard::FlatLayout& layout() const { return layout_; }

 private:
  comm::ProcessGroupPtr group_;
  shard::FlatLayout layout_;  // the params over the node-local group's size
  c10::ScalarType dtype_;
  c10::Device device_;
  at::Tensor shard_;  // (S_g) param_dtype, or undefined
  int64_t pass_ = -1;
};

}  // namespace fsdp::detail
