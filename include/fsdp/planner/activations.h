// Activation memory (pure math): what autograd saves in forward, tensor by tensor, for one
// micro-batch. docs/planner.md, "Activations" (each formula there was checked against the storages
// PyTorch's saved-tensor hooks report for the same GPT).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/setup.h"

namespace fsdp::planner {

/// One tensor autograd keeps from forward to backward (unique storage; parameters excluded: they
/// are counted as unsharded params).
struct SavedTensor {
  std::string name;     ///< what it is and who saves it, e.g. "ln_1 output (c_attn input)"
  std::string formula;  ///< its size, e.g. "B*T*C*a" (a = bytes of the activation dtype)
  int64_t bytes = 0;
};

/// Bytes of the CPU generator state (at::Generator::get_state(), uint8) that fsdp's activation
/// checkpointing saves per region (src/runtime/activation_checkpoint.cpp): libtorch's
/// CPUGeneratorImpl state, torch.get_rng_state().numel() in Python.
constexpr int64_t kCpuGeneratorStateBytes = 5056;

/// Activations of one micro-batch of B sequences of T tokens.
struct ActivationModel {
  bool known = false;              ///< false for a parameter-count model (BlockKind::kNone): all 0
  std::string attention_kernel;    ///< GPT: "flash" or "math" as resolved for the dtype and T
  std::vector<SavedTensor> block;  ///< saved by one block (blocks are identical)
  std::vector<SavedTensor> root;   ///< saved by the root: lookups, final norm, head input, loss
  int64_t block_bytes = 0;         ///< sum of `block`
  int64_t block_input_bytes = 0;   ///< B*T*C*a: the input a checkpointed block keeps
  /// All a block keeps under activation checkpointing: its input and the CPU generator state its
  /// recompute replays (kCpuGeneratorStateBytes).
  int64_t checkpointed_block_bytes = 0;
  /// Of block_bytes, what the first block does not keep when the embeddings are frozen (a LoRA
  /// base): its input requires no gradient, so its first norm saves neither its input nor its
  /// statistics (0 otherwise, and where the block is checkpointed).
  int64_t first_block_frozen_input_bytes = 0;
  int64_t root_bytes = 0;          ///< sum of `root`
  /// Of root_bytes, what stays until the end of backward: the embedding lookups' index tensors
  /// (the final norm's and the loss's tensors are freed by the head's backward, which runs first).
  int64_t root_lookup_bytes = 0;
  /// Logits-sized buffers alive at once at the start of backward besides the saved log-probs: the
  /// gradient of the log-probs and of the logits, 2 x B*T*V*4 (fp32).
  int64_t loss_transient_bytes = 0;
  /// Saved bytes of all blocks and the root as kept through forward: per block block_bytes, or
  /// checkpointed_block_bytes where the block is checkpointed (StepSetup::checkpoints_block), less
  /// first_block_frozen_input_bytes for the first block, + root_bytes.
  int64_t total_saved_bytes = 0;
};

/// The attention kernel apps/models/gpt.cpp runs: "math" when attention is "math", or "auto" with
/// a 2-byte activation dtype and T <= 256; "flash" otherwise.
std::string resolve_gpt_attention(const std::string& attention, Precision precision, int64_t seq_len);

/// Saved tensors of `model` for one micro-batch (setup.micro_batch_size x setup.seq_len tokens) in
/// the activation dtype of setup.precision (the param dtype: fsdp units cast their inputs to it).
/// GPT: apps/models/gpt.cpp as written (at::linear, LayerNorm, the chosen attention kernel, GELU
/// tanh). Llama: an implementation with fused RMSNorm (saves input and rstd), flash attention and
/// SwiGLU as silu(gate) * up.
ActivationModel activation_model(const ModelSpec& model, const StepSetup& setup);

}  // namespace fsdp::planner
