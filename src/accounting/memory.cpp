#include "fsdp/accounting/memory.h"

#include <c10/core/CPUAllocator.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <mutex>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "../runtime/root_context.h"

namespace fsdp::accounting {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

void add_bytes(int64_t n) {
  int64_t now = g_current.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Wraps the allocator that was current at install time; every allocation carries a small context
// holding the inner DataPtr and its size, so that frees are counted exactly.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    c10::Device device = inner.device();
    auto* ctx = new Ctx{std::move(inner), static_cast<int64_t>(n)};
    add_bytes(ctx->bytes);
    return c10::DataPtr(data, ctx, &CountingAllocator::release, device);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  struct Ctx {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void release(void* p) {
    auto* ctx = static_cast<Ctx*>(p);
    g_current.fetch_sub(ctx->bytes);
    delete ctx;  // frees through the inner allocator's deleter
  }
  c10::Allocator* inner_;
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator alloc(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&alloc, /*priority=*/200);
    g_installed = true;
  });
}

bool counting_allocator_installed() { return g_installed.load(); }
int64_t current_bytes() { return g_current.load(); }
int64_t peak_bytes() { return g_peak.load(); }
void reset_peak_bytes() { g_peak.store(g_current.load()); }

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
    if (u->is_root()) m.peak_unsharded_param_bytes = u->root_context()->peak_unsharded_param_bytes;
  }
  if (optimizer) m.optim_state_bytes = optimizer_state_bytes(*optimizer);
  return m;
}

void reset_peak_unsharded_bytes(const std::shared_ptr<torch::nn::Module>& root) {
  for (const auto& u : units_of(root)) {
    if (u->is_root()) {
      auto ctx = u->root_context();
      ctx->peak_unsharded_param_bytes = ctx->unsharded_param_bytes;
    }
  }
}

}  // namespace fsdp::accounting
