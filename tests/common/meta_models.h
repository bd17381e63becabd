// A small model that builds on any device (the meta device included) and initialises through an
// fsdp::ModuleInit, for the deferred-initialisation and dry-run tests.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>

#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/materialize.h"

namespace fsdp_test {

/// x @ weight^T + bias: weight (out, in), bias (out) or none.
struct DevLinearImpl : torch::nn::Module {
  DevLinearImpl(int64_t in, int64_t out, bool bias, at::TensorOptions o) {
    weight = register_parameter("weight", at::empty({out, in}, o));
    if (bias) this->bias = register_parameter("bias", at::empty({out}, o));
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;
};
TORCH_MODULE(DevLinear);

/// x + fc2(gelu(fc1(layer_norm(x; norm)))): the unit of the tests.
struct DevBlockImpl : torch::nn::Module {
  DevBlockImpl(int64_t d, int64_t hidden, at::TensorOptions o) : d(d) {
    norm = register_parameter("norm", at::empty({d}, o));
    fc1 = register_module("fc1", DevLinear(d, hidden, true, o));
    fc2 = register_module("fc2", DevLinear(hidden, d, true, o));
  }
  at::Tensor forward(at::Tensor x) {
    // libtorch's C++ build has no meta kernel for native_layer_norm's CPU path: on meta (a dry
    // run) the same normalisation from reductions, which have meta kernels.
    at::Tensor c = x - x.mean(-1, true);
    at::Tensor h = x.is_meta() ? c * at::rsqrt((c * c).mean(-1, true) + 1e-5) * norm : at::layer_norm(x, {d}, norm, {});
    return x + fc2(at::gelu(fc1(h), "tanh"));
  }
  int64_t d;
  at::Tensor norm;
  DevLinear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DevBlock);

/// Embedding wte (vocab, d) on the root, blocks b0..b{L-1}, an untied head (vocab, d) registered
/// after the blocks: the root unit owns params on both sides of its child units.
struct DevNetImpl : torch::nn::Module {
  DevNetImpl(int64_t vocab, int64_t d, int64_t hidden, int64_t layers, at::TensorOptions o) {
    wte = register_parameter("wte", at::empty({vocab, d}, o));
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), DevBlock(d, hidden, o)));
    }
    head = register_module("head", DevLinear(d, vocab, false, o));
  }
  at::Tensor forward(const at::Tensor& idx) {  // (B, T) int64 -> (B, T, vocab)
    // libtorch's C++ build has no meta kernel for index_select: on meta (a dry run) a (B, T, vocab)
    // placeholder times wte gives the same output shape and the same gradient shape for wte.
    at::Tensor x = idx.is_meta() ? at::matmul(at::zeros(at::IntArrayRef({idx.size(0), idx.size(1), wte.size(0)}),
                                                        wte.options()), wte)
                                 : at::embedding(wte, idx);
    for (auto& b : blocks) x = fsdp::call(b, x);
    return head(x);
  }
  at::Tensor wte;
  std::vector<DevBlock> blocks;
  DevLinear head{nullptr};
};
TORCH_MODULE(DevNet);

/// The init of DevNet: every tensor drawn from the global generator (normal, kaiming-uniform,
/// uniform), so that any change of order or size changes the values.
inline void dev_net_init(const std::string&, torch::nn::Module& m) {
  if (auto* net = dynamic_cast<DevNetImpl*>(&m)) {
    torch::nn::init::normal_(net->wte, 0.0, 0.02);
  } else if (auto* b = dynamic_cast<DevBlockImpl*>(&m)) {
    torch::nn::init::uniform_(b->norm, 0.9, 1.1);
  } else if (auto* l = dynamic_cast<DevLinearImpl*>(&m)) {
    torch::nn::init::kaiming_uniform_(l->weight, std::sqrt(5.0));
    if (l->bias.defined()) torch::nn::init::uniform_(l->bias, -0.1, 0.1);
  }
}

}  // namespace fsdp_test
