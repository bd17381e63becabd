// Llama-2-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, untied
// output head) whose decoder layers can be FSDP units. Built on any device: the meta device gives
// the public 7B / 13B / 70B shapes with no memory, for dry runs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/runtime/materialize.h"
#include "models/causal_lm.h"
#include "models/layers.h"

namespace apps::models {

/// Shape of a Llama-2-style model.
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t n_layer = 32;
  int64_t n_head = 32;
  int64_t n_kv_head = 32;   ///< key/value heads (grouped-query attention); divides n_head
  int64_t d_model = 4096;   ///< divisible by n_head; head dim d_model / n_head is even (rotary)
  int64_t ffn = 11008;      ///< SwiGLU hidden width
  int64_t max_seq = 4096;   ///< context length (rotary table)
  double rms_eps = 1e-5;
  double rope_theta = 10000.0;
  /// Attention kernel, as GPTConfig::attention: "flash", "math" or "auto".
  std::string attention = "auto";

  /// Parameter count: embedding, per layer (q, o: d*d; k, v: d*kv_dim; gate, up, down: d*ffn;
  /// two norms: d), final norm, untied head (vocab*d).
  int64_t num_params() const;
};

/// Presets with the public shapes: "llama2-7b" (4096, 32 layers, 32 heads, 32 kv heads, ffn
/// 11008), "llama2-13b" (5120, 40, 40, 40, 13824), "llama2-70b" (8192, 80, 64, 8, 28672), vocab
/// 32000; "llama-tiny" (64, 2 layers, 4 heads, 2 kv heads, ffn 172) for tests. Throws
/// std::invalid_argument naming the known presets.
LlamaConfig llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();

/// Attention with rotary positions: q_proj (d -> d), k_proj, v_proj (d -> kv_dim), o_proj (d -> d),
/// no biases; each kv head serves n_head / n_kv_head query heads.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& cfg, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);  // (B, T, d) -> (B, T, d)
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  LlamaConfig cfg_;
};
TORCH_MODULE(LlamaAttention);

/// SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& cfg, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

/// Pre-norm decoder layer: x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x)).
/// The FSDP unit type (fsdp::wrap_by_type<LlamaBlockImpl>()).
class LlamaBlockImpl : public torch::nn::Module {
 public:
  LlamaBlockImpl(const LlamaConfig& cfg, at::TensorOptions options);
  at::Tensor forward(at::Tensor x);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaBlock);

/// embed_tokens (vocab, d), layers "layers.0".., final norm, untied lm_head (vocab, d). On the CPU
/// the constructor initialises (llama_init); on the meta device it allocates nothing.
class LlamaImpl : public CausalLMImpl {
 public:
  explicit LlamaImpl(const LlamaConfig& cfg, at::Device device = at::kCPU);
  /// idx int64 (B, T), T <= max_seq -> logits (B, T, vocab). Layers go through fsdp::call
  /// (fsdp::call_checkpointed with activation checkpointing on).
  at::Tensor forward(const at::Tensor& idx) override;
  int64_t context() const override { return cfg_.max_seq; }
  const LlamaConfig& config() const { return cfg_; }

  Embedding embed_tokens{nullptr};
  std::vector<LlamaBlock> blocks;
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  Linear lm_head{nullptr};

 private:
  LlamaConfig cfg_;
};
TORCH_MODULE(Llama);

/// Initialisation of one module (fsdp::ModuleInit): Linear and Embedding weights ~ N(0, 0.02),
/// RMSNorm weights 1.
fsdp::ModuleInit llama_init(const LlamaConfig& cfg);

}  // namespace apps::models
