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
  return {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp,
          fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kHybridShard,
          fsdp::ShardingStrategy::kZero1};
}

/// Shard group size the tests use for hybrid_shard at world size N: N/2 for even N >= 4 (4 = 2x2),
/// 1 otherwise (N = 2: 1x2, N = 1, 3: one rank per shard group, all ranks replicas).
inline int hybrid_size_for(int world) { return world >= 4 && world % 2 == 0 ? world / 2 : 1; }

/// Options of strategy s at world size `world` (0: unknown, hybrid then shards over the whole group).
inline fsdp::FullyShardOptions options_for(fsdp::ShardingStrategy s, int world = 0) {
  fsdp::FullyShardOptions o;
  o.strategy = s;
  if (s == fsdp::ShardingStrategy::kHybridShard && world > 0) {
    o.hybrid_shard_group_size = hybrid_size_for(world);
  }
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
