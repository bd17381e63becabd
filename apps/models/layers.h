// Layers whose parameters are created on any device (the meta device included) and hold no
// values until an initialisation writes them (fsdp::init_parameters or fsdp::materialize).
// libtorch's torch::nn layers always allocate on the CPU and initialise in their constructors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

namespace apps::models {

/// y = x @ weight^T + bias. weight (out, in), bias (out) or undefined. One fused addmm for a
/// contiguous (B, T, in) input (at::linear). With a LoRA adapter (add_adapter; Hu et al. 2021,
/// "LoRA", eq. 3): y + lora_B(lora_A(dropout(x))) * alpha / r, as PEFT's LoRA layer computes it.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);  // (..., in) -> (..., out)

  /// Registers a LoRA adapter of rank r on this layer: submodules "lora_A" (weight (r, in)) and
  /// "lora_B" (weight (out, r)), no biases, on options' device and dtype, holding no values yet
  /// (models/lora.h initialises them). scaling = alpha / r; dropout p in [0, 1) applies to the
  /// adapter's input in training mode only. Call before fully_shard. Throws std::invalid_argument
  /// for r < 1, alpha <= 0, p outside [0, 1), or a layer that has one already.
  void add_adapter(int64_t r, double alpha, double dropout, at::TensorOptions options);
  bool has_adapter() const { return lora_A != nullptr; }
  /// alpha / r (0 without an adapter).
  double adapter_scaling() const { return lora_scaling_; }

  at::Tensor weight, bias;
  std::shared_ptr<LinearImpl> lora_A, lora_B;  ///< null without an adapter

 private:
  int64_t in_, out_;
  double lora_scaling_ = 0.0;
  double lora_dropout_ = 0.0;
};
TORCH_MODULE(Linear);

/// Token lookup: weight (num, dim); ids int64 (...) -> (..., dim).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num, int64_t dim, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

/// LayerNorm over the last dim with weight and bias (dim): (x - mean) / sqrt(var + eps).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, at::TensorOptions options, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;

 private:
  int64_t dim_;
  double eps_;
};
TORCH_MODULE(LayerNorm);

/// RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (Llama).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

}  // namespace apps::models
