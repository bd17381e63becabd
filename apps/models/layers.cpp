#include "models/layers.h"

#include <vector>

#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/rsqrt.h>

namespace apps::models {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool bias, at::TensorOptions options) {
  weight = register_parameter("weight", at::empty({out, in}, options));
  if (bias) this->bias = register_parameter("bias", at::empty({out}, options));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

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
