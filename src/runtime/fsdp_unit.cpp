#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>

#include <atomic>
#include <unordered_set>

#include "autograd_hooks.h"
#include "buffers.h"
#include "checkpoint_region.h"
#include "fsdp/common/activity.h"
#include "consistency.h"
#include "ddp_reducer.h"
#include "scheduler.h"
#include "strategy.h"
#include "unit_collectives.h"
#include "unit_registry.h"

namespace fsdp {

const char* to_string(TrainingState s) {
  switch (s) {
    case TrainingState::kIdle: return "IDLE";
    case TrainingState::kForward: return "FORWARD";
    case TrainingState::kPreBackward: return "PRE_BACKWARD";
    case TrainingState::kPostBackward: return "POST_BACKWARD";
  }
  return "?";
}

const char* to_string(ShardedState s) {
  switch (s) {
    case ShardedState::kSharded: return "SHARDED";
    case ShardedState::kUnsharding: return "UNSHARDING";
    case ShardedState::kUnsharded: return "UNSHARDED";
  }
  return "?";
}

namespace {

std::atomic<uint64_t> g_next_unit_id{1};

// The line of one param in the cross-rank consistency check.
// CPU params on a real group; meta params on any group (deferred initialisation, or a dry run);
// a simulated group holds no data, so it takes meta params only.
void check_param_device(const FSDPParam& p, const comm::ProcessGroup& group, const ErrorContext& where) {
  const at::Device d = p.module_param.device();
  FSDP_CHECK(d.is_cpu() || d.is_meta(), ErrorKind::kUnsupported, where, "parameter '", p.fqn, "' is on ", d,
             "; this build shards CPU parameters (or meta ones, materialised later)");
  FSDP_CHECK(!group.simulated() || d.is_meta(), ErrorKind::kInvalidArgument, where, "parameter '", p.fqn,
             "' is on ", d, " but the group is simulated (a dry run holds no data): build the model on the "
             "meta device");
}

std::string describe(const FSDPParam& p) {
  return str_cat(p.fqn, " ", shard::shape_to_string(p.shape), " ", c10::toString(p.module_param.scalar_type()),
                 p.requires_grad ? " trainable" : " frozen");
}

}  // namespace

FSDPUnit::FSDPUnit(std::shared_ptr<torch::nn::Module> module, std::string name,
                   comm::ProcessGroupPtr group, FullyShardOptions options,
                   std::vector<FSDPParam> params, detail::SubGroupCache& sub_groups)
    : id_(g_next_unit_id++),
      module_(module),
      module_raw_(module.get()),
      name_(std::move(name)),
      group_(std::move(group)),
      options_(std::move(options)),
      traits_(&detail::traits_of(options_.strategy)),
      params_(std::move(params)) {
  FSDP_CHECK(group_ != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, name_, "fully_shard"}),
             "process group is null");
  const int shard_size = detail::validated_shard_size(options_, group_->size(), where("fully_shard"));
  std::vector<std::string> lines{str_cat("world_size ", group_->size(), " strategy ", to_string(options_.strategy),
                                         " shard_group_size ", shard_size)};
  for (const auto& p : params_) lines.push_back(describe(p));
  detail::check_same_on_every_rank(*group_, where("fully_shard"), lines,
                                   "build the same model with the same shapes and options on every rank");
  const detail::UnitGroups groups = sub_groups.get(group_, shard_size);
  shard_group_ = groups.shard;
  replicate_group_ = traits_->replicates_over_group ? group_ : groups.replicate;
  init_shards();
  if (traits_->grad_sync == detail::GradSync::kBuckets) {
    reducer_ = detail::DdpReducer::create(params_, replicate_group_, reduce_dtype_,
                                          options_.bucket_cap_bytes.value_or(kDefaultBucketCapBytes),
                                          [this](const char* phase) { return tag(phase); });
  }
}

FSDPUnit::~FSDPUnit() {
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->restore();
  // Never leave a collective writing into freed buffers.
  try {
    if (gather_ && gather_->work) gather_->work->wait();
    if (reduce_ && reduce_->work) reduce_->work->wait();
  } catch (...) {
  }
  if (reducer_) reducer_->abandon();
}

ErrorContext FSDPUnit::where(const std::string& op) const {
  return ErrorContext{group_ ? group_->rank() : -1, name_, op};
}

comm::OpTag FSDPUnit::tag(const char* phase) const {
  return comm::OpTag{name_, phase, scheduler_ ? scheduler_->forward_pass() : -1,
                     scheduler_ ? scheduler_->sync_epoch() : -1};
}

bool FSDPUnit::is_root() const { return scheduler_ && scheduler_->is_root(this); }

bool FSDPUnit::keeps_full_params() const { return traits_->keeps_full_params; }

bool FSDPUnit::reshard_after_forward() const {
  if (traits_->keeps_full_params) return false;
  return options_.reshard_after_forward.value_or(traits_->reshard_after_forward);
}

bool FSDPUnit::params_fresh() const {
  // Stale after any gradient reduction (an optimizer may have stepped on it: torch::optim's SGD
  // updates through .data(), which no version counter sees) and after any in-place update that
  // autograd's version counters see (Adam/AdamW, load_full_state_dict, checkpoint loads).
  if (!traits_->lazy_gather || grads_reduced_since_gather_ || gathered_versions_.size() != params_.size()) {
    return false;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].sharded_param._version() != gathered_versions_[i]) return false;
  }
  return true;
}

void FSDPUnit::init_shards() {
  if (params_.empty()) return;
  const int64_t world = shard_group_->size();
  const int64_t rank = shard_group_->rank();
  orig_dtype_ = params_[0].module_param.scalar_type();
  for (auto& p : params_) {
    FSDP_CHECK(p.module_param.scalar_type() == orig_dtype_, ErrorKind::kInvalidArgument, where("fully_shard"),
               "parameter '", p.fqn, "' has dtype ", p.module_param.scalar_type(), ", expected ",
               orig_dtype_, " like '", params_[0].fqn, "' (one dtype per unit)");
    FSDP_CHECK(at::isFloatingType(orig_dtype_), ErrorKind::kUnsupported, where("fully_shard"), "parameter '",
               p.fqn, "' has non-floating dtype ", orig_dtype_);
    check_param_device(p, *group_, where("fully_shard"));
  }
  // [Note: deferred initialisation] Meta params on a real group: this rank's shards are
  // allocated (zeros) on the group's device and written later by fsdp::materialize.
  const c10::DeviceType device = group_->device_type();
  values_pending_ = params_[0].module_param.is_meta() && device != c10::DeviceType::Meta;
  if (values_pending_) {
    for (auto& p : params_) p.move_meta_param_to(device);
  }
  const auto& mp = options_.mixed_precision;
  param_dtype_ = mp.param_dtype.value_or(orig_dtype_);
  reduce_dtype_ = mp.reduce_dtype.value_or(param_dtype_);
  for (auto t : {param_dtype_, reduce_dtype_}) {
    FSDP_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble,
               ErrorKind::kUnsupported, where("fully_shard"), "mixed precision dtype ", t,
               " is not supported (float32, float64, bfloat16, float16)");
  }
  params_alias_ = traits_->params_alias_shards && param_dtype_ == orig_dtype_;

  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : params_) shapes.push_back(p.shape);
  gather_layout_ = shard::FlatLayout::make(shapes, world);
  build_reduce_layout();
  // One flat buffer holds this rank's padded shards of all params: it is the all-gather input
  // itself when no cast is needed.
  sharded_flat_ = at::zeros({gather_layout_.shard_numel()}, at::dtype(orig_dtype_).device(device));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    p.spec = gather_layout_.params[i];
    p.init_shard(sharded_flat_.narrow(0, gather_layout_.offsets[i], p.spec.padded_shard_numel()), rank,
                 param_dtype_, params_alias_);
  }
}

void FSDPUnit::build_reduce_layout() {
  std::vector<std::vector<int64_t>> shapes;
  reduce_index_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad) continue;
    shapes.push_back(params_[i].shape);
    reduce_index_.push_back(static_cast<int>(i));
  }
  reduce_layout_ = shard::FlatLayout::make(shapes, shard_group_->size());
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
  if (reduce_) finish_reduce_scatter();  // nothing in flight over the old layout
  build_reduce_layout();
  if (reducer_) {
    reducer_ = detail::DdpReducer::create(params_, replicate_group_, reduce_dtype_,
                                          options_.bucket_cap_bytes.value_or(kDefaultBucketCapBytes),
                                          [this](const char* phase) { return tag(phase); });
    reducer_->set_armed(requires_gradient_sync_ && scheduler_ != nullptr);
  }
}

bool FSDPUnit::has_pending_grads() const {
  for (int i : reduce_index_) {
    if (params_[i].module_param.grad().defined()) return true;
  }
  return false;
}

void FSDPUnit::reduce_pending_grads() {
  if (!requires_gradient_sync_ || reduce_ || reduce_index_.empty()) return;
  if (traits_->grad_sync == detail::GradSync::kBuckets) {
    reducer_->finish(/*issue_rest=*/true);  // packs what accumulated; missing gradients are zeros
    backward_active_ = false;
    return;
  }
  reduce_ = std::make_unique<detail::ReduceScatterResult>(detail::foreach_reduce_scatter(
      params_, reduce_index_, reduce_layout_, *shard_group_, replicate_group_.get(), reduce_dtype_,
      tag("backward (accumulated)")));
}

void FSDPUnit::set_requires_gradient_sync(bool sync) {
  requires_gradient_sync_ = sync;
  if (reducer_) reducer_->set_armed(sync && scheduler_ != nullptr);
}

void FSDPUnit::unshard_async(const char* phase) {
  if (sharded_state_ != ShardedState::kSharded || params_.empty()) return;
  if (params_alias_ || params_fresh()) {
    // The module params are the full rows, or still hold the current rows: no communication.
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  gather_ = std::make_unique<detail::AllGatherResult>(
      traits_->gathers_params ? detail::foreach_all_gather(sharded_flat_, *shard_group_, param_dtype_,
                                                           tag(phase))
                              : detail::local_cast(sharded_flat_, param_dtype_));
  sharded_state_ = ShardedState::kUnsharding;
}

void FSDPUnit::unshard(const char* phase) {
  if (params_.empty()) {
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (sharded_state_ == ShardedState::kSharded) unshard_async(phase);
  // [Note: reducer hooks] The module params are their unsharded tensors from here on.
  if (sharded_state_ == ShardedState::kUnsharded) {
    if (reducer_) reducer_->ensure_hooks();
    return;
  }
  detail::copy_out(*gather_, params_, gather_layout_);
  gather_.reset();
  sharded_state_ = ShardedState::kUnsharded;
  if (reducer_) reducer_->ensure_hooks();
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
  if (params_alias_) return;   // the module params are the shards themselves
  if (traits_->lazy_gather) {
    if (sharded_state_ == ShardedState::kUnsharding && gather_ && gather_->work) gather_->work->wait();
    gather_.reset();
    sharded_state_ = ShardedState::kSharded;  // storage kept; refreshed at the next unshard
    return;
  }
  reshard();
}

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
    if (!scheduler_) lazy_init_root();
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
        if (reducer_) reducer_->defer_to_end_of_backward();
      }
      unshard("forward");
      if (options_.forward_prefetch) scheduler_->prefetch_next(forward_index_);
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
  if (!grad || (reshard_after_forward() && !is_root() && !recomputing)) reshard();
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
    if (reduce_) {
      for (const auto& w : {reduce_->work, reduce_->replica_work}) {
        try {
          if (w) w->wait();  // never free a buffer a collective reads or writes
        } catch (...) {
        }
      }
      reduce_.reset();
      if (scheduler_) scheduler_->on_reduce_scatter_finished(this);
    }
    if (reducer_) reducer_->abandon();
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
    if (!params_alias_ && !traits_->lazy_gather) {
      for (auto& p : params_) p.free_unsharded();
    }
    sharded_state_ = ShardedState::kSharded;
  } else {
    reshard();
  }
  training_state_ = TrainingState::kIdle;
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
  unshard("backward");
  if (options_.backward_prefetch) scheduler_->prefetch_previous(forward_index);
}

void FSDPUnit::post_backward() {
  FSDP_CHECK(training_state_ == TrainingState::kPreBackward, ErrorKind::kState, where("backward"),
             "post-backward in state ", to_string(training_state_), ", expected PRE_BACKWARD");
  training_state_ = TrainingState::kPostBackward;
  exchange_activity(Activity{name_.c_str(), "post-backward"});
  // Buckets reduce from the AccumulateGrad hooks; what is left goes at the end of backward (a
  // parameter used again earlier in the graph may still get gradient).
  if (!reduce_index_.empty() && requires_gradient_sync_ && traits_->grad_sync == detail::GradSync::kReduceScatter) {
    finish_reduce_scatter();  // a unit used twice: its first reduce-scatter lands first
    reduce_ = std::make_unique<detail::ReduceScatterResult>(detail::foreach_reduce_scatter(
        params_, reduce_index_, reduce_layout_, *shard_group_, replicate_group_.get(), reduce_dtype_,
        tag("backward")));
    scheduler_->on_reduce_scatter_issued(this);
  }
  reshard();
  training_state_ = TrainingState::kIdle;
  exchange_activity(Activity{nullptr, "backward"});
}

void FSDPUnit::end_of_backward() {
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->restore();
  reshard();
}

void FSDPUnit::finish_reduce_scatter() {
  if (reducer_) {
    reducer_->finish((backward_active_ || reducer_->touched()) && requires_gradient_sync_);
    backward_active_ = false;
    return;
  }
  backward_active_ = false;
  if (!reduce_) return;
  detail::accumulate_reduced(*reduce_, params_, reduce_index_, reduce_layout_, shard_group_->rank());
  reduce_.reset();
  grads_reduced_since_gather_ = true;
  if (scheduler_) scheduler_->on_reduce_scatter_finished(this);
}

int64_t FSDPUnit::sharded_param_bytes() const {
  return sharded_flat_.defined() ? static_cast<int64_t>(sharded_flat_.nbytes()) : 0;
}

int64_t FSDPUnit::sharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    const at::Tensor& g = p.sharded_param.grad();
    if (g.defined()) n += static_cast<int64_t>(g.nbytes());
  }
  return n;
}

int64_t FSDPUnit::unsharded_param_bytes() const {
  // The storage actually allocated: zero1 keeps its full params between steps; an all-gather in
  // flight has not allocated them yet; aliased params are the sharded storage.
  if (params_alias_) return 0;
  int64_t n = 0;
  for (const auto& p : params_) n += p.allocated_unsharded_bytes();
  return n;
}

int64_t FSDPUnit::unsharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    const at::Tensor& g = p.module_param.grad();
    if (g.defined()) n += static_cast<int64_t>(g.nbytes());
  }
  return n;
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

void FSDPUnit::lazy_init_root() {
  detail::name_units_by_path(*module_raw_);
  std::vector<std::shared_ptr<FSDPUnit>> units{shared_from_this()};
  const int bound = options_.max_unsharded_units.value_or(kDefaultMaxUnshardedUnits);
  for (const auto& u : detail::registered_units_under(*module_raw_)) {
    if (u.get() == this) continue;
    FSDP_CHECK(u->group_ == group_, ErrorKind::kInvalidArgument, where("forward"), "unit '", u->name(),
               "' trains over another process group than its root; every unit of one tree must be "
               "created with the same group (strategies may differ per unit)");
    FSDP_CHECK(!u->scheduler_, ErrorKind::kState, where("forward"), "unit '", u->name(),
               "' already belongs to another tree (it ran under another root's forward)");
    FSDP_CHECK(!u->options_.max_unsharded_units || *u->options_.max_unsharded_units == bound,
               ErrorKind::kInvalidArgument, where("forward"), "unit '", u->name(), "' sets max_unsharded_units ",
               u->options_.max_unsharded_units.value_or(0), " but the bound applies to the whole tree and "
               "is read from its root unit '", name_, "' (", bound,
               "): set it on the root (fully_shard_tree's root options) and leave it unset elsewhere");
    units.push_back(u);
  }
  auto scheduler = std::make_shared<detail::Scheduler>(units, bound);
  for (const auto& u : units) {
    u->scheduler_ = scheduler;
    if (u->reducer_) u->reducer_->set_armed(u->requires_gradient_sync_);
  }
}

}  // namespace fsdp
