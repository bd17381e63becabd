// Full (unsharded) state dict of a sharded model: gather and load, one parameter at a time.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp {

/// The full tensor of one sharded parameter (or of its sharded gradient when grad is true), shape
/// as the module declared it, original dtype. Collective and blocking over the unit's group (one
/// all-gather of rows_per_rank rows per rank); every rank gets the result. A rank without a
/// gradient contributes zeros; returns an undefined tensor on every rank when no rank has one.
at::Tensor gather_full_tensor(FSDPUnit& unit, const FSDPParam& param, bool grad = false);

/// Every sharded parameter under root as (fully qualified name, full tensor), gathered one
/// parameter at a time (peak extra memory: one full parameter). Collective and blocking; all
/// ranks get the tensors.
std::vector<std::pair<std::string, at::Tensor>> full_state_dict(
    const std::shared_ptr<torch::nn::Module>& root);

/// Copies this rank's rows of each full tensor into the sharded parameters under root (padding
/// stays zero). Validates every name and shape first and throws fsdp::Error (naming the rank, the
/// parameter, expected vs actual shape, or the missing / unexpected names) before writing anything,
/// so a bad dict never leaves a partial load. Not collective.
void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root,
                          const std::map<std::string, at::Tensor>& state);

}  // namespace fsdp
