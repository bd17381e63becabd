#include "autograd_hooks.h"

#include <torch/autograd.h>

#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

FSDPUnit* unit_of(AutogradContext* ctx) {
  return reinterpret_cast<FSDPUnit*>(ctx->saved_data["unit"].toInt());
}

struct PostBackwardFunction : public torch::autograd::Function<PostBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, int64_t unit, at::TensorList inputs) {
    ctx->saved_data["unit"] = unit;
    return variable_list(inputs.begin(), inputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    unit_of(ctx)->post_backward();
    variable_list out;
    out.reserve(grads.size() + 1);
    out.emplace_back();  // unit pointer
    for (auto& g : grads) out.push_back(g);
    return out;
  }
};

struct PreBackwardFunction : public torch::autograd::Function<PreBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, int64_t unit, int64_t index,
                               at::TensorList outputs) {
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["index"] = index;
    return variable_list(outputs.begin(), outputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    unit_of(ctx)->pre_backward(ctx->saved_data["index"].toInt());
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
  auto ptr = reinterpret_cast<int64_t>(&unit);
  return apply_routed(std::move(inputs),
                      [&](at::TensorList sel) { return PostBackwardFunction::apply(ptr, sel); });
}

std::vector<at::Tensor> register_pre_backward(FSDPUnit& unit, int64_t forward_index,
                                              std::vector<at::Tensor> outputs) {
  auto ptr = reinterpret_cast<int64_t>(&unit);
  return apply_routed(std::move(outputs), [&](at::TensorList sel) {
    return PreBackwardFunction::apply(ptr, forward_index, sel);
  });
}

}  // namespace fsdp
