// A training forward + backward of the calibrated model (internal to fsdp-plan --calibrate), and
// the FLOP rate it reaches.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/setup.h"
#include "plan/calibration/work_timer.h"

namespace apps::plan::calibration {

// A training forward + backward of the model's module (its blocks cut so that every rank's copy,
// its gradients and a working margin take at most half of this node's memory): random tokens of
// micro-batch x seq_len, the loss as fsdp-train computes it. A parameter-count model has no
// module: its pass is the three matmuls of a 1024 x 1024 layer's forward and backward over
// micro-batch x seq_len rows, 8 times (no FLOP rate is derived from it).
struct TrainingPass {
  std::shared_ptr<torch::nn::Module> module;
  at::Tensor idx, x, w;
  fsdp::planner::Architecture arch;
  int64_t n_layer = 0;  ///< layers of the module
  double flops = 0.0;   ///< the planner's FLOPs of one pass (unit_flops of the root and the blocks)
  std::vector<double> samples_s;  ///< seconds of each timed pass so far

  /// The pass of `m` at `step`'s micro-batch and sequence length in `dtype`, its blocks cut to fit
  /// half of this node's memory shared by `ranks_on_node` ranks.
  TrainingPass(const fsdp::planner::ModelSpec& m, const fsdp::planner::StepSetup& step, at::ScalarType dtype,
               int64_t ranks_on_node);
  /// One forward + backward (blocking); `between` runs after the forward, before the backward.
  /// Returns the seconds of it all.
  double run(const std::function<void()>& between = {});
  /// Times passes, all ranks at once after a warm-up pass (5 to 25 of them, about two seconds: a
  /// pass's time spreads by ~10% on a shared 2-core guest; the count agreed across ranks), by
  /// `timer` ([Note: timing together]), and keeps their seconds in `samples_s`. Blocking; every
  /// rank calls it at the same point.
  void sample(WorkTimer& timer);
};

// [Note: model rate] The FLOP rate a training forward + backward of the model reaches (TrainingPass),
// all ranks at once; FLOPs from the planner's unit_flops (root + blocks), so the time model divides
// the same count by this rate: the planner's FLOPs over the median of the pass's samples so far,
// the slowest rank's. The step's precision is sampled twice, at the start of the calibration and
// again at its end ([Note: model rate twice]).
double model_rate(TrainingPass& pass, fsdp::comm::ProcessGroup& g);

}  // namespace apps::plan::calibration
