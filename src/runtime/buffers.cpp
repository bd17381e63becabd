#include "buffers.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>

#include "fsdp/runtime/fully_shard.h"

namespace fsdp::detail {
namespace {

// Visits module's subtree, skipping nested units (and the unit holder modules).
void visit_unit_modules(torch::nn::Module& m, const std::string& prefix, bool top,
                        const std::function<void(torch::nn::Module&, const std::string&)>& fn) {
  if (!top && find_unit(&m)) return;
  fn(m, prefix);
  for (const auto& c : m.named_children()) {
    visit_unit_modules(*c.value(), prefix.empty() ? c.key() : prefix + "." + c.key(), false, fn);
  }
}

}  // namespace

std::vector<at::Tensor> unit_buffers(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  visit_unit_modules(module, "", true, [&](torch::nn::Module& m, const std::string&) {
    for (const auto& b : m.buffers(/*recurse=*/false)) {
      if (b.defined()) out.push_back(b);
    }
  });
  return out;
}

void broadcast_buffers(torch::nn::Module& root, comm::ProcessGroup& group) {
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& b : root.buffers(/*recurse=*/true)) {
    if (b.defined() && b.numel() > 0) by_dtype[b.scalar_type()].push_back(b);
  }
  for (auto& [dtype, bufs] : by_dtype) {
    std::vector<at::Tensor> flat;
    for (const auto& b : bufs) flat.push_back(b.reshape({-1}));
    at::Tensor packed = at::cat(flat);
    const bool bool_type = dtype == at::kBool;  // moved as bytes
    at::Tensor wire = bool_type ? packed.to(at::kByte) : packed;
    group.broadcast(wire, 0, comm::OpTag{"", "buffers"})->wait();
    if (bool_type) packed = wire.to(at::kBool);
    int64_t off = 0;
    for (auto& b : bufs) {
      b.copy_(packed.narrow(0, off, b.numel()).view(b.sizes()));
      off += b.numel();
    }
  }
}

void BufferCast::begin(const std::vector<at::Tensor>& buffers, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (const auto& b : buffers) {
    if (!at::isFloatingType(b.scalar_type()) || b.scalar_type() == dtype) continue;
    at::Tensor original = b.detach();  // shares the stored data
    saved_.emplace_back(b, original);
    b.set_data(original.to(dtype));
  }
}

void BufferCast::end() {
  at::NoGradGuard no_grad;
  for (auto& [b, original] : saved_) {
    original.copy_(b.detach());  // statistics updated in forward, rounded once back
    b.set_data(original);
  }
  saved_.clear();
}

std::optional<std::string> find_running_stats_module(torch::nn::Module& module) {
  std::optional<std::string> found;
  visit_unit_modules(module, "", true, [&](torch::nn::Module& m, const std::string& name) {
    if (found) return;
    for (const auto& b : m.named_buffers(/*recurse=*/false)) {
      if (b.key() == "running_mean" || b.key() == "running_var") {
        found = (name.empty() ? std::string("(the unit's module)") : name) + " (" + m.name() + ")";
        return;
      }
    }
  });
  return found;
}

}  // namespace fsdp::detail
