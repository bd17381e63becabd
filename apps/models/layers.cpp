#include "models/layers.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/rsqrt.h>

namespace apps::models {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool bias, at::TensorOptions options) : in_(in), out_(out) {
  weight = register_parameter("weight", at::empty({out, in}, options));
  if (bias) this->bias = register_parameter("bias", at::empty({out}, options));
}

void LinearImpl::add_adapter(int64_t r, double alpha, double dropout, at::TensorOptions options) {
  if (lora_A) throw std::invalid_argument("this Linear has a LoRA adapter already");
  if (r < 1) throw std::invalid_argument("LoRA rank " + std::to_string(r) + " is not >= 1");
  if (!(alpha > 0)) throw std::invalid_argument("LoRA alpha " + std::to_string(alpha) + " is not > 0");
  if (!(dropout >= 0 && dropout < 1)) {
    throw std::invalid_argument("LoRA dropout " + std::to_string(dropout) + " is outside [0, 1)");
  }
  lora_A = register_module("lora_A", std::make_shared<LinearImpl>(in_, r, false, options));
  lora_B = register_module("lora_B", std::make_shared<LinearImpl>(r, out_, false, options));
  lora_scaling_ = alpha / static_cast<double>(r);
  lora_dropout_ = dropout;
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight, bias);
  if (!lora_A) return y;
  const at::Tensor h = lora_dropout_ > 0 && is_training() ? at::dropout(x, lora_dropout_, /*train=*/true) : x;
  return y + at::linear(at::linear(h, lora_A->weight), lora_B->weight) * lora_scaling_;
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim, at::TensorOptions options) {
  weight = register_parameter("weight", at::empty({num, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  if (!ids.is_meta()) return at::embedding(weight, ids);
  // A dry run: libtorch's C++ build has no meta kernel for index_select, so a (..., num)
  // placeholder times weight gives the output shape and the weight's gradient shape.
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(weight.size(0));
  return at::matmul(at::zeros(shape, weight.options()), weight);
}

LayerNormImpl::LayerNormImpl(int64_t dim, at::TensorOptions options, double eps) : dim_(dim), eps_(eps) {
  weight = register_parameter("weight", at::empty({dim}, options));
  bias = register_parameter("bias", at::empty({dim}, options));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  if (!x.is_meta()) return at::layer_norm(x, {dim_}, weight, bias, eps_);
  // A dry run: libtorch's C++ build has no meta kernel for layer_norm; the same normalisation
  // from reductions, which have meta kernels (same shapes, same parameter gradients).
  at::Tensor c = x - x.mean(-1, true);
  return c * at::rsqrt((c * c).mean(-1, true) + eps_) * weight + bias;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, at::TensorOptions options) : eps_(eps) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return y.to(x.scalar_type()) * weight;
}

}  // namespace apps::models
