#include "fsdp/accounting/memory.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "../runtime/scheduler.h"

namespace fsdp::accounting {

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t n = 0;
  auto bytes = [](const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  for (const auto& kv : optimizer.state()) {
    const auto* st = kv.second.get();
    if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(st)) {
      n += bytes(a->exp_avg()) + bytes(a->exp_avg_sq()) + bytes(a->max_exp_avg_sq());
    } else if (auto* b = dynamic_cast<const torch::optim::AdamParamState*>(st)) {
      n += bytes(b->exp_avg()) + bytes(b->exp_avg_sq()) + bytes(b->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(st)) {
      n += bytes(s->momentum_buffer());
    } else {
      throw Error("[fsdp] optimizer_state_bytes: unknown optimizer state type (Adam, AdamW, SGD "
                  "are known)");
    }
  }
  return n;
}

ModelStateBytes model_state_bytes(const std::shared_ptr<torch::nn::Module>& root,
                                  const torch::optim::Optimizer* optimizer) {
  ModelStateBytes m;
  for (const auto& u : units_of(root)) {
    m.sharded_param_bytes += u->sharded_param_bytes();
    m.sharded_grad_bytes += u->sharded_grad_bytes();
    m.unsharded_param_bytes += u->unsharded_param_bytes();
    m.unsharded_grad_bytes += u->unsharded_grad_bytes();
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
