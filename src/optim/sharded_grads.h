// The sharded gradients of a tree of units, as clipping and loss scaling read them (internal).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::detail {

/// This rank's sharded gradients under root, after every pending gradient reduction finished.
/// grads[i] is a defined, non-empty fp32 (the params' dtype) shard; num_replicas[i] is how many
/// ranks hold the same rows (1 when sharded). group is the data-parallel group every unit trains
/// over (null when root has no unit). Not collective (waits for this rank's pending reductions).
/// Throws fsdp::Error, naming `op` and the unit, when two units train over different groups.
struct ShardedGrads {
  comm::ProcessGroupPtr group;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> num_replicas;
};
ShardedGrads sharded_grads(const std::shared_ptr<torch::nn::Module>& root, const char* op);

/// Sum over grads of |g|^2 / num_replicas (kDouble scalar), or, for norm_type inf, max |g| (NaN
/// when any gradient holds a NaN, as torch.nn.utils.clip_grad_norm_ gives). One pass per gradient
/// in its own dtype, one host sync for all of them.
double local_norm_part(const ShardedGrads& g, bool inf);

}  // namespace fsdp::detail
