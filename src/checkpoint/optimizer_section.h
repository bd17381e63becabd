// The optimizer state inside a sharded checkpoint (internal): which state tensors, rows and steps
// a checkpoint stores per parameter, their validation on load and their restore. Every access to
// the optimizer goes through the adapter (fsdp/optim/optimizer_state.h). Format:
// docs/checkpoints.md ("optim/<fqn>/<state>" tensors, the manifest's "optimizer" object).
// Nothing here is collective; save_sharded and load_sharded call it inside their agreements.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "manifest.h"
#include "param_views.h"
#include "rank_file.h"

namespace fsdp::checkpoint {

/// Per view, the state this rank's optimizer holds for its rows (nullopt: none). Empty without an
/// optimizer. Throws fsdp::Error (kUnsupported, context `where`) for an unknown optimizer type.
using OptimizerStates = std::vector<std::optional<optim::ParamState>>;
OptimizerStates local_optimizer_states(const torch::optim::Optimizer* optimizer,
                                       const std::vector<ParamView>& views,
                                       const ErrorContext& where);

/// Save: appends "optim/<fqn>/<state>" rows to w for every view this rank writes that has state on
/// some rank (step_flags[i] = 1 + step, the maximum over ranks; 0: no rank has state). Throws
/// fsdp::Error (kInvalidArgument) when this rank holds rows of such a view but no state for them,
/// or a state tensor is missing or of the wrong size.
void write_optimizer_rows(RankFileWriter& w, const torch::optim::Optimizer& optimizer,
                          const std::vector<ParamView>& views, const OptimizerStates& states,
                          const std::vector<int64_t>& step_flags, const ErrorContext& where);

/// Save, rank 0: the manifest's optimizer type, group learning rates, per-parameter steps and
/// state names, and a TensorEntry (no shards yet) per state tensor. optimizer may be null.
void describe_optimizer(Manifest& m, const torch::optim::Optimizer* optimizer,
                        const std::vector<ParamView>& views, const std::vector<int64_t>& step_flags,
                        const ErrorContext& where);

/// Load, phase 1: validates the manifest's optimizer section against `optimizer` (type, number
/// of param groups, which parameters it holds, state names from its options) and reads this
/// rank's rows of each state tensor, shaped and placed like the view's tensor. Per view: the state
/// to restore, or nullopt (the parameter has none in the checkpoint). Throws fsdp::Error:
/// kInvalidArgument for an optimizer that does not match the checkpoint, kCorruptData for a
/// manifest missing tensors; anything RankFileReader::read_rows throws.
OptimizerStates stage_optimizer_state(const Manifest& m, RankFileReader& files,
                                      const torch::optim::Optimizer& optimizer,
                                      const std::vector<ParamView>& views,
                                      const ErrorContext& where);

/// Load, phase 2: restores the group learning rates and, per view, the staged state (or removes
/// the optimizer's state where the checkpoint has none). Cannot fail on a validated stage.
void apply_optimizer_state(torch::optim::Optimizer& optimizer, const Manifest& m,
                           const std::vector<ParamView>& views, const OptimizerStates& staged,
                           const ErrorContext& where);

}  // namespace fsdp::checkpoint
