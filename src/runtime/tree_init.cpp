// The lazy init of an FSDP tree at its root unit's first forward ([Note: root and final
// callback]): the tree level binds its units to one Scheduler.
#include "fsdp/runtime/fsdp_unit.h"
#include "scheduler.h"
#include "unit_registry.h"

namespace fsdp::detail {

void Scheduler::init_tree(FSDPUnit& root) {
  name_units_by_path(root.module());
  std::vector<std::shared_ptr<FSDPUnit>> units{root.shared_from_this()};
  const int bound = root.options().max_unsharded_units.value_or(kDefaultMaxUnshardedUnits);
  const ErrorContext where = root.where("forward");
  for (const auto& u : registered_units_under(root.module())) {
    if (u.get() == &root) continue;
    FSDP_CHECK(u->group() == root.group(), ErrorKind::kInvalidArgument, where, "unit '", u->name(),
               "' trains over another process group than its root; every unit of one tree must be "
               "created with the same group (strategies may differ per unit)");
    FSDP_CHECK(!u->scheduler(), ErrorKind::kState, where, "unit '", u->name(),
               "' already belongs to another tree (it ran under another root's forward)");
    FSDP_CHECK(!u->options().max_unsharded_units || *u->options().max_unsharded_units == bound,
               ErrorKind::kInvalidArgument, where, "unit '", u->name(), "' sets max_unsharded_units ",
               u->options().max_unsharded_units.value_or(0), " but the bound applies to the whole tree and "
               "is read from its root unit '", root.name(), "' (", bound,
               "): set it on the root (fully_shard_tree's root options) and leave it unset elsewhere");
    units.push_back(u);
  }
  auto scheduler = std::make_shared<Scheduler>(units, bound);
  for (const auto& u : units) u->attach_scheduler(scheduler);
}

}  // namespace fsdp::detail
