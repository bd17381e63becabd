// Small models of the acceptance scenarios (shared/SCENARIOS.md). Sharded submodules are called
// through fsdp::call.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "fsdp/runtime/activation_checkpoint.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp_test {

/// fc2(act(fc1(x))), act tanh or relu, plus an optional extra parameter of `extra_numel` elements
/// added to the output (S2's 5-element parameter).
struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t in, int64_t hidden, int64_t out, bool relu = false, int64_t extra_numel = 0)
      : relu(relu) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
    if (extra_numel > 0) extra = register_parameter("extra", torch::randn({extra_numel}) * 0.1);
    out_features = out;
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = fsdp::call(fc1, x);
    h = relu ? torch::relu(h) : torch::tanh(h);
    at::Tensor y = fsdp::call(fc2, h);
    if (extra.defined()) {
      // every element of extra reaches the loss: first out_features add, the rest scale
      int64_t k = std::min<int64_t>(extra.numel(), out_features);
      y = y + extra.narrow(0, 0, k).sum() * 0.1;
      if (extra.numel() > k) y = y * (1 + extra.narrow(0, k, extra.numel() - k).sum() * 0.1);
    }
    return y;
  }
  bool relu;
  int64_t out_features;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor extra;
};
TORCH_MODULE(MLP);

/// Linear chain l0 -> l1 -> ... (no activation), S6.
struct ChainImpl : torch::nn::Module {
  explicit ChainImpl(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(register_module("l" + std::to_string(i),
                                       torch::nn::Linear(widths[i], widths[i + 1])));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& l : layers) x = checkpoint_layers ? fsdp::call_checkpointed(l, x) : fsdp::call(l, x);
    return x;
  }
  std::vector<torch::nn::Linear> layers;
  bool checkpoint_layers = false;  ///< each layer through fsdp::call_checkpointed
};
TORCH_MODULE(Chain);

/// Chain(widths) with every param drawn from a generator of its own seeded with `seed` (x 0.3):
/// the same values on every thread of a threaded group, which share the global generator.
inline Chain seeded_chain(const std::vector<int64_t>& widths, uint64_t seed) {
  Chain model(widths);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  return model;
}

/// A small pre-LayerNorm transformer block (attention + GELU MLP), the unit of the transformer
/// parity tests.
struct TinyBlockImpl : torch::nn::Module {
  TinyBlockImpl(int64_t d, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    // No qkv bias: the key bias gets an exactly-zero gradient (softmax is shift invariant), so its
    // rounding noise would be amplified by Adam's normalisation in any two runs that sum in a
    // different order, sharded or not.
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(false)));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    out = register_module("out", torch::nn::Linear(4 * d, d));
  }
  at::Tensor forward(at::Tensor x) {  // (B, T, d)
    auto B = x.size(0), T = x.size(1), d = x.size(2);
    auto q_k_v = qkv(ln1(x)).view({B, T, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto a = at::scaled_dot_product_attention(q_k_v[0], q_k_v[1], q_k_v[2], {}, 0.0, true);
    x = x + proj(a.transpose(1, 2).reshape({B, T, d}));
    return x + out(torch::gelu(fc(ln2(x)), "tanh"));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(TinyBlock);

/// Token + position embedding, blocks, final LayerNorm, head tied to the token embedding.
struct TinyTransformerImpl : torch::nn::Module {
  TinyTransformerImpl(int64_t vocab, int64_t d, int64_t heads, int64_t layers, int64_t ctx) {
    wte = register_parameter("wte", torch::randn({vocab, d}) * 0.02);
    wpe = register_parameter("wpe", torch::randn({ctx, d}) * 0.02);
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("h" + std::to_string(i), TinyBlock(d, heads)));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  }
  at::Tensor forward(at::Tensor idx) {  // (B, T) int64 -> logits (B, T, vocab)
    auto T = idx.size(1);
    at::Tensor x = at::embedding(wte, idx) + wpe.narrow(0, 0, T);
    for (auto& b : blocks) x = fsdp::call(b, x);
    return at::matmul(ln_f(x), wte.t());
  }
  at::Tensor wte, wpe;
  std::vector<TinyBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(TinyTransformer);

}  // namespace fsdp_test
