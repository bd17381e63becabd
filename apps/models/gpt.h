// GPT-2-style decoder-only transformer (libtorch C++ frontend) whose blocks can be FSDP units.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/runtime/materialize.h"
#include "models/causal_lm.h"
#include "models/layers.h"

namespace apps::models {

/// Shape of a GPT. Every field can be overridden after taking a preset.
struct GPTConfig {
  int64_t vocab_size = 8192;  ///< from the tokenizer
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;       ///< model width C; must be divisible by n_head
  int64_t block_size = 256;   ///< context length (max sequence length)
  double layer_norm_eps = 1e-5;  ///< epsilon of every LayerNorm (GPT-2's layer_norm_epsilon)
  /// Attention kernel: "flash" (at::scaled_dot_product_attention, libtorch's fused CPU kernel),
  /// "math" (softmax(q k^T / sqrt(D) + causal mask) v as two batched matmuls, softmax in fp32,
  /// O(T^2) memory per head), or "auto": math for bf16/fp16 activations with T <= 256, where
  /// libtorch's fused kernel is slower than two low-precision matmuls on CPUs (measured:
  /// 2.5x on AVX512-BF16 at T = 128, 1.4x at T = 256; slower from T = 512), flash otherwise.
  std::string attention = "auto";

  int64_t num_params() const;  ///< parameter count (tied head counted once)
};

/// Presets: "nano" (4 layers, 4 heads, width 128, ctx 256: ~1.9M params at vocab 8192),
/// "micro" (6/6/384, ctx 256: ~14M), "gpt2" (12/12/768, ctx 1024), "gpt2-medium" (24/16/1024),
/// "gpt2-large" (36/20/1280), "gpt2-xl" (48/25/1600). vocab_size is set from the argument.
/// Throws std::invalid_argument naming the known presets.
GPTConfig gpt_preset(const std::string& name, int64_t vocab_size);
std::vector<std::string> gpt_preset_names();

/// The vocabulary of the public GPT-2 checkpoints (50257 tokens), for dry runs of the gpt2 presets.
constexpr int64_t kGpt2VocabSize = 50257;

/// Causal attention of q, k, v (B, H, T, D) -> (B, H, T, D) with the kernel `attention` names
/// (GPTConfig::attention; meta tensors always take the math path). Shared with the Llama model.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::string& attention);

/// Causal self-attention: fused qkv projection c_attn (C -> 3C), causal attention (kernel per
/// GPTConfig::attention), output projection c_proj (C -> C).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GPTConfig& cfg, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);  // (B, T, C) -> (B, T, C)
  Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t n_head_;
  std::string attention_;
};
TORCH_MODULE(CausalSelfAttention);

/// MLP: c_fc (C -> 4C), GELU (tanh approximation), c_proj (4C -> C).
class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPTConfig& cfg, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);  // (B, T, C) -> (B, T, C)
  Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(MLP);

/// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)). The FSDP unit type
/// (wrap policy fsdp::wrap_by_type<BlockImpl>()).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& cfg, at::TensorOptions options);
  at::Tensor forward(at::Tensor x);  // (B, T, C) -> (B, T, C)
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

/// GPT: token embedding wte (V, C) + position embedding wpe (block_size, C), blocks "h.0".."h.{L-1}",
/// final LayerNorm ln_f, and an output head tied to wte: logits = x @ wte.weight^T (the head has no
/// parameter of its own, so the tied weight is one Parameter, owned by whichever FSDP unit owns wte).
/// Built on `device`: on the CPU the constructor initialises the parameters (fsdp::init_parameters
/// with gpt_init(cfg)); on the meta device it allocates nothing and initialises nothing (deferred
/// initialisation: fully_shard the model, then fsdp::materialize(model, gpt_init(cfg)) gives every
/// rank's shards the values of the CPU build; or a dry run).
/// Initialisation draws from the global torch generator: seed it (torch::manual_seed) first to build
/// identical models on every rank.
class GPTImpl : public CausalLMImpl {
 public:
  explicit GPTImpl(const GPTConfig& cfg, at::Device device = at::kCPU);

  /// idx: int64 (B, T) token ids, T <= block_size -> logits float (B, T, V). Each block is called
  /// through fsdp::call (fsdp::call_checkpointed with activation checkpointing on), so a block that
  /// is an FSDP unit is unsharded around its forward.
  at::Tensor forward(const at::Tensor& idx) override;
  int64_t context() const override { return cfg_.block_size; }

  const GPTConfig& config() const { return cfg_; }
  /// The output head's weight: the same tensor as wte->weight.
  const at::Tensor& lm_head_weight() const { return wte->weight; }

  Embedding wte{nullptr}, wpe{nullptr};
  std::vector<Block> blocks;    ///< the blocks of h, for direct calls
  torch::nn::ModuleList h{nullptr};  ///< registered as "h": parameters h.0.*, h.1.*, ...
  LayerNorm ln_f{nullptr};

 private:
  GPTConfig cfg_;
};
TORCH_MODULE(GPT);

/// GPT-2 initialisation of one module (fsdp::ModuleInit, module pre-order): Linear and Embedding
/// weights ~ N(0, 0.02), the residual projections (names ending in "c_proj") ~
/// N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weight 1 / bias 0 (no draws).
fsdp::ModuleInit gpt_init(const GPTConfig& cfg);

/// Mean cross entropy over all B*T positions: logits (B, T, V) float, targets int64 (B, T).
at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace apps::models
