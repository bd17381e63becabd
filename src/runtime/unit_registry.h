// The unit registry (internal): which module a unit wraps and which unit manages a parameter, and
// the walk over the modules a unit computes with. Below fully_shard (the public API, which fills
// it) and used by the unit, the buffers and the tree's lazy init. [Note: unit ownership] in
// unit_registry.cpp.
#pragma once

#include <c10/core/TensorImpl.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {
class FSDPUnit;

namespace detail {

/// The name of the child module through which fully_shard attaches its unit to the wrapped module
/// ([Note: unit ownership]); tree walks skip it.
inline constexpr const char* kStateChildName = "_fsdp_state";

/// The unit that wraps exactly `module`, or nullptr (also once the unit or its module died).
/// Thread-safe.
std::shared_ptr<FSDPUnit> registered_unit(const torch::nn::Module* module);
/// Every unit in root's subtree (root included if it is one), in module pre-order. Thread-safe.
std::vector<std::shared_ptr<FSDPUnit>> registered_units_under(const torch::nn::Module& root);
/// The unit that manages the parameter whose TensorImpl is `param`, or nullptr. Thread-safe.
std::shared_ptr<FSDPUnit> param_owner(const c10::TensorImpl* param);
/// Records that `unit` wraps `module` and manages its params (FSDPUnit::params()). Thread-safe.
void register_unit(const torch::nn::Module* module, const std::shared_ptr<FSDPUnit>& unit);
/// Drops the entries of units that died with their modules. Thread-safe.
void prune_registry();

/// Visits the modules `top`'s unit computes with: top's subtree in pre-order, children in
/// registration order, skipping the subtrees of nested units (a module wrapped by another unit
/// below `top`) and the unit holder children. fn(module, path): path is dotted from top ("" for
/// top itself, "a.b" below it). Whether top is a unit does not matter.
void visit_unit_modules(torch::nn::Module& top,
                        const std::function<void(torch::nn::Module&, const std::string& path)>& fn);

/// Names every unit of root's tree by its path from root ("root" for root itself).
void name_units_by_path(torch::nn::Module& root);

}  // namespace detail
}  // namespace fsdp
