#include "param_views.h"

#include <unordered_set>

#include "dtypes.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::checkpoint {

void check_no_pending_gradients(const std::shared_ptr<torch::nn::Module>& root, const ErrorContext& where) {
  std::vector<std::string> pending;
  for (const auto& u : units_of(root)) {
    if (u->has_pending_grads()) pending.push_back("'" + u->name() + "'");
  }
  if (pending.empty()) return;
  const std::string list = join_first(pending);
  throw Error(ErrorKind::kState, where,
              str_cat(pending.size() == 1 ? "unit " : "units ", list, pending.size() == 1 ? " holds" : " hold",
                      " gradients accumulated with requires_gradient_sync(false) that no synced backward has "
                      "reduced yet; a checkpoint holds parameters and optimizer state, not these gradients, so "
                      "a run resumed from it (at any world size) would silently lose them. Checkpoint between "
                      "steps: after the synced backward and the optimizer step (or drop them first: "
                      "model->zero_grad())"));
}

std::vector<ParamView> param_views(const std::shared_ptr<torch::nn::Module>& root,
                                   const comm::ProcessGroup& g, const ErrorContext& where) {
  check_no_pending_gradients(root, where);
  std::vector<ParamView> out;
  std::unordered_set<const void*> managed;
  for (const auto& sp : sharded_parameters(root)) {
    const auto& spec = sp.param->spec;
    const auto& ug = *sp.unit->group();
    ErrorContext at_unit = where;
    at_unit.unit = sp.unit->name();
    ParamView v{sp.name, sp.tensor, sp.param->shape};
    v.unit = sp.unit;
    if (ug.size() == g.size()) {
      FSDP_CHECK(ug.rank() == g.rank(), ErrorKind::kUnsupported, at_unit,
                 "the unit ranks its group differently from the checkpoint group: ",
                 expected_actual("rank in the unit's group", g.rank(), ug.rank()));
      // Rows are indexed by the shard rank (no_shard: 0 and all rows; hybrid: the position in the
      // shard group). Replicated rows are written once, by replica 0; every rank reads its rows.
      const int64_t sr = sp.unit->shard_rank();
      v.row_begin = spec.row_offset(sr);
      v.rows = spec.real_rows(sr);
      v.writer = sp.unit->num_replicas() == 1 || sp.unit->replicate_group()->rank() == 0;
    } else if (ug.size() == 1) {  // replicated on every rank: rank 0 writes, all read all rows
      v.row_begin = 0;
      v.rows = spec.dim0;
      v.writer = g.rank() == 0;
    } else {
      throw Error(ErrorKind::kUnsupported, at_unit,
                  str_cat("parameter '", sp.name, "' is sharded over a group of ", ug.size(),
                          " ranks; the checkpoint group has ", g.size(),
                          " (a unit must train over the checkpoint group or over one rank)"));
    }
    managed.insert(sp.param->module_param.unsafeGetTensorImpl());
    out.push_back(std::move(v));
  }
  for (const auto& kv : root->named_parameters(/*recurse=*/true)) {
    FSDP_CHECK(managed.count(kv.value().unsafeGetTensorImpl()), ErrorKind::kInvalidArgument, where,
               "parameter '", kv.key(),
               "' is not managed by any FSDP unit (wrap the root with fsdp::fully_shard or "
               "fully_shard_tree before checkpointing)");
  }
  return out;
}

std::vector<ParamInfo> param_infos(const std::vector<ParamView>& views, const ErrorContext& where) {
  std::vector<ParamInfo> out;
  for (const auto& v : views) {
    out.push_back({v.name, v.shape, dtype_name(v.tensor.scalar_type(), where)});
  }
  return out;
}

}  // namespace fsdp::checkpoint
