// CausalLMImpl: the base of the decoder-only language models fsdp-train trains (GPT-2-style and
// Llama-2-style): forward, generation, activation checkpointing. Which model and its shape is a
// ModelConfig (model_config.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/runtime/activation_checkpoint.h"
#include "fsdp/runtime/fully_shard.h"

namespace apps::models {

/// Base of the decoder-only models (GPTImpl, LlamaImpl): token ids in, next-token logits out.
/// Call it through fsdp::call(model, idx) so that an FSDP-wrapped root is unsharded around it.
class CausalLMImpl : public torch::nn::Module {
 public:
  /// idx int64 (B, T), T <= context() -> logits (B, T, vocab), float (or the root's mixed-precision
  /// output dtype). Each block goes through fsdp::call, or fsdp::call_checkpointed with activation
  /// checkpointing on. Throws std::invalid_argument for T > context().
  virtual at::Tensor forward(const at::Tensor& idx) = 0;
  /// The longest sequence forward takes, in tokens.
  virtual int64_t context() const = 0;

  /// Samples n_tokens continuation ids of prompt_ids under torch::NoGradGuard, cropping the context
  /// to context(). Each step calls the model through fsdp::call(this), so an FSDP-wrapped model is
  /// unsharded (collective: every rank of the model's group must call it with the same arguments).
  /// temperature > 0 scales the logits; top_k > 0 keeps the k most likely tokens (0: all). Sampling
  /// uses a generator seeded with `seed` (same seed on every rank gives the same tokens). Throws
  /// std::invalid_argument for an empty prompt or temperature <= 0.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt_ids, int64_t n_tokens, double temperature,
                                int64_t top_k, uint64_t seed);

  /// With true, forward runs each block as an activation-checkpointed region
  /// (fsdp::call_checkpointed): only the blocks' inputs are kept for backward and each block's
  /// forward is re-run in its backward (FSDP units are unsharded again for it). Default false.
  /// Every rank must use the same setting.
  void set_activation_checkpointing(bool on) { checkpoint_blocks_ = on; }
  bool activation_checkpointing() const { return checkpoint_blocks_; }

 protected:
  /// block(x) through fsdp::call_checkpointed or fsdp::call, per activation_checkpointing().
  template <typename Block>
  at::Tensor call_block(Block& block, const at::Tensor& x);

 private:
  bool checkpoint_blocks_ = false;
};

template <typename Block>
at::Tensor CausalLMImpl::call_block(Block& block, const at::Tensor& x) {
  return checkpoint_blocks_ ? fsdp::call_checkpointed(block, x) : fsdp::call(block, x);
}

}  // namespace apps::models
