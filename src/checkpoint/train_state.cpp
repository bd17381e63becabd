// TrainState helpers: the default CPU generator's state as a tensor (TrainState::tensors["rng"]).
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::checkpoint {

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace fsdp::checkpoint
