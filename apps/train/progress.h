// TrainProgress: where a run stands, what a checkpoint's TrainState records of it
// ([Note: checkpoint contents] in checkpointing.h) and what resume_checks.h validates.
#pragma once

#include <cstdint>

namespace apps::train {

/// Where a run stands: the TrainState of [Note: checkpoint contents], less the RNG and scaler.
struct TrainProgress {
  int64_t step = 0;       ///< optimizer steps done
  int64_t lr_step = 0;    ///< schedule position: lr_at(lr_step + 1) is the next step's lr
  int64_t batch_pos = 0;  ///< index of the next global batch (sampler_pos / global batch size)
  /// Optimizer steps taken before step 0 of this run's lineage: those of a plain run's optimizer
  /// brought in by --import-optimizer (0 otherwise). A parameter's optimizer step is at most
  /// step + optimizer_step_offset.
  int64_t optimizer_step_offset = 0;
};

}  // namespace apps::train
