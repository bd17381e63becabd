// Model-state accounting: the bytes this rank's FSDP units (and an optimizer) hold, by kind. A
// query of the runtime, above it; the counting allocator it is compared with is
// fsdp/accounting/memory.h (the ground floor). Names stay in fsdp::accounting.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>

namespace fsdp::accounting {

/// This rank's model-state bytes held by fsdp-cpp, by kind (one rank, one moment).
struct ModelStateBytes {
  int64_t sharded_param_bytes = 0;     ///< sharded params incl. padding rows
  int64_t sharded_grad_bytes = 0;      ///< sharded grads currently defined
  int64_t optim_state_bytes = 0;       ///< optimizer state tensors (0 without an optimizer)
  int64_t unsharded_param_bytes = 0;   ///< unsharded params resident now (zero1: between steps too)
  int64_t unsharded_grad_bytes = 0;    ///< unsharded grads alive now
  /// Node-local shards kept from a unit's forward to its backward (reshard_after_forward_group_size).
  int64_t node_shard_bytes = 0;
  /// Max unsharded params (and node-local shards) alive at once since the last reset.
  int64_t peak_unsharded_param_bytes = 0;
  int64_t total_state_bytes() const {
    return sharded_param_bytes + sharded_grad_bytes + optim_state_bytes;
  }
  /// Everything the library holds for the model now: the state plus unsharded params and grads.
  int64_t resident_bytes() const {
    return total_state_bytes() + unsharded_param_bytes + unsharded_grad_bytes + node_shard_bytes;
  }
};

/// Model state of the units under root (and of `optimizer`, when given). Not collective.
ModelStateBytes model_state_bytes(const std::shared_ptr<torch::nn::Module>& root,
                                  const torch::optim::Optimizer* optimizer = nullptr);
/// Bytes of the state tensors of optimizer (Adam/AdamW exp_avg, exp_avg_sq, max_exp_avg_sq; SGD
/// momentum_buffer). Throws fsdp::Error for an optimizer type it does not know.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);
/// Resets peak_unsharded_param_bytes of root's tree to the current value.
void reset_peak_unsharded_bytes(const std::shared_ptr<torch::nn::Module>& root);

}  // namespace fsdp::accounting
