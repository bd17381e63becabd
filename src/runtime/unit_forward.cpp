// FSDPUnit, the forward hooks: pre_forward (a plain forward, or the replay of an
// activation-checkpointed region's use in its backward; the buffer and input casts) and
// post_forward (reshard, the pre-backward hook, the output cast); requires_grad followed at every
// forward; parameters registered after wrapping refused.
#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>

#include <unordered_set>

#include "autograd_hooks.h"
#include "buffers.h"
#include "checkpoint_region.h"
#include "node_shard.h"
#include "fsdp/common/activity.h"
#include "gradient_sync.h"
#include "scheduler.h"
#include "unit_registry.h"

namespace fsdp {

std::vector<at::Tensor> FSDPUnit::pre_forward(std::vector<at::Tensor> inputs) {
  FSDP_CHECK(!values_pending_, ErrorKind::kState, where("forward"),
             "the parameters were built on the meta device and this rank's shards hold no values yet: "
             "call fsdp::materialize(root, init) after fully_shard_tree and before the first forward");
  if (detail::CheckpointRegion* replay = detail::replaying_region()) {
    // [Note: activation checkpointing] A use recorded by a checkpointed region's forward, run
    // again inside its backward: same index in the forward order, params gathered again, hooks
    // registered as in a plain forward (post_forward keeps the params for the nested backward).
    const ErrorContext here = where("backward (recompute)");
    FSDP_CHECK(training_state_ == TrainingState::kIdle || training_state_ == TrainingState::kPreBackward,
               ErrorKind::kState, here, "recomputed forward in state ", to_string(training_state_),
               ", expected IDLE or PRE_BACKWARD");
    forward_index_ = detail::take_replayed_use(*replay, *this, here);
    training_state_ = TrainingState::kForward;
    push_activity(Activity{name_.c_str(), "backward (recompute)"});
    try {
      unshard("backward (recompute)");
    } catch (...) {
      abort_forward();  // post_forward will not run; the failed backward puts the tree back
      throw;
    }
  } else {
    FSDP_CHECK(training_state_ == TrainingState::kIdle, ErrorKind::kState, where("forward"),
               "forward entered in state ", to_string(training_state_), ", expected IDLE");
    detail::CheckpointRegion* region = detail::recording_region();
    FSDP_CHECK(!region || (scheduler_ && !is_root()), ErrorKind::kUnsupported, where("forward"),
               "the root unit of a tree runs inside an activation-checkpointed region; checkpoint the "
               "units below the root (e.g. each block), not the whole model");
    // [Note: root and final callback] The first unit called with no forward in progress is the
    // root of its tree: lazy init binds every unit below it to one Scheduler.
    if (!scheduler_) detail::Scheduler::init_tree(*this);
    check_params_registered();
    if (is_root()) {
      scheduler_->begin_forward(where("forward"), at::GradMode::is_enabled());
    } else {
      FSDP_CHECK(scheduler_->in_forward(), ErrorKind::kState, where("forward"),
                 "called outside the forward of its root unit; call the root module through fsdp::call");
    }
    // [Note: failed steps] From here on an exception puts the unit (the root: the tree) back.
    training_state_ = TrainingState::kForward;
    push_activity(Activity{name_.c_str(), "forward"});
    try {
      if (is_root() && options_.sync_buffers && module_raw_->is_training()) {
        detail::broadcast_buffers(*module_raw_, *group_, tag("buffers"));
      }
      follow_requires_grad();
      forward_index_ = scheduler_->record_use(this);
      if (region) {
        region->uses.push_back({weak_from_this(), forward_index_});
        // The recompute's nested backward may accumulate a parameter's gradient more than once.
        grad_sync_->defer_to_end_of_backward();
      }
      // Both gathers are issued before this one is waited for: the next one's first stage (a
      // host-aware gather's hop across hosts) runs while this one finishes. The same units count
      // against max_unsharded_units either way.
      if (sharded_state_ == ShardedState::kSharded) unshard_async("forward");
      if (options_.forward_prefetch) scheduler_->prefetch_next(forward_index_);
      unshard("forward");
    } catch (...) {
      abort_forward();  // e.g. the memory budget refused the gather
      throw;
    }
  }
  try {
    const auto& mp = options_.mixed_precision;
    if (mp.buffer_dtype) {
      if (!buffer_cast_) buffer_cast_ = std::make_unique<detail::BufferCast>();
      buffer_cast_->begin(detail::unit_buffers(*module_raw_), *mp.buffer_dtype);
    }
    if (mp.param_dtype && mp.cast_forward_inputs) {
      for (auto& x : inputs) {
        if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != param_dtype_) {
          x = x.to(param_dtype_);
        }
      }
    }
    return register_post_backward(*this, std::move(inputs));
  } catch (...) {
    abort_forward();
    throw;
  }
}

std::vector<at::Tensor> FSDPUnit::post_forward(std::vector<at::Tensor> outputs) {
  FSDP_CHECK(training_state_ == TrainingState::kForward, ErrorKind::kState, where("forward"),
             "post-forward in state ", to_string(training_state_), ", expected FORWARD");
  const bool grad = at::GradMode::is_enabled();
  if (buffer_cast_ && buffer_cast_->active()) {
    buffer_cast_->sync_back();
    if (!grad) buffer_cast_->restore();  // no backward will read the cast copies
  }
  // A recomputed use keeps its params: its nested backward follows at once.
  const bool recomputing = detail::replaying_region() != nullptr;
  if (!grad || (reshard_after_forward() && !is_root() && !recomputing)) {
    // [Note: node-local reshard] What the backward (or the recompute of a checkpointed region,
    // whose first forward runs without grad) will gather over the node-local group: the rows this
    // forward computed with.
    const bool backward_follows = grad || detail::recording_region() != nullptr;
    if (backward_follows && node_shard_ && sharded_state_ == ShardedState::kUnsharded && !params_.empty()) {
      drop_node_shard();  // a unit called twice in one forward keeps its last use's rows
      scheduler_->on_unsharded(node_shard_->keep(params_, scheduler_->forward_pass()));
    }
    reshard();
  }
  pop_activity();
  training_state_ = TrainingState::kIdle;
  if (grad) outputs = register_pre_backward(*this, forward_index_, std::move(outputs));
  if (const auto& dtype = options_.mixed_precision.output_dtype) {
    for (auto& y : outputs) {
      if (y.defined() && at::isFloatingType(y.scalar_type())) y = y.to(*dtype);
    }
  }
  if (is_root()) scheduler_->end_forward(grad);
  return outputs;
}

// [Note: requires_grad after wrapping] The flag is read at every forward of the unit (FSDP2 keeps
// per-parameter flags too), from the module parameter or from the sharded one the optimizer holds,
// whichever was flipped since (both then carry it): a frozen param drops its gradients (nothing to reduce, nothing for the optimizer, no memory), and
// the reduce-scatter layout and DDP buckets are rebuilt for the new set of trainable params. Every
// rank must change the same flags (the collective check reports a rank that did not).
void FSDPUnit::follow_requires_grad() {
  bool changed = false;
  for (auto& p : params_) {
    // Either tensor may have been flipped: the module's parameter, or the sharded one that the
    // optimizer holds (fsdp::parameters); the one that changed since the last forward wins.
    const bool want = p.sharded_param.requires_grad() != p.requires_grad ? p.sharded_param.requires_grad()
                                                                           : p.module_param.requires_grad();
    if (want == p.requires_grad) continue;
    changed = true;
    p.requires_grad = want;
    p.sharded_param.set_requires_grad(want);
    p.module_param.set_requires_grad(want);
    if (!want) {
      p.sharded_param.mutable_grad() = at::Tensor();
      p.module_param.mutable_grad() = at::Tensor();
    }
  }
  if (!changed) return;
  if (grad_sync_->has_reduction_in_flight()) finish_reduce_scatter();  // nothing in flight over the old layout
  grad_sync_->rebuild(requires_gradient_sync_ && scheduler_ != nullptr);
}

void FSDPUnit::check_params_registered() const {
  std::unordered_set<const c10::TensorImpl*> managed;
  for (const auto& p : params_) managed.insert(p.module_param.unsafeGetTensorImpl());
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::string> added;
  detail::visit_unit_modules(*module_raw_, [&](torch::nn::Module& m, const std::string& path) {
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
      if (seen.insert(impl).second && !managed.count(impl)) added.push_back(prefix + item.key());
    }
  });
  if (added.empty() && seen.size() == managed.size()) return;
  std::vector<std::string> gone;
  for (const auto& p : params_) {
    if (!seen.count(p.module_param.unsafeGetTensorImpl())) gone.push_back(p.fqn);
  }
  auto list = [](std::vector<std::string> names) {
    for (auto& n : names) n = "'" + n + "'";
    return join_first(names);
  };
  std::string what;
  if (!added.empty()) {
    const bool one = added.size() == 1;
    what = str_cat(one ? "parameter " : "parameters ", list(added), " of the unit's module ", one ? "was" : "were",
                   " registered after fully_shard (an adapter added, or a submodule replaced, after wrapping): the unit "
                   "does not manage ", one ? "it" : "them", ", so the forward would use ", one ? "it" : "them",
                   " unsharded, outside checkpoints and the optimizer's parameters, its gradient never reduced");
  }
  if (!gone.empty()) {
    what += str_cat(what.empty() ? "" : "; ", gone.size() == 1 ? "parameter " : "parameters ", list(gone),
                    " that the unit manages ", gone.size() == 1 ? "is" : "are", " no longer registered on its module (replaced or removed after "
                    "fully_shard)");
  }
  throw Error(ErrorKind::kInvalidArgument, where("forward"),
              what + ". Change the module before sharding it: build the model, add the adapters and freeze the base "
              "(requires_grad false), then fully_shard / fully_shard_tree (docs/training_loops.md, \"Adapters\")");
}

}  // namespace fsdp
