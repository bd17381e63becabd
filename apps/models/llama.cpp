#include "models/llama.h"

#include <algorithm>

#include "fsdp/planner/model_spec.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/silu.h>
#include <torch/nn/init.h>

#include <stdexcept>

#include "fsdp/runtime/fully_shard.h"
#include "models/gpt.h"

namespace apps::models {

int64_t LlamaConfig::num_params() const {
  const int64_t kv_dim = d_model / n_head * n_kv_head;
  const int64_t per_layer = 2 * d_model * d_model + 2 * d_model * kv_dim + 3 * d_model * ffn + 2 * d_model;
  return 2 * vocab_size * d_model + n_layer * per_layer + d_model;
}

std::vector<std::string> llama_preset_names() { return fsdp::planner::llama_preset_names(); }

LlamaConfig llama_preset(const std::string& name) {
  const auto names = llama_preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown Llama preset '" + name + "' (known: " + known + ")");
  }
  // The Llama shapes live once, in the planner, so plans and built models cannot drift.
  const fsdp::planner::LlamaShape l = fsdp::planner::llama_shape(name);
  LlamaConfig c;
  c.d_model = l.n_embd;
  c.n_layer = l.n_layer;
  c.n_head = l.n_head;
  c.n_kv_head = l.n_kv_head;
  c.ffn = l.ffn_hidden;
  c.vocab_size = l.vocab_size;
  c.max_seq = l.context;
  return c;
}

namespace {

void check_config(const LlamaConfig& c) {
  if (c.vocab_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_kv_head <= 0 || c.d_model <= 0 ||
      c.ffn <= 0 || c.max_seq <= 0) {
    throw std::invalid_argument("Llama config: all sizes must be positive");
  }
  if (c.attention != "auto" && c.attention != "flash" && c.attention != "math") {
    throw std::invalid_argument("Llama config: attention '" + c.attention + "' is not one of auto, flash, math");
  }
  if (c.d_model % c.n_head != 0 || c.n_head % c.n_kv_head != 0 || (c.d_model / c.n_head) % 2 != 0) {
    throw std::invalid_argument("Llama config: d_model " + std::to_string(c.d_model) + " must split into " +
                                std::to_string(c.n_head) + " heads of even size, and n_kv_head " +
                                std::to_string(c.n_kv_head) + " must divide n_head");
  }
}

// Rotary position embedding of x (B, H, T, D), pairs (i, i + D/2) rotated by angle t * theta^(-2i/D).
at::Tensor rotary(const at::Tensor& x, double theta) {
  const int64_t T = x.size(2), D = x.size(3), half = D / 2;
  at::Tensor inv = at::pow(theta, at::arange(0, half, x.options().dtype(at::kFloat)) * (-2.0 / D));  // (D/2,)
  at::Tensor ang = at::outer(at::arange(T, x.options().dtype(at::kFloat)), inv);                    // (T, D/2)
  at::Tensor cos = ang.cos().to(x.scalar_type()), sin = ang.sin().to(x.scalar_type());
  at::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
  return at::cat({a * cos - b * sin, a * sin + b * cos}, -1);
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& cfg, at::TensorOptions o) : cfg_(cfg) {
  const int64_t kv_dim = cfg.d_model / cfg.n_head * cfg.n_kv_head;
  q_proj = register_module("q_proj", Linear(cfg.d_model, cfg.d_model, false, o));
  k_proj = register_module("k_proj", Linear(cfg.d_model, kv_dim, false, o));
  v_proj = register_module("v_proj", Linear(cfg.d_model, kv_dim, false, o));
  o_proj = register_module("o_proj", Linear(cfg.d_model, cfg.d_model, false, o));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = cfg_.n_head, K = cfg_.n_kv_head, D = cfg_.d_model / H;
  at::Tensor q = rotary(q_proj(x).view({B, T, H, D}).transpose(1, 2), cfg_.rope_theta);  // (B, H, T, D)
  at::Tensor k = rotary(k_proj(x).view({B, T, K, D}).transpose(1, 2), cfg_.rope_theta);  // (B, K, T, D)
  at::Tensor v = v_proj(x).view({B, T, K, D}).transpose(1, 2);
  if (K != H) {  // each kv head serves H / K query heads
    k = k.repeat_interleave(H / K, 1);
    v = v.repeat_interleave(H / K, 1);
  }
  at::Tensor y = causal_attention(q, k, v, cfg_.attention);  // (B, H, T, D)
  return o_proj(y.transpose(1, 2).contiguous().view({B, T, H * D}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& cfg, at::TensorOptions o) {
  gate_proj = register_module("gate_proj", Linear(cfg.d_model, cfg.ffn, false, o));
  up_proj = register_module("up_proj", Linear(cfg.d_model, cfg.ffn, false, o));
  down_proj = register_module("down_proj", Linear(cfg.ffn, cfg.d_model, false, o));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& cfg, at::TensorOptions o) {
  input_layernorm = register_module("input_layernorm", RMSNorm(cfg.d_model, cfg.rms_eps, o));
  self_attn = register_module("self_attn", LlamaAttention(cfg, o));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(cfg.d_model, cfg.rms_eps, o));
  mlp = register_module("mlp", LlamaMLP(cfg, o));
}

at::Tensor LlamaBlockImpl::forward(at::Tensor x) {
  x = x + self_attn(input_layernorm(x));
  return x + mlp(post_attention_layernorm(x));
}

LlamaImpl::LlamaImpl(const LlamaConfig& cfg, at::Device device) : cfg_(cfg) {
  check_config(cfg);
  const at::TensorOptions o = at::TensorOptions().device(device);
  embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab_size, cfg.d_model, o));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.push_back(LlamaBlock(cfg, o));
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(cfg.d_model, cfg.rms_eps, o));
  lm_head = register_module("lm_head", Linear(cfg.d_model, cfg.vocab_size, false, o));
  if (!device.is_meta()) fsdp::init_parameters(*this, llama_init(cfg));
}

at::Tensor LlamaImpl::forward(const at::Tensor& idx) {
  if (idx.size(1) > cfg_.max_seq) {
    throw std::invalid_argument("Llama forward: sequence length " + std::to_string(idx.size(1)) +
                                " exceeds max_seq " + std::to_string(cfg_.max_seq));
  }
  at::Tensor x = embed_tokens(idx);  // (B, T, d)
  for (auto& b : blocks) x = call_block(b, x);
  return lm_head(norm(x));  // (B, T, vocab)
}

fsdp::ModuleInit llama_init(const LlamaConfig&) {
  return [](const std::string&, torch::nn::Module& m) {
    if (auto* l = dynamic_cast<LinearImpl*>(&m)) {
      torch::nn::init::normal_(l->weight, 0.0, 0.02);
    } else if (auto* e = dynamic_cast<EmbeddingImpl*>(&m)) {
      torch::nn::init::normal_(e->weight, 0.0, 0.02);
    } else if (auto* n = dynamic_cast<RMSNormImpl*>(&m)) {
      torch::nn::init::ones_(n->weight);
    }
  };
}

}  // namespace apps::models
