#include "fsdp/runtime/model_state.h"

#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "fsdp/runtime/fully_shard.h"
#include "scheduler.h"

namespace fsdp::accounting {

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  return optim::state_bytes(optimizer, ErrorContext{-1, "", "optimizer_state_bytes"});
}

ModelStateBytes model_state_bytes(const std::shared_ptr<torch::nn::Module>& root,
                                  const torch::optim::Optimizer* optimizer) {
  ModelStateBytes m;
  for (const auto& u : units_of(root)) {
    m.sharded_param_bytes += u->sharded_param_bytes();
    m.sharded_grad_bytes += u->sharded_grad_bytes();
    m.unsharded_param_bytes += u->unsharded_param_bytes();
    m.unsharded_grad_bytes += u->unsharded_grad_bytes();
    m.node_shard_bytes += u->node_shard_bytes();
    if (u->is_root()) m.peak_unsharded_param_bytes = u->scheduler()->peak_unsharded_param_bytes();
  }
  if (optimizer) m.optim_state_bytes = optimizer_state_bytes(*optimizer);
  return m;
}

void reset_peak_unsharded_bytes(const std::shared_ptr<torch::nn::Module>& root) {
  for (const auto& u : units_of(root)) {
    if (u->is_root()) u->scheduler()->reset_peak_unsharded_param_bytes();
  }
}

}  // namespace fsdp::accounting
