// The optimizer-state adapter: one interface to the per-parameter state and the param-group options
// of the torch::optim optimizers fsdp-cpp supports (AdamW, Adam, SGD). Checkpoints and memory
// accounting read and write optimizer state only through it, so this is the one place that knows
// each optimizer type. Unknown types are rejected (fsdp::Error, kind kUnsupported), never guessed.
//
// [Note: optimizer state adapter]
// A ParamState is plain data (a step count and named tensors), detached from any optimizer
// object: what get_param_state reads from one optimizer can be written by set_param_state into
// another of the same kind, for instance after narrowing each tensor to some rows of dim 0. With
// sharded parameters (fsdp::sharded_parameters) every state tensor has the shape of this rank's
// rows, (real_rows, d1, ...), and the parameter's dtype and device. Param groups are addressed by
// index; param_group_index finds the group of a parameter, so a caller can key groups by the
// names of their members instead of by position (sharded checkpoints do: docs/checkpoints.md).
//
// read_optimizer_archive reads what libtorch's `torch::save(optimizer, path)` wrote (the layout of
// torch/optim/serialize.h: "state/<key>" per parameter, "param_groups/<i>" with the keys of its
// parameters and its options, a key being the saving process's TensorImpl address) into the same
// plain data, so that the state of a plain single-process run can be narrowed and set into a
// sharded optimizer (fsdp::checkpoint::import_optimizer).
//
// Nothing here is collective or blocks on other ranks: every function touches only the optimizer
// object it is given (not thread-safe against a concurrent step() on it).
#pragma once

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::optim {

/// The optimizer types whose state the adapter knows.
enum class OptimizerKind {
  kAdamW,  ///< torch::optim::AdamW: step, exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad)
  kAdam,   ///< torch::optim::Adam: as AdamW
  kSGD,    ///< torch::optim::SGD: momentum_buffer (only with momentum != 0); no step count
};

/// "adamw", "adam", "sgd" (the names checkpoint manifests store).
const char* to_string(OptimizerKind kind);

/// "torch::optim::AdamW, torch::optim::Adam, torch::optim::SGD" (for error messages).
const char* supported_optimizers();

/// The kind of `optimizer` (a subclass counts as its base). Throws fsdp::Error (kUnsupported,
/// context `where`) naming the optimizer's type and the supported ones for any other type.
OptimizerKind optimizer_kind(const torch::optim::Optimizer& optimizer, const ErrorContext& where = {});

/// One named state tensor of a parameter, e.g. {"exp_avg", (real_rows, d1, ...) float32}.
struct StateTensor {
  std::string name;
  at::Tensor tensor;
};

/// The state an optimizer keeps for one parameter, as plain data.
struct ParamState {
  /// Optimizer steps applied to the parameter (AdamW/Adam); 0 for SGD, which counts none.
  int64_t step = 0;
  /// The defined state tensors, in the order of state_tensor_names(). Each has the parameter's
  /// shape; get_param_state returns the optimizer's own tensors (no copy).
  std::vector<StateTensor> tensors;

  /// The tensor named `name`, or an undefined tensor.
  at::Tensor find(const std::string& name) const;
  /// Sum of nbytes() over the tensors.
  int64_t bytes() const;
};

/// The names of the state tensors `optimizer` keeps for `param` once it has stepped it, from the
/// options of the param group holding it (the optimizer's defaults when no group does):
/// AdamW/Adam {"exp_avg", "exp_avg_sq"} plus "max_exp_avg_sq" with amsgrad; SGD
/// {"momentum_buffer"}. Throws fsdp::Error (kUnsupported) for an unknown optimizer type.
std::vector<std::string> state_tensor_names(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, const ErrorContext& where = {});

/// The state `optimizer` holds for `param` (keyed by param's TensorImpl, as torch::optim does), or
/// nullopt when it holds none (never stepped, frozen, SGD without momentum). The tensors alias the
/// optimizer's. Throws fsdp::Error (kUnsupported) for an unknown optimizer type or a state object
/// of another type than the optimizer's.
std::optional<ParamState> get_param_state(const torch::optim::Optimizer& optimizer,
                                          const at::Tensor& param, const ErrorContext& where = {});

/// Replaces the state `optimizer` holds for `param` with `state` (a new state object of the
/// optimizer's kind; the tensors are stored as given, not copied: pass tensors with param's dtype
/// and device). state.tensors must be exactly state_tensor_names(optimizer, param), in any order,
/// each defined and of param's shape; otherwise fsdp::Error (kInvalidArgument, expected vs actual)
/// and the optimizer is unchanged. Throws kUnsupported for an unknown optimizer type.
void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     const ParamState& state, const ErrorContext& where = {});

/// Removes any state `optimizer` holds for `param` (the next step starts it afresh). Throws
/// fsdp::Error (kUnsupported) for an unknown optimizer type.
void clear_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ErrorContext& where = {});

/// Bytes of every state tensor `optimizer` holds, over all its parameters: the sum of
/// get_param_state(...)->bytes(). Throws fsdp::Error (kUnsupported) for an unknown optimizer type.
int64_t state_bytes(const torch::optim::Optimizer& optimizer, const ErrorContext& where = {});

/// Index of the param group of `optimizer` that holds `param` (by TensorImpl), or nullopt.
std::optional<size_t> param_group_index(const torch::optim::Optimizer& optimizer,
                                        const at::Tensor& param);

/// A param group's hyperparameters by name, booleans as 0 or 1:
///   AdamW/Adam: lr, beta1, beta2, eps, weight_decay, amsgrad
///   SGD:        lr, momentum, dampening, weight_decay, nesterov
using GroupOptions = std::map<std::string, double>;

/// The option names of `kind`'s param groups (the keys of GroupOptions above), sorted.
std::vector<std::string> group_option_names(OptimizerKind kind);

/// The names of the state tensors a parameter gets once stepped by an optimizer of `kind` whose
/// group has `options` (only amsgrad matters: AdamW/Adam with amsgrad != 0 add "max_exp_avg_sq");
/// options may be partial. The same rule as state_tensor_names above.
std::vector<std::string> state_tensor_names(OptimizerKind kind, const GroupOptions& options);

/// The options of param group `group` of `optimizer`. Throws fsdp::Error (kInvalidArgument) when
/// group >= param_groups().size(), kUnsupported for an unknown optimizer type.
GroupOptions group_options(const torch::optim::Optimizer& optimizer, size_t group,
                           const ErrorContext& where = {});

/// Sets the options named in `options` on param group `group` (the others keep their values).
/// Throws fsdp::Error (kInvalidArgument) for a group out of range or a name the optimizer's kind
/// does not have (the message lists the valid names), before changing anything; kUnsupported
/// for an unknown optimizer type.
void set_group_options(torch::optim::Optimizer& optimizer, size_t group, const GroupOptions& options,
                       const ErrorContext& where = {});

/// One param group of an optimizer archive.
struct ArchivedParamGroup {
  /// The archive's keys of the group's parameters, in the group's order: the TensorImpl address
  /// each had in the process that saved it, in decimal (torch/optim/serialize.h). A key may be
  /// listed twice (a tensor given twice, e.g. a tied parameter under two names).
  std::vector<std::string> param_keys;
  GroupOptions options;  ///< as group_options() names them
};

/// What `torch::save(optimizer, path)` of a torch::optim optimizer holds, as plain data.
struct ArchivedOptimizer {
  std::vector<ArchivedParamGroup> groups;  ///< in the optimizer's order
  /// key -> the parameter's state; its tensors are full (the saving process's parameter shape),
  /// CPU, as saved. Parameters without state (never stepped; SGD without momentum) are absent.
  std::map<std::string, ParamState> state;
};

/// Reads an archive written by `torch::save(optimizer, ...)` (libtorch C++ API) of an optimizer of
/// `kind` (torch::serialize::InputArchive::load_from opens the file). Adam and AdamW archives have
/// the same layout and cannot be told apart: either reads as either. Not collective; reads only
/// `archive`. Throws fsdp::Error (context `where`): kCorruptData when the archive is not an
/// optimizer archive (no "pytorch_version", "state" or "param_groups": e.g. a saved module) or
/// an entry is malformed (naming the entry); kInvalidArgument when it holds another optimizer
/// type (the message names the type its options look like, e.g. "torch::optim::SGD", and the
/// expected one).
ArchivedOptimizer read_optimizer_archive(torch::serialize::InputArchive& archive, OptimizerKind kind,
                                         const ErrorContext& where = {});

}  // namespace fsdp::optim
