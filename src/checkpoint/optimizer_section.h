// The optimizer state inside a sharded checkpoint (internal): which state tensors, rows and steps
// a checkpoint stores per parameter, their validation on load and their restore. Every access to
// the optimizer goes through the adapter (fsdp/optim/optimizer_state.h). Format:
// docs/checkpoints.md ("optim/<fqn>/<state>" tensors, the manifest's "optimizer" object).
// Nothing here is collective; save_sharded and load_sharded call it inside their agreements.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>
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

/// Save, rank 0: the manifest's optimizer type, group learning rates, the groups keyed by their
/// members with all their options (left out when a group holds a tensor that is no view's: see
/// Manifest::groups), per-parameter steps and state names, and a TensorEntry (no shards yet) per
/// state tensor. optimizer may be null.
void describe_optimizer(Manifest& m, const torch::optim::Optimizer* optimizer,
                        const std::vector<ParamView>& views, const std::vector<int64_t>& step_flags,
                        const ErrorContext& where);

/// What a load or an import restores into an optimizer, read and validated.
struct StagedOptimizer {
  OptimizerStates states;  ///< per view: the state to set, or nullopt (remove any state)
  /// per param group of the optimizer, in its order: the options to set (the others keep theirs)
  std::vector<optim::GroupOptions> group_options;
};

/// Load, phase 1: validates the manifest's optimizer section against `optimizer` (type; param
/// groups matched by their members when the manifest has them, else by position; which
/// parameters it holds; state names from the options it will have) and reads this rank's rows of
/// each state tensor, shaped and placed like the view's tensor. Group options: every saved option
/// of the matching group, or only the learning rate of the group at the same position for a
/// manifest without members (written before they were saved). Throws fsdp::Error:
/// kInvalidArgument for an optimizer that does not match the checkpoint (another type, groups
/// whose members match no saved group), kCorruptData for a manifest missing tensors or with
/// options the type does not have; anything RankFileReader::read_rows throws.
StagedOptimizer stage_optimizer_state(const Manifest& m, RankFileReader& files,
                                      const torch::optim::Optimizer& optimizer,
                                      const std::vector<ParamView>& views,
                                      const ErrorContext& where);

/// Checks, before anything is written, that the state staged for each view is what
/// fsdp::optim::set_param_state will accept once the staged group options are set (names from
/// the merged options, amsgrad included). Throws fsdp::Error (kInvalidArgument) naming the
/// parameter; `source` names where the state comes from ("the checkpoint", "the file").
void check_staged_state_names(const torch::optim::Optimizer& optimizer,
                              const std::vector<ParamView>& views, const StagedOptimizer& staged,
                              const std::string& source, const ErrorContext& where);

/// Load / import, phase 2: sets the staged group options, then per view the staged state (or
/// removes the optimizer's state where there is none). Cannot fail on a validated stage.
void apply_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<ParamView>& views,
                           const StagedOptimizer& staged, const ErrorContext& where);

}  // namespace fsdp::checkpoint
