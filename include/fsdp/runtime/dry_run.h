// Dry run: one rank of an N-rank job in a single process (meta tensors, a simulated group), so
// that the real engine lays the model out and accounts its bytes without memory or communication.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/process_group.h"

namespace fsdp {

/// This rank's bytes of model state by kind, read from the engine's own state (the units' tensors,
/// the scheduler's counters, the optimizer's state tensors), never from formulas. Bytes are of
/// the tensors' storage (meta tensors count what they would hold), padding rows included.
struct RankStateBytes {
  /// Params the model keeps between steps: the sharded rows where they are what the unsharded
  /// params are gathered from in their own dtype (full_shard, shard_grad_op, hybrid_shard, and
  /// no_shard whose module params alias them), plus the full params kept between steps (zero1).
  int64_t param_bytes = 0;
  /// Sharded rows kept beside other compute params: every unit with a mixed-precision
  /// param_dtype (fp32 master weights), and zero1's rows beside its full params.
  int64_t master_weight_bytes = 0;
  /// Sharded gradients defined now (after a backward: the rows of this rank, no padding).
  int64_t grad_bytes = 0;
  /// Optimizer state tensors (AdamW: exp_avg and exp_avg_sq of this rank's rows).
  int64_t optim_state_bytes = 0;
  /// Most bytes of unsharded (gathered) params alive at once since the tree's first forward
  /// (or accounting::reset_peak_unsharded_bytes): the units alive at the peak.
  int64_t peak_unsharded_param_bytes = 0;

  /// Everything above: the model state plus the unsharded units at the peak.
  int64_t total_bytes() const {
    return param_bytes + master_weight_bytes + grad_bytes + optim_state_bytes + peak_unsharded_param_bytes;
  }
  bool operator==(const RankStateBytes& o) const {
    return param_bytes == o.param_bytes && master_weight_bytes == o.master_weight_bytes &&
           grad_bytes == o.grad_bytes && optim_state_bytes == o.optim_state_bytes &&
           peak_unsharded_param_bytes == o.peak_unsharded_param_bytes;
  }
  bool operator!=(const RankStateBytes& o) const { return !(*this == o); }
};

/// The RankStateBytes of the units under root now (and of `optimizer`'s state when given). Works
/// alike on a real model and on a dry run's meta model. Not collective. Throws fsdp::Error for an
/// optimizer type the accounting does not know.
RankStateBytes rank_state_bytes(const std::shared_ptr<torch::nn::Module>& root,
                                const torch::optim::Optimizer* optimizer = nullptr);

/// What a dry run builds and runs: the same callbacks a real run would use.
struct DryRunSpec {
  int world_size = 1;  ///< ranks of the simulated job
  int rank = 0;        ///< the rank this process plays (its rows; the last ranks may hold fewer)
  /// Builds the model with every parameter and buffer on the meta device (no memory).
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  /// Wraps it over the group (e.g. fsdp::fully_shard_tree with the run's policy and options).
  std::function<void(const std::shared_ptr<torch::nn::Module>&, comm::ProcessGroupPtr)> shard;
  /// Optional: one forward on meta inputs through fsdp::call, returning the scalar (meta) loss;
  /// the dry run then runs its backward. Unset: no step (params only).
  std::function<at::Tensor(const std::shared_ptr<torch::nn::Module>&)> loss;
  /// Optional: the optimizer over fsdp::parameters(model); one step runs after the backward.
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> make_optimizer;
};

/// The result of a dry run.
struct DryRunResult {
  RankStateBytes bytes;       ///< after one step (forward, backward, optimizer step)
  int64_t units = 0;          ///< FSDP units of the tree
  int64_t param_numel = 0;    ///< parameters of the model (unsharded, tied ones once)
  int64_t collectives = 0;    ///< collectives the engine issued in the step (moved nothing)
  /// Per collective kind, the calls and logical bytes of the step (CommStats' counting; busy_s 0):
  /// what a real rank's ProcessGroup::stats() counts for the same step.
  comm::CommStats::Snapshot step_comm{};
};

/// Runs spec on comm::simulated_world(world_size, rank): build, shard, then (when given) one
/// forward and backward and one optimizer step, all on meta tensors through the real engine, and
/// reads rank_state_bytes. A real job whose ranks run the same step (same model, options, step
/// and optimizer, rows of the same rank) holds exactly these bytes. Not collective; blocking;
/// fast (no values are computed). Throws fsdp::Error (kUnsupported) for a step that needs values
/// (e.g. gradient clipping's all-reduce, a loss read with item()), (kInvalidArgument) for a
/// model with a parameter off the meta device, and whatever the callbacks throw.
DryRunResult dry_run(const DryRunSpec& spec);

}  // namespace fsdp
