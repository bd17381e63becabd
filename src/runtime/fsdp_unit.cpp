// FSDPUnit, construction: the cross-rank check of the unit's params and options, its groups, its
// shards ([Note: dim-0 sharding]), the two seams chosen from its strategy's traits row, and the
// byte counts. The state machine is unit_state.cpp, the hooks unit_forward.cpp and
// unit_backward.cpp.
#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>

#include <atomic>

#include "all_gather_codec.h"
#include "node_shard.h"
#include "buffers.h"
#include "consistency.h"
#include "gradient_sync.h"
#include "scheduler.h"
#include "strategy.h"
#include "unit_collectives.h"

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

// Params on the group's device (its backend's: the CPU for MPI, threads and Gloo) on a real group;
// meta params on any group (deferred initialisation, or a dry run); a simulated group holds no
// data, so it takes meta params only.
void check_param_device(const FSDPParam& p, const comm::ProcessGroup& group, const ErrorContext& where) {
  const at::Device d = p.module_param.device();
  FSDP_CHECK(d.type() == group.device_type() || d.is_meta(), ErrorKind::kUnsupported, where, "parameter '", p.fqn,
             "' is on ", d, " but the group's ", group.backend_name(), " backend communicates ",
             c10::DeviceTypeName(group.device_type(), /*lower_case=*/true),
             " tensors; build the model on that device (or on the meta device, materialised later)");
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
      traits_(&traits_of(options_.strategy)),
      params_(std::move(params)) {
  FSDP_CHECK(group_ != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, name_, "fully_shard"}),
             "process group is null");
  const int shard_size = detail::validated_shard_size(options_, group_->size(), where("fully_shard"));
  std::vector<std::string> lines{str_cat("world_size ", group_->size(), " strategy ", to_string(options_.strategy),
                                         " shard_group_size ", shard_size)};
  lines.push_back(str_cat("wire all_gather_codec ", to_string(options_.all_gather_codec), " reduce_scatter_codec ",
                          to_string(options_.reduce_scatter_codec), " collective_host_size ",
                          options_.collective_host_size, " reshard_after_forward_group_size ",
                          options_.reshard_after_forward_group_size));
  for (const auto& p : params_) lines.push_back(describe(p));
  detail::check_same_on_every_rank(*group_, where("fully_shard"), lines,
                                   "build the same model with the same shapes and options on every rank");
  const detail::UnitGroups groups = sub_groups.get(group_, shard_size);
  shard_group_ = groups.shard;
  replicate_group_ = traits_->replicates_over_group ? group_ : groups.replicate;
  init_shards();
  detail::HostGroups hosts;
  const int host_size = options_.collective_host_size;
  if (host_size > 1 && host_size < shard_size) {
    // [Note: host-aware collectives]: hosts of host_size consecutive ranks, and the ranks of equal
    // place on each (split once per (shard group, size) and shared by the units).
    const detail::UnitGroups split = sub_groups.get(shard_group_, host_size);
    hosts.host = host_group_ = split.shard;
    hosts.cross = cross_host_group_ = split.replicate;
  }
  const int node_size = options_.reshard_after_forward_group_size;
  if (node_size > 0 && node_size < shard_size && !params_.empty()) {
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : params_) shapes.push_back(p.shape);
    comm::ProcessGroupPtr node =
        host_group_ && node_size == host_size ? host_group_ : sub_groups.blocks(shard_group_, node_size);
    node_shard_ = std::make_unique<detail::NodeShard>(node, shapes, param_dtype_, sharded_flat_.device());
  }
  // The unit's two seams, chosen once from its traits row ([Note: master and gather shards]).
  gather_codec_ = detail::make_all_gather_codec(options_.all_gather_codec, param_dtype_, traits_->gathers_params,
                                                gather_layout_, hosts);
  detail::GradientSyncArgs sync;
  sync.params = &params_;
  sync.shard_group = shard_group_;
  sync.replicate_group = replicate_group_;
  sync.reduce_scatter_codec = options_.reduce_scatter_codec;
  sync.hosts = hosts;
  sync.reduce_dtype = reduce_dtype_;
  sync.bucket_cap_bytes = options_.bucket_cap_bytes.value_or(kDefaultBucketCapBytes);
  sync.tag = [this](const char* phase) { return tag(phase); };
  grad_sync_ = detail::make_gradient_sync(traits_->grad_sync, std::move(sync));
}

FSDPUnit::~FSDPUnit() {
  if (buffer_cast_ && buffer_cast_->active()) buffer_cast_->restore();
  // Never leave a collective writing into freed buffers (the bucket sync waits for its buckets
  // when it is destroyed).
  try {
    if (gather_ && gather_->work) gather_->work->wait();
    if (grad_sync_) grad_sync_->wait_issued();
  } catch (...) {
  }
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
  params_alias_ = traits_->params_alias_shards && param_dtype_ == orig_dtype_ &&
                  options_.all_gather_codec == WireCodec::kNone;

  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : params_) shapes.push_back(p.shape);
  gather_layout_ = shard::FlatLayout::make(shapes, world);
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

int64_t FSDPUnit::node_shard_bytes() const { return node_shard_ ? node_shard_->bytes() : 0; }

comm::ProcessGroupPtr FSDPUnit::node_group() const { return node_shard_ ? node_shard_->group() : nullptr; }

std::pair<comm::ProcessGroupPtr, comm::ProcessGroupPtr> FSDPUnit::host_groups() const {
  return {host_group_, cross_host_group_};
}

int64_t FSDPUnit::unsharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    const at::Tensor& g = p.module_param.grad();
    if (g.defined()) n += static_cast<int64_t>(g.nbytes());
  }
  return n;
}

void FSDPUnit::attach_scheduler(std::shared_ptr<detail::Scheduler> scheduler) {
  scheduler_ = std::move(scheduler);
  grad_sync_->set_armed(requires_gradient_sync_);
}

}  // namespace fsdp
