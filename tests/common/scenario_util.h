// Helpers shared by the scenario tests.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <vector>

#include "fsdp/runtime/options.h"

namespace fsdp_test {

/// Strategies this build implements; parity scenarios run each of them.
inline std::vector<fsdp::ShardingStrategy> implemented_strategies() {
  return {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp};
}

inline fsdp::FullyShardOptions options_for(fsdp::ShardingStrategy s) {
  fsdp::FullyShardOptions o;
  o.strategy = s;
  return o;
}

inline auto sgd(double lr, double momentum = 0.0) {
  return [=](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr).momentum(momentum));
  };
}
inline auto adamw(double lr, double wd) {
  return [=](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr).weight_decay(wd));
  };
}
inline auto adam(double lr) {
  return [=](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr));
  };
}

/// Deterministic regression batch: x (rows, in), y (rows, out), same on every rank.
inline std::pair<at::Tensor, at::Tensor> regression_batch(int step, int64_t rows, int64_t in,
                                                          int64_t out) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({rows, in}, gen);
  at::Tensor y = at::randn({rows, out}, gen);
  return {x, y};
}

}  // namespace fsdp_test
