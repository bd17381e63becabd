// Param groups keyed by their members (internal to the checkpoint subsystem): the fully
// qualified names of each group's parameters, and the match of an optimizer's groups to saved
// groups by member set, so that a program listing its groups in another order still gets each
// group's options. Shared by load_sharded and import_optimizer. See docs/checkpoints.md,
// "Param groups". Nothing here is collective.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/common/check.h"
#include "param_views.h"

namespace fsdp::checkpoint {

/// The members of one param group: the names of its parameters, in the group's order.
using GroupMembers = std::vector<std::string>;

/// Per param group of `optimizer`, the names (ParamView::name) of its parameters. nullopt when a
/// group holds a tensor that is no view's tensor (not a sharded parameter of the model); then
/// *stray, when given, says which group and position.
std::optional<std::vector<GroupMembers>> group_members(const torch::optim::Optimizer& optimizer,
                                                       const std::vector<ParamView>& views,
                                                       std::string* stray = nullptr);

/// For each current group (an optimizer's, in its order), the index of the saved group with the
/// same set of members (order within a group does not matter; each saved group is used once).
/// `source` names where the saved groups come from in messages ("the checkpoint", "the file").
/// Throws fsdp::Error (kInvalidArgument, context `where`) when the numbers of groups differ or a
/// current group matches no saved group: the message names the groups on both sides (index and
/// a few member names each), expected vs actual, and the closest saved group's differences.
std::vector<size_t> match_groups(const std::vector<GroupMembers>& saved,
                                 const std::vector<GroupMembers>& current, const std::string& source,
                                 const ErrorContext& where);

/// "{a, b, c, ... (12 parameters)}": the first `shown` members and the count.
std::string describe_members(const GroupMembers& members, size_t shown = 3);

}  // namespace fsdp::checkpoint
