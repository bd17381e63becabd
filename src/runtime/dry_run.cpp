#include "fsdp/runtime/dry_run.h"

#include <ATen/ATen.h>

#include <unordered_set>

#include "fsdp/comm/simulated_backend.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/model_state.h"

namespace fsdp {

RankStateBytes rank_state_bytes(const std::shared_ptr<torch::nn::Module>& root,
                                const torch::optim::Optimizer* optimizer) {
  RankStateBytes b;
  const accounting::ModelStateBytes m = accounting::model_state_bytes(root, optimizer);
  for (const auto& u : units_of(root)) {
    if (u->params().empty()) continue;
    const bool cast = u->param_dtype() != u->sharded_flat().scalar_type();
    // The module computes on another tensor than the rows between steps: the rows are a master copy.
    const bool beside_full = u->keeps_full_params() && u->unsharded_param_bytes() > 0;
    (cast || beside_full ? b.master_weight_bytes : b.param_bytes) += u->sharded_param_bytes();
    if (u->keeps_full_params()) b.param_bytes += u->unsharded_param_bytes();
  }
  b.grad_bytes = m.sharded_grad_bytes;
  b.optim_state_bytes = m.optim_state_bytes;
  b.peak_unsharded_param_bytes = m.peak_unsharded_param_bytes;
  return b;
}

DryRunResult dry_run(const DryRunSpec& spec) {
  const ErrorContext where{spec.rank, "", "dry_run"};
  FSDP_CHECK(spec.build && spec.shard, ErrorKind::kInvalidArgument, where,
             "DryRunSpec needs build and shard callbacks");
  comm::ProcessGroupPtr group = comm::simulated_world(spec.world_size, spec.rank);
  std::shared_ptr<torch::nn::Module> model = spec.build();
  FSDP_CHECK(model != nullptr, ErrorKind::kInvalidArgument, where, "build returned a null module");
  DryRunResult r;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : model->parameters()) {
    FSDP_CHECK(p.is_meta(), ErrorKind::kInvalidArgument, where,
               expected_actual("device of every parameter built for a dry run", "meta", p.device()));
    if (seen.insert(p.unsafeGetTensorImpl()).second) r.param_numel += p.numel();
  }
  spec.shard(model, group);
  r.units = static_cast<int64_t>(units_of(model).size());
  const comm::CommStats::Snapshot before = group->stats().snapshot();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (spec.loss) {
    at::Tensor loss = spec.loss(model);
    loss.backward();
    if (spec.make_optimizer) {
      optimizer = spec.make_optimizer(parameters(model));
      optimizer->step();
    }
  }
  const comm::CommStats::Snapshot after = group->stats().snapshot();
  for (size_t k = 0; k < after.size(); ++k) {
    r.step_comm[k].calls = after[k].calls - before[k].calls;
    r.step_comm[k].bytes = after[k].bytes - before[k].bytes;
    r.collectives += r.step_comm[k].calls;
  }
  r.bytes = rank_state_bytes(model, optimizer.get());
  return r;
}

}  // namespace fsdp
