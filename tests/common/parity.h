// Parity harness: an FSDP model on N ranks against a single-process reference trained on the
// concatenation of all ranks' batches with a mean loss (tiers `dist` and `mpi`).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fsdp/fsdp.h"

namespace fsdp_test {

/// max |a-b| and max |a-b|/(|b|+tiny), printed by failing checks.
inline std::string err_summary(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  double abs = d.numel() ? d.max().item<double>() : 0.0;
  double rel = d.numel() ? (d / (b.to(at::kDouble).abs() + 1e-12)).max().item<double>() : 0.0;
  return "max abs err " + std::to_string(abs) + ", max rel err " + std::to_string(rel);
}

/// EXPECTs |a-b| <= atol + rtol*|b| elementwise, same shape; names the tensor on failure.
inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what << ": defined " << actual.defined()
                                                  << " vs expected " << expected.defined();
  if (!actual.defined()) return;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual.to(at::kDouble), expected.to(at::kDouble), rtol, atol))
      << what << ": " << err_summary(actual, expected);
}

/// Reference parameters by name (first name of a shared parameter wins, as in fsdp-cpp).
inline std::map<std::string, at::Tensor> params_by_name(const std::shared_ptr<torch::nn::Module>& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : m->named_parameters()) out.emplace(kv.key(), kv.value());
  return out;
}

/// Compares every sharded parameter (grad when grad is true) of `model` with the reference's.
/// Collective over the units' groups.
inline void compare_with_reference(const std::shared_ptr<torch::nn::Module>& model,
                                   const std::shared_ptr<torch::nn::Module>& ref, bool grad,
                                   double rtol, double atol, const std::string& when) {
  auto ref_params = params_by_name(ref);
  for (const auto& sp : fsdp::sharded_parameters(model)) {
    at::Tensor full = fsdp::gather_full_tensor(*sp.unit, *sp.param, grad);
    auto it = ref_params.find(sp.name);
    ASSERT_TRUE(it != ref_params.end()) << "no reference parameter named " << sp.name;
    at::Tensor expected = grad ? it->second.grad() : it->second.detach();
    expect_close(full, expected, rtol, atol, when + " " + (grad ? "grad of " : "param ") + sp.name);
  }
}

/// One parity run: see the scenario tests for the callbacks.
struct ParityRun {
  std::function<std::shared_ptr<torch::nn::Module>()> make_model;  // deterministic after seeding
  std::function<void(const std::shared_ptr<torch::nn::Module>&, fsdp::comm::ProcessGroupPtr)> shard;
  std::function<at::Tensor(const std::shared_ptr<torch::nn::Module>&, const at::Tensor&)> forward;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> make_optimizer;
  std::function<at::Tensor(const at::Tensor& out, const at::Tensor& y)> loss;
  /// global batch of step s: (x, y) with N*rows_per_rank rows
  std::function<std::pair<at::Tensor, at::Tensor>(int step, int64_t rows)> batch;
  int64_t rows_per_rank = 4;
  int steps = 5;
  double loss_tol = 1e-6, grad_rtol = 1e-5, grad_atol = 1e-6, param_rtol = 1e-5, param_atol = 1e-6;
  double clip_max_norm = 0.0;  // > 0: fsdp::clip_grad_norm vs torch::nn::utils::clip_grad_norm_
  uint64_t seed = 1234;
  /// optional check after each step (after the optimizer step), on the sharded model
  std::function<void(int step, const std::shared_ptr<torch::nn::Module>& model)> after_step;
};

/// Runs the parity scenario on this rank of group; EXPECTs per-step loss, grad and final param
/// parity. Collective.
void run_parity(const ParityRun& run, const fsdp::comm::ProcessGroupPtr& group);

}  // namespace fsdp_test
