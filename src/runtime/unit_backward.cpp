// FSDPUnit, the backward hooks: pre_backward (unshard, backward prefetch), post_backward (the
// gradient sync, reshard), the end of a backward, and the gradient reductions of the unit's
// GradientSync (gradient_sync.h), whose sequencing across units the tree's scheduler drives.
#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>

#include "buffers.h"
#include "fsdp/common/activity.h"
#include "gradient_sync.h"
#include "scheduler.h"

namespace fsdp {

bool FSDPUnit::has_trainable_params() const {
  for (const auto& p : params_) {
    if (p.requires_grad) return true;
  }
  return false;
}

bool FSDPUnit::has_pending_grads() const {
  for (const auto& p : params_) {
    if (p.requires_grad && p.module_param.grad().defined()) return true;
  }
  return false;
}

void FSDPUnit::reduce_pending_grads() {
  if (!requires_gradient_sync_ || grad_sync_->has_reduction_in_flight() || !has_trainable_params()) return;
  grad_sync_->reduce_pending(tag("backward (accumulated)"));
  backward_active_ = false;  // buckets: finished here (a reduce-scatter's is finished by the tree)
}

void FSDPUnit::set_requires_gradient_sync(bool sync) {
  requires_gradient_sync_ = sync;
  grad_sync_->set_armed(sync && scheduler_ != nullptr);
}

void FSDPUnit::pre_backward(int64_t forward_index) {
  FSDP_CHECK(scheduler_ != nullptr, ErrorKind::kState, where("backward"), "backward hook before any forward");
  // Before anything of this backward is queued: no collective, no end-of-backward callback.
  FSDP_CHECK(!scheduler_->pass_abandoned(), ErrorKind::kState, where("backward"), "backward of forward pass ",
             scheduler_->forward_pass(), ", which this rank abandoned (fsdp::abandon_step): its peers have left "
             "it; run the next batch's forward instead");
  scheduler_->ensure_final_callback();
  FSDP_CHECK(training_state_ == TrainingState::kIdle || training_state_ == TrainingState::kPreBackward,
             ErrorKind::kState, where("backward"), "pre-backward in state ", to_string(training_state_),
             ", expected IDLE (was the unit's forward run twice without backward in between?)");
  exchange_activity(Activity{name_.c_str(), "backward"});
  training_state_ = TrainingState::kPreBackward;
  backward_active_ = true;
  // Both gathers are issued before this one is waited for: the next one's first stage (a
  // host-aware gather's hop across hosts) runs while this one finishes. The same units count
  // against max_unsharded_units either way.
  if (sharded_state_ == ShardedState::kSharded) unshard_async("backward");
  if (options_.backward_prefetch) scheduler_->prefetch_previous(forward_index);
  unshard("backward");
}

void FSDPUnit::post_backward() {
  FSDP_CHECK(training_state_ == TrainingState::kPreBackward, ErrorKind::kState, where("backward"),
             "post-backward in state ", to_string(training_state_), ", expected PRE_BACKWARD");
  training_state_ = TrainingState::kPostBackward;
  exchange_activity(Activity{name_.c_str(), "post-backward"});
  // Buckets reduce from the AccumulateGrad hooks; what is left goes at the end of backward (a
  // parameter used again earlier in the graph may still get gradient).
  if (has_trainable_params() && requires_gradient_sync_ && grad_sync_->reduces_at_post_backward()) {
    finish_reduce_scatter();  // a unit used twice: its first reduce-scatter lands first
    grad_sync_->issue(tag("backward"));
    scheduler_->on_reduce_scatter_issued(this);  // the scheduler finishes the previous unit's
  }
  reshard();
  training_state_ = TrainingState::kIdle;
  exchange_activity(Activity{nullptr, "backward"});
}

void FSDPUnit::end_of_backward() {
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->restore();
  reshard();
  drop_node_shard();  // kept for a backward that did not reach this unit (e.g. frozen inputs)
}

void FSDPUnit::finish_reduce_scatter() {
  const bool took_part = backward_active_;
  backward_active_ = false;
  if (grad_sync_->finish(took_part, requires_gradient_sync_)) grads_reduced_since_gather_ = true;
}

}  // namespace fsdp
