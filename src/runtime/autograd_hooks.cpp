#include "autograd_hooks.h"

#include <torch/autograd.h>

#include <mutex>
#include <unordered_map>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The graph refers to a unit by its id (never reused); this table turns it back into the unit
// while the unit lives.
struct HookTable {
  std::mutex mu;
  std::unordered_map<int64_t, std::weak_ptr<FSDPUnit>> units;
};

HookTable& hook_table() {
  static auto* t = new HookTable();  // outlives every graph
  return *t;
}

int64_t hook_id(FSDPUnit& unit) {
  auto& t = hook_table();
  const int64_t id = static_cast<int64_t>(unit.id());
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.units.count(id)) return id;
  for (auto it = t.units.begin(); it != t.units.end();) it = it->second.expired() ? t.units.erase(it) : std::next(it);
  t.units.emplace(id, unit.weak_from_this());
  return id;
}

std::shared_ptr<FSDPUnit> unit_of(AutogradContext* ctx, const char* hook) {
  auto& t = hook_table();
  std::shared_ptr<FSDPUnit> unit;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.units.find(ctx->saved_data["unit"].toInt());
    if (it != t.units.end()) unit = it->second.lock();
  }
  FSDP_CHECK(unit != nullptr, ErrorKind::kState,
             (ErrorContext{static_cast<int>(ctx->saved_data["rank"].toInt()), ctx->saved_data["name"].toStringRef(), hook}),
             "the FSDP unit was destroyed while an autograd graph of its forward was alive; keep "
             "the model (and its units) alive until backward has run, or drop the graph (the loss) "
             "before destroying the model");
  return unit;
}

void save_unit(AutogradContext* ctx, FSDPUnit& unit) {
  ctx->saved_data["unit"] = hook_id(unit);
  ctx->saved_data["name"] = unit.name();
  ctx->saved_data["rank"] = static_cast<int64_t>(unit.group()->rank());
}

struct PostBackwardFunction : public torch::autograd::Function<PostBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, FSDPUnit* unit, at::TensorList inputs) {
    save_unit(ctx, *unit);
    return variable_list(inputs.begin(), inputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    unit_of(ctx, "post-backward")->post_backward();
    variable_list out;
    out.reserve(grads.size() + 1);
    out.emplace_back();  // the unit argument
    for (auto& g : grads) out.push_back(g);
    return out;
  }
};

struct PreBackwardFunction : public torch::autograd::Function<PreBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, FSDPUnit* unit, int64_t index,
                               at::TensorList outputs) {
    save_unit(ctx, *unit);
    ctx->saved_data["index"] = index;
    return variable_list(outputs.begin(), outputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    unit_of(ctx, "pre-backward")->pre_backward(ctx->saved_data["index"].toInt());
    variable_list out;
    out.reserve(grads.size() + 2);
    out.emplace_back();
    out.emplace_back();
    for (auto& g : grads) out.push_back(g);
    return out;
  }
};

bool routed(const at::Tensor& t) {
  return t.defined() && t.requires_grad() && at::isFloatingType(t.scalar_type());
}

// Applies fn to the routed tensors of xs and puts its results back in place.
template <typename Fn>
std::vector<at::Tensor> apply_routed(std::vector<at::Tensor> xs, Fn&& fn) {
  if (!at::GradMode::is_enabled()) return xs;
  std::vector<size_t> idx;
  variable_list sel;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (routed(xs[i])) {
      idx.push_back(i);
      sel.push_back(xs[i]);
    }
  }
  if (sel.empty()) return xs;
  variable_list res = fn(at::TensorList(sel));
  for (size_t k = 0; k < idx.size(); ++k) xs[idx[k]] = res[k];
  return xs;
}

}  // namespace

std::vector<at::Tensor> register_post_backward(FSDPUnit& unit, std::vector<at::Tensor> inputs) {
  return apply_routed(std::move(inputs),
                      [&](at::TensorList sel) { return PostBackwardFunction::apply(&unit, sel); });
}

std::vector<at::Tensor> register_pre_backward(FSDPUnit& unit, int64_t forward_index,
                                              std::vector<at::Tensor> outputs) {
  return apply_routed(std::move(outputs), [&](at::TensorList sel) {
    return PreBackwardFunction::apply(&unit, forward_index, sel);
  });
}

}  // namespace fsdp
