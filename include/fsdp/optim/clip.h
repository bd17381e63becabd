// Global gradient-norm clipping over sharded gradients.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <memory>

namespace fsdp {

/// Sum of squares of every element of `t` (any shape, any floating dtype, CPU), in double. Each
/// element is squared in fp32 (exact for bf16 and fp16 inputs, one rounding for fp32) and the
/// squares are summed in double, 2^18 elements at a time: the result does not depend on how the
/// tensor is split into shards (to double rounding, ~1e-15 relative), unlike an fp32 reduction,
/// whose error grows with the length (libtorch's fp32 linalg_vector_norm of 16M N(0,1) elements
/// is off by ~1e-3 relative on AVX-512 CPUs, so the norm of one tensor and the norms of its
/// shards disagreed at 1e-5). Transient memory: 2^18 fp32 elements (1 MiB). Not collective;
/// blocking. [Note: gradient norm accuracy] in docs/architecture.md.
double sum_of_squares(const at::Tensor& t);

/// Clips the sharded gradients of every unit under root so that the global norm of the full
/// (unsharded) gradient is at most max_norm, and returns that norm (before clipping) as a double,
/// identical on every rank.
///
/// norm_type 2: sqrt(all_reduce_sum(sum over this rank's shards of sum_of_squares(g) / num_replicas)),
/// so the norm equals a single process's float64 norm of the full gradient at any world size and
/// strategy (to ~1e-15 relative, beyond the data-parallel sum's own rounding); norm_type
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
