#include "models/gpt.h"

#include <algorithm>

#include "fsdp/planner/model_spec.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>

#include <ATen/ops/embedding.h>

#include <cmath>
#include <stdexcept>

#include "fsdp/runtime/activation_checkpoint.h"
#include "fsdp/runtime/fully_shard.h"

namespace apps::models {

int64_t GPTConfig::num_params() const {
  const int64_t C = n_embd;
  const int64_t per_block = 2 * 2 * C            // ln_1, ln_2
                            + C * 3 * C + 3 * C  // c_attn
                            + C * C + C          // attn.c_proj
                            + C * 4 * C + 4 * C  // c_fc
                            + 4 * C * C + C;     // mlp.c_proj
  return vocab_size * C + block_size * C + n_layer * per_block + 2 * C;
}

std::vector<std::string> gpt_preset_names() {
  return {"nano", "micro", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

GPTConfig gpt_preset(const std::string& name, int64_t vocab_size) {
  const auto names = gpt_preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model preset '" + name + "' (known: " + known + ")");
  }
  // The shapes live once, in the planner, so plans and trained models cannot drift apart.
  const fsdp::planner::GptShape g = fsdp::planner::gpt_shape(name, vocab_size);
  GPTConfig c;
  c.vocab_size = g.vocab_size;
  c.n_layer = g.n_layer;
  c.n_head = g.n_head;
  c.n_embd = g.n_embd;
  c.block_size = g.block_size;
  return c;
}

namespace {
void check_config(const GPTConfig& c) {
  if (c.vocab_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_embd <= 0 || c.block_size <= 0) {
    throw std::invalid_argument("GPT config: all sizes must be positive");
  }
  if (c.attention != "auto" && c.attention != "flash" && c.attention != "math") {
    throw std::invalid_argument("GPT config: attention '" + c.attention +
                                "' is not one of auto, flash, math");
  }
  if (!(c.layer_norm_eps > 0)) throw std::invalid_argument("GPT config: layer_norm_eps must be > 0");
  if (c.n_embd % c.n_head != 0) {
    throw std::invalid_argument("GPT config: n_embd " + std::to_string(c.n_embd) +
                                " is not divisible by n_head " + std::to_string(c.n_head));
  }
}

at::Tensor linear(Linear& l, const at::Tensor& x) { return l->forward(x); }
}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::string& attention) {
  const int64_t T = q.size(2), D = q.size(3);
  const bool low = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  // Meta tensors (a dry run) take the math path: libtorch's fused kernel has no meta kernel, and
  // no values are computed.
  const bool math = attention == "math" || (attention == "auto" && low && T <= 256) || q.is_meta();
  if (!math) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(D)));
  at::Tensor future = at::ones({T, T}, q.options().dtype(at::kBool)).triu_(1);  // (T, T)
  scores = scores.masked_fill(future, -INFINITY);                                // (B, H, T, T)
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, v);
}

fsdp::ModuleInit gpt_init(const GPTConfig& cfg) {
  const double std = 0.02, residual_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  return [std, residual_std](const std::string& name, torch::nn::Module& m) {
    if (auto* l = dynamic_cast<LinearImpl*>(&m)) {
      const bool residual = name.size() >= 6 && name.compare(name.size() - 6, 6, "c_proj") == 0;
      torch::nn::init::normal_(l->weight, 0.0, residual ? residual_std : std);
      if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
    } else if (auto* e = dynamic_cast<EmbeddingImpl*>(&m)) {
      torch::nn::init::normal_(e->weight, 0.0, std);
    } else if (auto* n = dynamic_cast<LayerNormImpl*>(&m)) {
      torch::nn::init::ones_(n->weight);
      torch::nn::init::zeros_(n->bias);
    }
  };
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& cfg, at::TensorOptions o)
    : n_head_(cfg.n_head), attention_(cfg.attention) {
  c_attn = register_module("c_attn", Linear(cfg.n_embd, 3 * cfg.n_embd, true, o));
  c_proj = register_module("c_proj", Linear(cfg.n_embd, cfg.n_embd, true, o));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_head_;
  auto qkv = linear(c_attn, x).split(C, /*dim=*/2);  // 3 x (B, T, C)
  auto q = qkv[0].view({B, T, n_head_, D}).transpose(1, 2);  // (B, H, T, D)
  auto k = qkv[1].view({B, T, n_head_, D}).transpose(1, 2);
  auto v = qkv[2].view({B, T, n_head_, D}).transpose(1, 2);
  auto y = causal_attention(q, k, v, attention_);  // (B, H, T, D)
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  return linear(c_proj, y);
}

MLPImpl::MLPImpl(const GPTConfig& cfg, at::TensorOptions o) {
  c_fc = register_module("c_fc", Linear(cfg.n_embd, 4 * cfg.n_embd, true, o));
  c_proj = register_module("c_proj", Linear(4 * cfg.n_embd, cfg.n_embd, true, o));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  return linear(c_proj, at::gelu(linear(c_fc, x), "tanh"));
}

BlockImpl::BlockImpl(const GPTConfig& cfg, at::TensorOptions o) {
  ln_1 = register_module("ln_1", LayerNorm(cfg.n_embd, o, cfg.layer_norm_eps));
  attn = register_module("attn", CausalSelfAttention(cfg, o));
  ln_2 = register_module("ln_2", LayerNorm(cfg.n_embd, o, cfg.layer_norm_eps));
  mlp = register_module("mlp", MLP(cfg, o));
}

at::Tensor BlockImpl::forward(at::Tensor x) {
  x = x + attn(ln_1(x));
  return x + mlp(ln_2(x));
}

GPTImpl::GPTImpl(const GPTConfig& cfg, at::Device device) : cfg_(cfg) {
  check_config(cfg);
  const at::TensorOptions o = at::TensorOptions().device(device);
  wte = register_module("wte", Embedding(cfg.vocab_size, cfg.n_embd, o));
  wpe = register_module("wpe", Embedding(cfg.block_size, cfg.n_embd, o));
  // libtorch forbids dots in submodule names: a ModuleList "h" gives the names h.0, h.1, ...
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.push_back(Block(cfg, o));
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", LayerNorm(cfg.n_embd, o, cfg.layer_norm_eps));
  if (!device.is_meta()) fsdp::init_parameters(*this, gpt_init(cfg));
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > cfg_.block_size) {
    throw std::invalid_argument("GPT forward: sequence length " + std::to_string(T) +
                                " exceeds block_size " + std::to_string(cfg_.block_size));
  }
  auto pos = at::arange(T, idx.options().dtype(at::kLong));  // (T,)
  at::Tensor x = wte(idx) + wpe(pos);                         // (B, T, C)
  for (auto& block : blocks) x = call_block(block, x);
  x = ln_f(x);
  return at::linear(x, wte->weight);  // (B, T, V), head tied to wte
}

at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return at::cross_entropy_loss(logits.reshape({-1, V}), targets.reshape({-1}));
}

}  // namespace apps::models
