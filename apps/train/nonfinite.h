// The non-finite check of every step: a NaN or inf loss or gradient norm on any rank stops the run
// (--on-nonfinite stop, the default) or drops the step's update (skip), on every rank alike and
// before the optimizer step, so a checkpoint never holds the values of such a step.
//
// Cost: one all-reduce of N int64 per step (slot r: rank r's loss flag) inside the measured part;
// the gradient norm is already global (clip_grad_norm's all-reduce sums every rank's squares, so
// a NaN or inf anywhere reaches every rank); only when it is non-finite does a second all-reduce
// find the ranks whose own gradients are. With fp16 loss scaling an inf/NaN gradient is the
// scaler's business (it skips the step and lowers the scale): only the loss is checked then.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "fsdp/comm/process_group.h"

namespace apps::train {

/// The ranks of `group` where `mine` holds, ascending. Collective and blocking: one all-reduce of
/// N int64 (slot r: rank r's flag); every rank calls it at the same point.
std::vector<int> ranks_where(bool mine, fsdp::comm::ProcessGroup& group);
/// "rank 3" or "ranks 0, 2".
std::string rank_list(const std::vector<int>& ranks);

/// Test-only fault injection from FSDP_TRAIN_INJECT_NONFINITE="STEP:RANK": that rank multiplies
/// its loss by NaN before the backward of that step. Unset: nullopt. Throws UsageError for a
/// malformed value.
struct NonFiniteInjection {
  int64_t step = 0;
  int rank = 0;
};
std::optional<NonFiniteInjection> nonfinite_injection_from_env();

/// Checks step `step`'s local mean loss (this rank's) and global gradient norm. Returns "" when
/// every rank's loss and the norm are finite, else a one-line description naming the step, what
/// was non-finite and on which ranks. check_grad_norm false (loss scaling on): the norm is
/// ignored. Collective and blocking over group: every rank calls it once per step, with the same
/// grad_norm.
std::string nonfinite_report(int64_t step, double local_loss, double grad_norm, bool check_grad_norm,
                             const std::shared_ptr<torch::nn::Module>& model,
                             fsdp::comm::ProcessGroup& group);

}  // namespace apps::train
