// The optimizer-state adapter ([Note: optimizer state adapter] in optimizer_state.h): the only
// dynamic_casts to torch::optim's concrete optimizer types in the library; everything
// kind-specific goes through a codec (optimizer_codec.h).
#include "fsdp/optim/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <memory>

#include "optimizer_codec.h"

namespace fsdp::optim {

namespace detail {

const Codec& codec(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return adamw_codec();
    case OptimizerKind::kAdam: return adam_codec();
    case OptimizerKind::kSGD: break;
  }
  return sgd_codec();
}

}  // namespace detail

namespace {

using detail::codec;
using detail::context;
using detail::join;
using detail::OptimizerOptions;
using detail::type_name;

// The options of the group holding param, else the optimizer's defaults.
const OptimizerOptions& options_for(const torch::optim::Optimizer& o, const at::Tensor& param) {
  auto g = param_group_index(o, param);
  return g ? o.param_groups()[*g].options() : o.defaults();
}

void check_group(const torch::optim::Optimizer& o, size_t group, const ErrorContext& where) {
  FSDP_CHECK(group < o.param_groups().size(), ErrorKind::kInvalidArgument, where, "param group ",
             group, " does not exist: the optimizer has ", o.param_groups().size(), " groups");
}

}  // namespace

const char* to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSGD: return "sgd";
  }
  return "?";
}

const char* supported_optimizers() {
  return "torch::optim::AdamW, torch::optim::Adam, torch::optim::SGD";
}

OptimizerKind optimizer_kind(const torch::optim::Optimizer& optimizer, const ErrorContext& where) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::kSGD;
  throw Error(ErrorKind::kUnsupported, context(where, "optimizer_kind"),
              str_cat("unsupported optimizer type ", type_name(optimizer),
                      " (supported: ", supported_optimizers(), ")"));
}

at::Tensor ParamState::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return t.tensor;
  }
  return at::Tensor();
}

int64_t ParamState::bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.tensor.defined() ? static_cast<int64_t>(t.tensor.nbytes()) : 0;
  return n;
}

std::vector<std::string> state_tensor_names(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, const ErrorContext& where) {
  const OptimizerKind kind = optimizer_kind(optimizer, context(where, "state_tensor_names"));
  return codec(kind).tensor_names(options_for(optimizer, param));
}

std::optional<ParamState> get_param_state(const torch::optim::Optimizer& optimizer,
                                          const at::Tensor& param, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "get_param_state");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  if (it == optimizer.state().end() || !it->second) return std::nullopt;
  ParamState out;
  FSDP_CHECK(codec(kind).read(*it->second, out), ErrorKind::kUnsupported, ctx, "the ",
             to_string(kind), " optimizer holds state of type ",
             type_name(*it->second));
  return out;
}

void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     const ParamState& state, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "set_param_state");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  std::vector<std::string> want = codec(kind).tensor_names(options_for(optimizer, param));
  std::vector<std::string> got;
  for (const auto& t : state.tensors) got.push_back(t.name);
  std::vector<std::string> want_sorted = want, got_sorted = got;
  std::sort(want_sorted.begin(), want_sorted.end());
  std::sort(got_sorted.begin(), got_sorted.end());
  FSDP_CHECK(want_sorted == got_sorted, ErrorKind::kInvalidArgument, ctx,
             expected_actual(str_cat(to_string(kind), " state tensors of a parameter of shape ",
                                     param.sizes()),
                             join(want), join(got)));
  for (const auto& t : state.tensors) {
    FSDP_CHECK(t.tensor.defined() && t.tensor.sizes() == param.sizes(), ErrorKind::kInvalidArgument,
               ctx,
               expected_actual("shape of state tensor '" + t.name + "'", param.sizes(),
                               t.tensor.defined() ? str_cat(t.tensor.sizes()) : "undefined"));
  }
  optimizer.state()[param.unsafeGetTensorImpl()] = codec(kind).make(state);
}

void clear_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ErrorContext& where) {
  optimizer_kind(optimizer, context(where, "clear_param_state"));
  optimizer.state().erase(param.unsafeGetTensorImpl());
}

int64_t state_bytes(const torch::optim::Optimizer& optimizer, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "state_bytes");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  int64_t n = 0;
  for (const auto& kv : optimizer.state()) {
    if (!kv.second) continue;
    ParamState s;
    FSDP_CHECK(codec(kind).read(*kv.second, s), ErrorKind::kUnsupported, ctx, "the ", to_string(kind),
               " optimizer holds state of type ", type_name(*kv.second));
    n += s.bytes();
  }
  return n;
}

std::optional<size_t> param_group_index(const torch::optim::Optimizer& optimizer,
                                        const at::Tensor& param) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& q : groups[g].params()) {
      if (q.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return g;
    }
  }
  return std::nullopt;
}

std::vector<std::string> group_option_names(OptimizerKind kind) {
  return codec(kind).option_names();
}

std::vector<std::string> state_tensor_names(OptimizerKind kind, const GroupOptions& options) {
  return codec(kind).tensor_names(options);
}

GroupOptions group_options(const torch::optim::Optimizer& optimizer, size_t group,
                           const ErrorContext& where) {
  const ErrorContext ctx = context(where, "group_options");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  check_group(optimizer, group, ctx);
  const OptimizerOptions& o = optimizer.param_groups()[group].options();
  auto out = codec(kind).options(o);
  FSDP_CHECK(out.has_value(), ErrorKind::kUnsupported, ctx, "param group ", group, " of the ",
             to_string(kind), " optimizer has options of type ", type_name(o));
  return *out;
}

void set_group_options(torch::optim::Optimizer& optimizer, size_t group, const GroupOptions& options,
                       const ErrorContext& where) {
  const ErrorContext ctx = context(where, "set_group_options");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  check_group(optimizer, group, ctx);
  const std::vector<std::string> valid = codec(kind).option_names();
  for (const auto& kv : options) {
    FSDP_CHECK(std::find(valid.begin(), valid.end(), kv.first) != valid.end(),
               ErrorKind::kInvalidArgument, ctx, to_string(kind),
               " param groups have no option '", kv.first, "' (its options: ", join(valid), ")");
  }
  OptimizerOptions& o = optimizer.param_groups()[group].options();
  for (const auto& kv : options) {
    FSDP_CHECK(codec(kind).set_option(o, kv.first, kv.second), ErrorKind::kUnsupported, ctx,
               "param group ", group, " of the ", to_string(kind), " optimizer has options of type ",
               type_name(o));
  }
}

}  // namespace fsdp::optim
