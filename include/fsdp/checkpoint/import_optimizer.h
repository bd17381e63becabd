// Import of a plain single-process libtorch run's optimizer state (torch::save(optimizer, path))
// into an optimizer over sharded parameters, the optimizer counterpart of import_full (export.h).
// See docs/checkpoints.md, "Importing the optimizer of a plain run".
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::checkpoint {

/// Options of import_optimizer.
struct ImportOptimizerOptions {
  /// The fully qualified names (as fsdp::sharded_parameters(root) names them) of the parameters
  /// the plain run's optimizer holds, in its order: param groups in order, each group's
  /// parameters in order, a tensor listed twice once. The archive identifies parameters only by
  /// that order, so this is how they get their names. Empty: the order of
  /// root->named_parameters() (a tied parameter once), which is the plain model's
  /// named_parameters() order (fsdp::sharded_parameters goes unit by unit instead): right for an
  /// optimizer built on model->parameters(), or on groups that take consecutive runs of it. For
  /// other groupings give the names, e.g. optimizer_param_names(root, optimizer) when the sharded
  /// optimizer has the plain run's groups (same members, same group order).
  std::vector<std::string> param_names;
};

/// The names (fsdp::sharded_parameters) of the parameters `optimizer` holds, listed as a plain
/// run whose optimizer has the same param groups lists them: the groups in the optimizer's
/// order, each group's members in the model's named_parameters() order (the order a plain
/// program gets by filtering model->named_parameters(); fsdp::sharded_parameters, from which a
/// sharded program builds its groups, goes unit by unit instead). For
/// ImportOptimizerOptions::param_names. Not collective. Throws fsdp::Error (kInvalidArgument)
/// naming the group of a tensor that is not a sharded parameter of root.
std::vector<std::string> optimizer_param_names(const std::shared_ptr<torch::nn::Module>& root,
                                               const torch::optim::Optimizer& optimizer);

/// Loads the optimizer state of a plain (unsharded, single-process) libtorch run, the archive
/// written by `torch::save(optimizer, path)` for a torch::optim::AdamW, Adam or SGD, into
/// `optimizer`, built on the sharded parameters of root (fsdp::parameters(root), in any param
/// groups) at any world size and under any strategy, so that training resumes as the plain run
/// would have continued. Import the weights too (import_full) for that.
///
/// The archive's parameters get their names from ImportOptimizerOptions::param_names. Each
/// parameter's state tensors (full, the plain parameter's shape) are narrowed to the rows this
/// rank holds and set through the optimizer-state adapter with their step counts; parameters
/// without state in the archive lose any state the optimizer had. The archive's param groups are
/// matched to the optimizer's by their members (not by position), and every option of the
/// matching group is restored (AdamW/Adam: lr, betas, eps, weight_decay, amsgrad; SGD: lr,
/// momentum, dampening, weight_decay, nesterov). Adam and AdamW archives are alike: either
/// loads into either (with its saved options).
///
/// Every rank reads the whole file (a shared file system is assumed; peak extra memory: the full
/// optimizer state per rank) and validates everything before anything is written. Errors throw
/// fsdp::Error on every rank of `group`, naming the rank, the file and the parameter or group:
/// kIo for a missing or unreadable file; kCorruptData for a file that is not a libtorch optimizer
/// archive or a malformed one; kInvalidArgument for another optimizer type than `optimizer`'s, a
/// parameter count, name, shape or dtype that differs from the model's, param groups whose
/// members match none of the archive's, or state tensors that the restored options do not expect.
/// Nothing is written then. Collective and blocking over `group` (two agreements); call it with
/// no step in flight. Every unit of root must train over `group` or over one rank (as for
/// save_sharded).
void import_optimizer(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                      torch::optim::Optimizer& optimizer, const comm::ProcessGroupPtr& group,
                      const ImportOptimizerOptions& options = {});

}  // namespace fsdp::checkpoint
