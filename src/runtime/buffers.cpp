#include "buffers.h"

#include <ATen/ATen.h>

#include <map>

#include "unit_registry.h"

namespace fsdp::detail {
std::vector<at::Tensor> unit_buffers(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  visit_unit_modules(module, [&](torch::nn::Module& m, const std::string&) {
    for (const auto& b : m.buffers(/*recurse=*/false)) {
      if (b.defined()) out.push_back(b);
    }
  });
  return out;
}

void broadcast_buffers(torch::nn::Module& root, comm::ProcessGroup& group, const comm::OpTag& tag) {
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
    group.broadcast(wire, 0, comm::OpTag{"", tag.phase, tag.forward_pass, tag.sync_epoch})->wait();
    if (bool_type) packed = wire.to(at::kBool);
    int64_t off = 0;
    for (auto& b : bufs) {
      b.copy_(packed.narrow(0, off, b.numel()).view(b.sizes()));
      off += b.numel();
    }
  }
}

// [Note: buffers] The module's code reads its buffer objects (members such as a BatchNorm's
// running_mean), so the cast copy must be the data of that very object (set_data). An op may save
// the object for backward with its version; so the stored tensor is held through variable_data()
// (same storage, a version counter of its own): writing the statistics back into it bumps no
// version autograd checks, and the object keeps the cast data until its backward has run
// (restore at the end of backward, or at once in a forward without grad).
void BufferCast::begin(const std::vector<at::Tensor>& buffers, c10::ScalarType dtype) {
  if (active()) return;
  at::NoGradGuard no_grad;
  for (const auto& b : buffers) {
    if (!at::isFloatingType(b.scalar_type()) || b.scalar_type() == dtype) continue;
    at::Tensor stored = b.variable_data();  // shares the stored data, not the version counter
    saved_.emplace_back(b, stored);
    b.set_data(stored.to(dtype));
  }
}

void BufferCast::sync_back() {
  at::NoGradGuard no_grad;
  for (auto& [b, stored] : saved_) stored.copy_(b.variable_data());  // rounded once back
}

void BufferCast::restore() {
  for (auto& [b, stored] : saved_) b.set_data(stored);
  saved_.clear();
}

std::optional<std::string> find_running_stats_module(torch::nn::Module& module) {
  std::optional<std::string> found;
  visit_unit_modules(module, [&](torch::nn::Module& m, const std::string& name) {
    if (found) return;
    if (keeps_running_stats(m)) found = (name.empty() ? std::string("(the unit's module)") : name) + " (" + m.name() + ")";
  });
  return found;
}

bool keeps_running_stats(const torch::nn::Module& m) {
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (b.key() == "running_mean" || b.key() == "running_var") return true;
  }
  return false;
}

}  // namespace fsdp::detail
