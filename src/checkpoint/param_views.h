// Which global rows of each sharded parameter this rank holds and writes (internal to the
// checkpoint subsystem). See docs/checkpoints.md, "Shard file" and "Resharding rule".
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "manifest.h"

namespace fsdp {
class FSDPUnit;
}  // namespace fsdp

namespace fsdp::checkpoint {

/// One sharded parameter as a checkpoint sees it.
struct ParamView {
  std::string name;            ///< fully qualified name from the root
  at::Tensor tensor;           ///< this rank's rows (the leaf the optimizer steps), (rows, d1, ...)
  std::vector<int64_t> shape;  ///< global shape (d0, d1, ...)
  int64_t row_begin = 0;       ///< first global row held here
  int64_t rows = 0;            ///< rows held here (0 on ranks past the end of dim 0)
  bool writer = false;         ///< this rank writes the rows (false for replicas other than 0)
  const FSDPUnit* unit = nullptr;  ///< the unit that owns it
};

/// Throws fsdp::Error (kState, context `where`) naming the units under root that hold unreduced
/// gradients (accumulated with requires_gradient_sync false): a checkpoint saved or loaded then
/// would lose them silently. Not collective (the callers run it inside an Agreement phase).
void check_no_pending_gradients(const std::shared_ptr<torch::nn::Module>& root, const ErrorContext& where);

/// Every sharded parameter under root (fsdp::sharded_parameters order) with the rows this rank of
/// `g` holds. Rows are indexed by the unit's shard_rank(): a unit sharded over g holds its shard's
/// rows and, when replicated (no_shard, hybrid_shard), replica 0 writes them; a unit over a group
/// of one rank holds every row and rank 0 of g writes them. Not collective.
/// Throws fsdp::Error (context `where`): kUnsupported for a unit over a group of another size than
/// g's or 1, or one that ranks g differently; kInvalidArgument for a parameter of root that no
/// FSDP unit manages; kState for unreduced gradients (check_no_pending_gradients).
std::vector<ParamView> param_views(const std::shared_ptr<torch::nn::Module>& root,
                                   const comm::ProcessGroup& g, const ErrorContext& where);

/// {name, global shape, dtype name} of each view: the model as the manifest describes it.
std::vector<ParamInfo> param_infos(const std::vector<ParamView>& views, const ErrorContext& where);

}  // namespace fsdp::checkpoint
