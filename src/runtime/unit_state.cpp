// FSDPUnit, the state machine: SHARDED -> (unshard: all-gather) -> UNSHARDED -> (reshard: free)
// -> SHARDED, the lazy gather of strategies that keep full params, and the way back to IDLE and
// SHARDED after a failed step ([Note: failed steps] in scheduler.cpp).
#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>

#include "all_gather_codec.h"
#include "buffers.h"
#include "checkpoint_region.h"
#include "node_shard.h"
#include "fsdp/common/activity.h"
#include "gradient_sync.h"
#include "scheduler.h"
#include "strategy.h"
#include "unit_collectives.h"

namespace fsdp {

void FSDPUnit::unshard_async(const char* phase) {
  if (sharded_state_ != ShardedState::kSharded || params_.empty()) return;
  if (params_alias_ || params_fresh()) {
    // The module params are the full rows, or still hold the current rows: no communication.
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (node_shard_ && node_shard_->held()) {
    // [Note: node-local reshard] Kept by this forward pass's forward: the backward (or a
    // recomputed forward inside it) gathers over the node-local group. A shard from an earlier
    // pass is stale (the optimizer may have stepped since): dropped, and the shard group gathers.
    if (scheduler_ && node_shard_->held_for(scheduler_->forward_pass())) {
      const int64_t bytes = node_shard_->bytes();
      gather_ = std::make_unique<detail::AllGatherResult>(node_shard_->gather(tag(phase)));
      scheduler_->on_resharded(bytes);  // moved into the gather's input
      gather_from_node_ = true;
      sharded_state_ = ShardedState::kUnsharding;
      return;
    }
    drop_node_shard();
  }
  gather_ = std::make_unique<detail::AllGatherResult>(gather_codec_->encode(sharded_flat_, *shard_group_, tag(phase)));
  sharded_state_ = ShardedState::kUnsharding;
}

void FSDPUnit::drop_node_shard() noexcept {
  if (!node_shard_ || !node_shard_->held()) return;
  const int64_t bytes = node_shard_->drop();
  if (scheduler_) scheduler_->on_resharded(bytes);
}

void FSDPUnit::unshard(const char* phase) {
  if (params_.empty()) {
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (sharded_state_ == ShardedState::kSharded) unshard_async(phase);
  // [Note: reducer hooks] The module params are their unsharded tensors from here on.
  if (sharded_state_ == ShardedState::kUnsharded) {
    grad_sync_->ensure_hooks();
    return;
  }
  if (gather_from_node_) {
    node_shard_->copy_out(*gather_, params_);
  } else {
    gather_codec_->decode(*gather_, params_, gather_layout_);
  }
  gather_.reset();
  gather_from_node_ = false;
  sharded_state_ = ShardedState::kUnsharded;
  grad_sync_->ensure_hooks();
  if (traits_->lazy_gather) {
    gathered_versions_.clear();
    for (const auto& p : params_) gathered_versions_.push_back(p.sharded_param._version());
    grads_reduced_since_gather_ = false;
    return;  // persistent full params are state, not transient bytes
  }
  if (scheduler_) scheduler_->on_unsharded(unsharded_param_bytes());
}

void FSDPUnit::reshard() {
  if (sharded_state_ == ShardedState::kSharded) return;
  if (sharded_state_ == ShardedState::kUnsharding) {
    if (gather_ && gather_->work) gather_->work->wait();  // never free a buffer a collective writes
    gather_.reset();
    gather_from_node_ = false;
    sharded_state_ = ShardedState::kSharded;
    return;
  }
  // Aliased params are the storage; lazily gathered full params persist. Both just mark the state.
  if (!params_alias_ && !traits_->lazy_gather) {
    const int64_t bytes = unsharded_param_bytes();
    for (auto& p : params_) p.free_unsharded();
    if (scheduler_) scheduler_->on_resharded(bytes);
  }
  sharded_state_ = ShardedState::kSharded;
}

void FSDPUnit::invalidate_unsharded() {
  FSDP_CHECK(training_state_ != TrainingState::kForward, ErrorKind::kState, where("invalidate_unsharded"),
             "the shards were changed during the unit's forward");
  gathered_versions_.clear();  // lazy gather: the next unshard all-gathers
  drop_node_shard();
  if (params_alias_) return;   // the module params are the shards themselves
  if (traits_->lazy_gather) {
    if (sharded_state_ == ShardedState::kUnsharding && gather_ && gather_->work) gather_->work->wait();
    gather_.reset();
    sharded_state_ = ShardedState::kSharded;  // storage kept; refreshed at the next unshard
    return;
  }
  reshard();
}

void FSDPUnit::abort_forward() {
  const bool in_forward = training_state_ == TrainingState::kForward;
  if (in_forward) pop_activity();
  // The root's forward may also fail after its post-forward began (the output cast refused by a
  // memory budget): its tree is still in forward.
  if (is_root() && scheduler_->in_forward()) {
    scheduler_->abort_forward();  // the whole tree, this unit included
    return;
  }
  if (!in_forward) return;
  // A unit below the root: its caller may catch the error and go on with the root's forward.
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->sync_back();
  if (sharded_state_ == ShardedState::kUnsharding || (reshard_after_forward() && detail::replaying_region() == nullptr)) {
    reset_after_error(/*drop_grads=*/false);
  }
  training_state_ = TrainingState::kIdle;
}

void FSDPUnit::reset_after_error(bool drop_grads) noexcept {
  // [Note: failed steps] in scheduler.cpp. Every step here is safe to repeat and never throws.
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->restore();
  if (drop_grads) {
    grad_sync_->drop();  // waits for the reductions in flight, drops their results
    for (auto& p : params_) p.module_param.mutable_grad() = at::Tensor();
    backward_active_ = false;
    // Whether the next forward all-gathers must not depend on how far this rank got before the
    // step failed (its peers may have got further, or less far: [Note: abandoned steps]): every
    // lazily gathered unit gathers again, on every rank.
    gathered_versions_.clear();
  }
  if (sharded_state_ == ShardedState::kUnsharding) {
    // An all-gather in flight, or a copy-out that failed part way (its params may hold storage
    // that on_unsharded never counted).
    try {
      if (gather_ && gather_->work) gather_->work->wait();
    } catch (...) {
    }
    gather_.reset();
    gather_from_node_ = false;
    if (!params_alias_ && !traits_->lazy_gather) {
      for (auto& p : params_) p.free_unsharded();
    }
    sharded_state_ = ShardedState::kSharded;
  } else {
    reshard();
  }
  drop_node_shard();
  training_state_ = TrainingState::kIdle;
}

}  // namespace fsdp
