// Global gradient-norm clipping over sharded gradients.
#pragma once

#include <torch/nn/module.h>

#include <memory>

namespace fsdp {

/// Clips the sharded gradients of every unit under root so that the global norm of the full
/// (unsharded) gradient is at most max_norm, and returns that norm (before clipping) as a double,
/// identical on every rank.
///
/// norm_type 2: sqrt(all_reduce_sum(sum over this rank's shards of |g|^2 / num_replicas)); norm_type
/// inf (use std::numeric_limits<double>::infinity()): all_reduce_max(local max |g|). A NaN in any
/// rank's gradient makes the norm NaN on every rank (both norm types), as in
/// torch.nn.utils.clip_grad_norm_; a non-finite norm leaves the gradients unscaled. A gradient
/// replicated on several ranks (num_replicas > 1) is counted once, not once per rank. Scale:
/// clip_coef = max_norm / (norm + 1e-6), applied when < 1 (torch.nn.utils.clip_grad_norm_).
/// Params without a gradient are skipped. Collective and blocking over each unit's group: call on
/// all ranks after backward. max_norm <= 0 computes the norm without clipping.
/// Throws fsdp::Error for norm types other than 2 and inf.
double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm,
                      double norm_type = 2.0);

}  // namespace fsdp
