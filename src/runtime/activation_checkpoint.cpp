// Activation checkpointing (activation_checkpoint.h) and the unit-use record its recompute
// replays (checkpoint_region.h). docs/architecture.md, "[Note: activation checkpointing]".
#include "fsdp/runtime/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include <mutex>

#include "checkpoint_region.h"
#include "fsdp/runtime/fsdp_unit.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"
#include "scheduler.h"

namespace fsdp {
namespace detail {
namespace {

thread_local CheckpointRegion* t_region = nullptr;
thread_local RegionScope::Mode t_mode = RegionScope::Mode::kRecord;

}  // namespace

CheckpointRegion* recording_region() { return t_region && t_mode == RegionScope::Mode::kRecord ? t_region : nullptr; }
CheckpointRegion* replaying_region() { return t_region && t_mode == RegionScope::Mode::kReplay ? t_region : nullptr; }

RegionScope::RegionScope(CheckpointRegion& region, Mode mode) {
  FSDP_CHECK(t_region == nullptr, ErrorKind::kUnsupported, (ErrorContext{-1, "", "checkpoint_activations"}),
             "a checkpointed region inside another region's ",
             t_mode == Mode::kRecord ? "forward" : "recompute",
             " (nested activation checkpointing) is not supported: checkpoint the outer region or the inner "
             "ones, not both");
  t_region = &region;
  t_mode = mode;
}

RegionScope::~RegionScope() { t_region = nullptr; }

int64_t take_replayed_use(CheckpointRegion& region, const FSDPUnit& unit, const ErrorContext& where) {
  std::shared_ptr<FSDPUnit> expected = region.next < region.uses.size() ? region.uses[region.next].unit.lock() : nullptr;
  FSDP_CHECK(expected.get() == &unit, ErrorKind::kState, where,
             "the recompute of an activation-checkpointed region called this unit as its use #", region.next + 1,
             ", but its forward ",
             expected ? "called unit '" + expected->name() + "' there" : str_cat("made ", region.uses.size(), " unit uses"),
             "; the region's forward must take the same path when it is re-run in backward");
  return region.uses[region.next++].forward_index;
}

void CheckpointRegion::ensure_final_callback() const {
  for (const auto& use : uses) {
    if (auto unit = use.unit.lock()) {
      if (unit->scheduler()) unit->scheduler()->ensure_final_callback();
      return;  // every unit of a region belongs to the tree of the first one
    }
  }
}

}  // namespace detail

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What one region keeps for its backward besides its inputs: the forward to re-run, the unit
// uses to replay and the CPU generator state the forward started from.
struct RegionState : torch::CustomClassHolder {
  RegionForward fn;
  detail::CheckpointRegion region;
  at::Tensor rng_state;  // uint8, at::Generator::get_state() of the default CPU generator
};

at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Puts the CPU generator back to `state` when the scope ends (also when the recompute throws).
struct RestoreRng {
  at::Tensor state;
  ~RestoreRng() { set_cpu_rng_state(state); }
};

// The autograd node of one region. Arguments: the region's state, its inputs, and `anchor`, a
// 0-element leaf that requires grad so that the node is part of the graph (and its backward runs,
// giving the parameters inside their gradients) even when no input requires grad.
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<RegionState> state,
                               at::TensorList inputs, const at::Tensor& anchor) {
    // Function::apply runs this under no grad: nothing inside fn is saved for backward.
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    state->rng_state = cpu_rng_state();
    std::vector<at::Tensor> out;
    {
      detail::RegionScope record(state->region, detail::RegionScope::Mode::kRecord);
      ActivityScope activity(nullptr, "forward (checkpointed)");
      out = state->fn(in);
    }
    ctx->save_for_backward(in);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<RegionState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    // On the outer backward pass, before the nested one starts (see [Note: activation checkpointing]).
    state->region.ensure_final_callback();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const auto& x : saved) {
      at::Tensor leaf = x.defined() ? x.detach() : x;
      if (x.defined() && x.requires_grad()) leaf.requires_grad_(true);
      inputs.push_back(leaf);
    }
    std::vector<at::Tensor> outputs;
    {
      RestoreRng restore{cpu_rng_state()};
      set_cpu_rng_state(state->rng_state);
      at::AutoGradMode grad(true);
      state->region.next = 0;
      detail::RegionScope replay(state->region, detail::RegionScope::Mode::kReplay);
      ActivityScope activity(nullptr, "backward (recompute)");
      outputs = state->fn(inputs);
    }
    FSDP_CHECK(state->region.next == state->region.uses.size(), ErrorKind::kState,
               (ErrorContext{-1, "", "checkpoint_activations"}),
               expected_actual("FSDP unit uses in the recompute of a checkpointed region (the forward's)",
                               state->region.uses.size(), state->region.next),
               "; the region's forward must take the same path when it is re-run in backward");
    FSDP_CHECK(outputs.size() == grad_outputs.size(), ErrorKind::kState,
               (ErrorContext{-1, "", "checkpoint_activations"}),
               expected_actual("outputs of the recomputed region", grad_outputs.size(), outputs.size()));
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    result.reserve(inputs.size() + 2);
    result.emplace_back();  // the state
    for (const auto& x : inputs) result.push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    result.emplace_back();  // the anchor
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint_activations(RegionForward fn, const std::vector<at::Tensor>& inputs) {
  FSDP_CHECK(static_cast<bool>(fn), ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "checkpoint_activations"}),
             "the region's forward is empty");
  FSDP_CHECK(!detail::recording_region() && !detail::replaying_region(), ErrorKind::kUnsupported,
             (ErrorContext{-1, "", "checkpoint_activations"}),
             "a checkpointed region inside another region (nested activation checkpointing) is not "
             "supported: checkpoint the outer region or the inner ones, not both");
  if (!at::GradMode::is_enabled()) return fn(inputs);  // nothing would be saved anyway
  auto state = c10::make_intrusive<RegionState>();
  state->fn = std::move(fn);
  at::Tensor anchor = at::empty({0}, at::kFloat).requires_grad_(true);
  return CheckpointFunction::apply(state, at::TensorList(inputs), anchor);
}

at::Tensor checkpoint_activations(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input) {
  FSDP_CHECK(static_cast<bool>(fn), ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "checkpoint_activations"}),
             "the region's forward is empty");
  RegionForward many = [fn = std::move(fn)](const std::vector<at::Tensor>& xs) {
    return std::vector<at::Tensor>{fn(xs.at(0))};
  };
  return checkpoint_activations(std::move(many), std::vector<at::Tensor>{input}).at(0);
}

}  // namespace fsdp
