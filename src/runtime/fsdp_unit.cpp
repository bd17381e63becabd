#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "autograd_hooks.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "root_context.h"

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

int64_t FSDPParam::unsharded_bytes() const {
  return spec.padded_numel() * static_cast<int64_t>(unsharded_padded.element_size());
}

namespace {

// [Note: storage-resize free] The unsharded param keeps one StorageImpl for its whole life; reshard
// frees the bytes (size 0), unshard allocates them again. Autograd may have saved views of the
// param (e.g. weight.t() in linear): they share the StorageImpl, so they see the re-gathered data
// in backward and hold no memory in between (the approach of PyTorch FSDP2's storage resize_(0)).
void free_storage(const at::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

void alloc_storage(const at::Tensor& t, int64_t nbytes) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(impl->nbytes()) == nbytes && impl->data() != nullptr) return;
  c10::Allocator* alloc = c10::GetAllocator(t.device().type());
  impl->set_data_ptr_noswap(alloc->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

std::vector<int64_t> shard_shape(const FSDPParam& p, int64_t rows) {
  std::vector<int64_t> s = p.shape;
  if (s.empty()) return {rows};  // 0-dim params are one row of one element
  s[0] = rows;
  return s;
}

// Metadata line of one param, for the cross-rank consistency check.
std::string meta_line(const std::string& name, const std::vector<int64_t>& shape,
                      c10::ScalarType dtype, bool requires_grad) {
  return str_cat(name, " ", shard::shape_to_string(shape), " ", c10::toString(dtype),
                 requires_grad ? " trainable" : " frozen");
}

// [Note: strategy sub-groups] hybrid_shard and no_shard split the data-parallel group into shard
// groups (consecutive ranks) and replica groups (same position). split() is collective, so it
// runs at fully_shard time, which every rank runs in the same order; the result is cached per
// (group, shard size) and shared by every unit (held weakly here, strongly by the units). Entries
// expire together on all ranks when the units die (SPMD programs free them at the same point).
std::pair<comm::ProcessGroupPtr, comm::ProcessGroupPtr> mesh_groups(const comm::ProcessGroupPtr& group,
                                                                    int shard_size) {
  const int N = group->size(), r = group->rank();
  if (shard_size == N) return {group, nullptr};
  struct Entry {
    std::weak_ptr<comm::ProcessGroup> parent, shard, replicate;
    int shard_size;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    cache.erase(std::remove_if(cache.begin(), cache.end(),
                               [](const Entry& e) { return e.parent.expired() || e.shard.expired(); }),
                cache.end());
    for (const auto& e : cache) {
      if (e.shard_size != shard_size || e.parent.lock() != group) continue;
      auto sg = e.shard.lock();
      auto rg = shard_size == 1 ? group : e.replicate.lock();
      if (sg && rg) return {sg, rg};
    }
  }
  // Not under the lock: split is a collective, other ranks of a threaded world need the cache.
  comm::ProcessGroupPtr sg = group->split(r / shard_size, r);
  comm::ProcessGroupPtr rg = shard_size == 1 ? group : group->split(r % shard_size, r);
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({group, sg, shard_size == 1 ? nullptr : rg, shard_size});
  return {sg, rg};
}

// no_shard: runs after a trainable parameter's AccumulateGrad node (its gradient of this backward
// is accumulated into .grad()).
struct GradAccumulatedHook : torch::autograd::FunctionPostHook {
  GradAccumulatedHook(std::shared_ptr<FSDPUnit*> unit, int index) : unit(std::move(unit)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (FSDPUnit* u = *unit) u->on_grad_accumulated(index);
    return outputs;
  }
  std::shared_ptr<FSDPUnit*> unit;
  int index;
};

}  // namespace

FSDPUnit::FSDPUnit(std::shared_ptr<torch::nn::Module> module, std::string name,
                   comm::ProcessGroupPtr group, FullyShardOptions options,
                   std::vector<FSDPParam> params)
    : module_(module), module_raw_(module.get()), name_(std::move(name)), group_(std::move(group)),
      options_(options), params_(std::move(params)) {
  FSDP_CHECK(group_ != nullptr, "[fsdp] fully_shard(unit '", name_, "'): process group is null");
  FSDP_CHECK(options_.max_unsharded_units >= 1, where(),
             ": max_unsharded_units must be >= 1, got ", options_.max_unsharded_units);
  const int N = group_->size();
  int shard_size = N;
  const auto strategy = options_.strategy;
  if (strategy == ShardingStrategy::kNoShard) {
    shard_size = 1;
    FSDP_CHECK(options_.bucket_cap_bytes > 0, where(), ": bucket_cap_bytes must be > 0, got ",
               options_.bucket_cap_bytes);
  } else if (strategy == ShardingStrategy::kHybridShard) {
    const int G = options_.hybrid_shard_group_size;
    FSDP_CHECK(G >= 0 && (G == 0 || N % G == 0), where(), ": hybrid_shard_group_size ", G,
               " must divide the group size ", N, " (or be 0 for the whole group)");
    shard_size = G == 0 ? N : G;
  }
  if (strategy == ShardingStrategy::kNoShard || strategy == ShardingStrategy::kZero1) {
    FSDP_CHECK(!options_.reshard_after_forward.value_or(false), where(),
               ": reshard_after_forward=true contradicts strategy ", to_string(strategy),
               " (its full params stay on every rank)");
  }
  check_consistency_across_ranks(shard_size);
  std::tie(shard_group_, replicate_group_) = mesh_groups(group_, shard_size);
  if (strategy == ShardingStrategy::kNoShard) replicate_group_ = group_;
  init_shards();
  if (strategy == ShardingStrategy::kNoShard) build_buckets();
}

FSDPUnit::~FSDPUnit() {
  if (self_cell_) *self_cell_ = nullptr;  // hooks of AccumulateGrad nodes that outlive the unit
  // Never leave a collective writing into freed buffers.
  try {
    if (all_gather_work_) all_gather_work_->wait();
    if (reduce_scatter_work_) reduce_scatter_work_->wait();
    for (auto& b : buckets_) {
      if (b.work) b.work->wait();
    }
  } catch (...) {
  }
}

std::string FSDPUnit::where() const {
  return str_cat("[fsdp rank ", group_ ? group_->rank() : -1, "] unit '", name_, "'");
}

bool FSDPUnit::is_root() const { return root_ && root_->root == this; }

bool FSDPUnit::reshard_after_forward() const {
  if (keeps_full_params()) return false;
  if (options_.reshard_after_forward.has_value()) return *options_.reshard_after_forward;
  return options_.strategy == ShardingStrategy::kFullShard ||
         options_.strategy == ShardingStrategy::kHybridShard;
}

bool FSDPUnit::keeps_full_params() const {
  return options_.strategy == ShardingStrategy::kNoShard || options_.strategy == ShardingStrategy::kZero1;
}

bool FSDPUnit::params_aliased() const {
  return options_.strategy == ShardingStrategy::kNoShard && param_dtype_ == orig_dtype_;
}

bool FSDPUnit::params_fresh() const {
  // Stale after any gradient reduction (an optimizer may have stepped on it: torch::optim's SGD
  // updates through .data(), which no version counter sees) and after any in-place update that
  // autograd's version counters see (Adam/AdamW, load_full_state_dict, checkpoint loads).
  if (options_.strategy != ShardingStrategy::kZero1 || grads_reduced_since_gather_ ||
      gathered_versions_.size() != params_.size()) {
    return false;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].sharded_param._version() != gathered_versions_[i]) return false;
  }
  return true;
}

void FSDPUnit::init_shards() {
  const int64_t world = shard_group_->size();
  const int64_t rank = shard_group_->rank();
  if (params_.empty()) return;

  orig_dtype_ = params_[0].module_param.scalar_type();
  for (auto& p : params_) {
    FSDP_CHECK(p.module_param.scalar_type() == orig_dtype_, where(), ": parameter '", p.fqn,
               "' has dtype ", p.module_param.scalar_type(), ", expected ", orig_dtype_,
               " like '", params_[0].fqn, "' (one dtype per unit)");
    FSDP_CHECK(at::isFloatingType(orig_dtype_), where(), ": parameter '", p.fqn,
               "' has non-floating dtype ", orig_dtype_);
    FSDP_CHECK(p.module_param.device().is_cpu(), where(), ": parameter '", p.fqn, "' is on ",
               p.module_param.device(), "; this build shards CPU parameters");
  }
  const auto& mp = options_.mixed_precision;
  param_dtype_ = mp.param_dtype.value_or(orig_dtype_);
  reduce_dtype_ = mp.reduce_dtype.value_or(param_dtype_);
  for (auto t : {param_dtype_, reduce_dtype_}) {
    FSDP_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble,
               where(), ": mixed precision dtype ", t, " is not supported");
  }

  std::vector<std::vector<int64_t>> shapes, reduce_shapes;
  for (size_t i = 0; i < params_.size(); ++i) {
    shapes.push_back(params_[i].shape);
    if (params_[i].requires_grad) {
      reduce_shapes.push_back(params_[i].shape);
      reduce_param_index_.push_back(static_cast<int>(i));
    }
  }
  gather_layout_ = shard::FlatLayout::make(shapes, world);
  reduce_layout_ = shard::FlatLayout::make(reduce_shapes, world);

  at::NoGradGuard no_grad;
  // One flat buffer holds this rank's padded shards of all params: it is the all-gather input
  // itself when no cast is needed.
  at::Tensor flat = at::zeros({gather_layout_.shard_numel()}, at::dtype(orig_dtype_));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    p.spec = gather_layout_.params[i];
    const auto& s = p.spec;
    p.sharded_storage =
        flat.narrow(0, gather_layout_.offsets[i], s.padded_shard_numel()).view(shard_shape(p, s.rows_per_rank));
    int64_t rows = s.real_rows(rank);
    at::Tensor full = p.module_param.detach().reshape({s.dim0, s.row_numel});
    if (rows > 0) {
      p.sharded_storage.view({s.rows_per_rank, s.row_numel})
          .narrow(0, 0, rows)
          .copy_(full.narrow(0, s.row_offset(rank), rows));
    }
    p.sharded_param = p.sharded_storage.narrow(0, 0, rows).detach();
    p.sharded_param.set_requires_grad(p.requires_grad);
    // no_shard without a cast: the module param aliases the (full) sharded storage, no copy.
    const bool alias = options_.strategy == ShardingStrategy::kNoShard && param_dtype_ == orig_dtype_;
    p.unsharded_padded = alias ? p.sharded_storage
                               : at::empty(shard_shape(p, s.rows_per_rank * world), at::dtype(param_dtype_));
    at::Tensor view = p.unsharded_padded.narrow(0, 0, s.dim0);
    p.module_param.set_data(p.shape.empty() ? view.view({}) : view);
    if (!alias) free_storage(p.unsharded_padded);
  }
  sharded_flat_ = flat;
  sharded_state_ = ShardedState::kSharded;
}

void FSDPUnit::check_consistency_across_ranks(int shard_size) {
  // Every rank all-gathers a text description of its params; any difference is reported with the
  // parameter name and both ranks' shapes, on every rank, before any training collective could hang.
  std::string mine = str_cat("world_size ", group_->size(), " strategy ", to_string(options_.strategy),
                             " shard_group_size ", shard_size, "\n");
  for (const auto& p : params_) {
    mine += meta_line(p.fqn, p.shape, p.module_param.scalar_type(), p.requires_grad) + "\n";
  }
  const int world = group_->size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::empty({world}, at::kLong);
  group_->all_gather_into_tensor(lens, len)->wait();
  int64_t max_len = lens.max().item<int64_t>();
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({world * max_len}, at::kByte);
  group_->all_gather_into_tensor(all, buf)->wait();
  auto split_lines = [](const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find('\n', pos);
      out.push_back(s.substr(pos, e - pos));
      pos = e + 1;
    }
    return out;
  };
  auto my_lines = split_lines(mine);
  for (int r = 0; r < world; ++r) {
    std::string theirs(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * max_len,
                       lens[r].item<int64_t>());
    if (theirs == mine) continue;
    auto their_lines = split_lines(theirs);
    size_t n = std::max(my_lines.size(), their_lines.size());
    for (size_t i = 0; i < n; ++i) {
      std::string a = i < my_lines.size() ? my_lines[i] : "(none)";
      std::string b = i < their_lines.size() ? their_lines[i] : "(none)";
      FSDP_CHECK(a == b, where(), ": fully_shard found different parameters across ranks: this rank has '",
                 a, "' but rank ", r, " has '", b, "' (entry ", i,
                 "); build the same model with the same shapes on every rank");
    }
  }
}

void FSDPUnit::unshard_async() {
  if (sharded_state_ != ShardedState::kSharded || params_.empty()) return;
  if (params_aliased() || params_fresh()) {
    // no_shard: the module params are the full rows; zero1: the full params already hold the
    // current rows (nothing changed them since the last gather). No communication.
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (options_.strategy == ShardingStrategy::kNoShard) {
    // no_shard with a param_dtype: the "unshard" is a local cast copy, no collective.
    all_gather_output_ = sharded_flat_.to(param_dtype_);
    sharded_state_ = ShardedState::kUnsharding;
    return;
  }
  const int64_t world = shard_group_->size();
  all_gather_input_ =
      param_dtype_ == orig_dtype_ ? sharded_flat_ : sharded_flat_.to(param_dtype_);
  all_gather_output_ = at::empty({world * gather_layout_.shard_numel()}, at::dtype(param_dtype_));
  all_gather_work_ = shard_group_->all_gather_into_tensor(all_gather_output_, all_gather_input_);
  sharded_state_ = ShardedState::kUnsharding;
}

void FSDPUnit::unshard() {
  if (params_.empty()) {
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (sharded_state_ == ShardedState::kUnsharded) return;
  if (sharded_state_ == ShardedState::kSharded) unshard_async();
  if (sharded_state_ == ShardedState::kUnsharded) return;  // aliased or fresh
  if (all_gather_work_) all_gather_work_->wait();
  all_gather_work_.reset();
  copy_out_all_gather();
  all_gather_output_ = at::Tensor();
  all_gather_input_ = at::Tensor();
  sharded_state_ = ShardedState::kUnsharded;
  if (options_.strategy == ShardingStrategy::kZero1) {
    gathered_versions_.clear();
    for (const auto& p : params_) gathered_versions_.push_back(p.sharded_param._version());
    grads_reduced_since_gather_ = false;
    return;  // zero1's full params are persistent state, not counted as transient bytes
  }
  if (root_) {
    for (const auto& p : params_) root_->unsharded_param_bytes += p.unsharded_bytes();
    root_->peak_unsharded_param_bytes =
        std::max(root_->peak_unsharded_param_bytes, root_->unsharded_param_bytes);
  }
}

void FSDPUnit::copy_out_all_gather() {
  at::NoGradGuard no_grad;
  const int64_t world = shard_group_->size();
  const int64_t S = gather_layout_.shard_numel();
  at::Tensor blocks = all_gather_output_.view({world, S});
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const auto& s = p.spec;
    alloc_storage(p.unsharded_padded, p.unsharded_bytes());
    if (s.padded_shard_numel() == 0) continue;
    p.unsharded_padded.view({world, s.rows_per_rank, s.row_numel})
        .copy_(blocks.narrow(1, gather_layout_.offsets[i], s.padded_shard_numel())
                   .view({world, s.rows_per_rank, s.row_numel}));
  }
}

void FSDPUnit::reshard() {
  if (sharded_state_ == ShardedState::kSharded) return;
  if (sharded_state_ == ShardedState::kUnsharding) {
    if (all_gather_work_) all_gather_work_->wait();  // never free a buffer a collective still writes
    all_gather_work_.reset();
    all_gather_output_ = at::Tensor();
    all_gather_input_ = at::Tensor();
    sharded_state_ = ShardedState::kSharded;
    return;
  }
  // no_shard without cast: the module params are the storage; zero1: the full params persist and
  // are re-gathered lazily (only if the rows changed). Both just mark the state.
  if (!params_aliased() && options_.strategy != ShardingStrategy::kZero1) {
    for (auto& p : params_) {
      free_storage(p.unsharded_padded);
      if (root_) root_->unsharded_param_bytes -= p.unsharded_bytes();
    }
  }
  sharded_state_ = ShardedState::kSharded;
}

std::vector<at::Tensor> FSDPUnit::pre_forward(std::vector<at::Tensor> inputs) {
  FSDP_CHECK(training_state_ == TrainingState::kIdle, where(),
             ": forward entered in state ", to_string(training_state_), ", expected IDLE");
  if (!root_) {
    // [Note: root and final callback] The first unit called with no forward in progress is the
    // root of its tree: lazy init binds every unit below it to one RootContext.
    lazy_init_root();
  }
  if (is_root()) {
    FSDP_CHECK(!root_->in_forward, where(), ": root forward re-entered");
    root_->in_forward = true;
    root_->forward_order.clear();
  } else {
    FSDP_CHECK(root_->in_forward, where(), ": called outside the forward of its root unit '",
               root_->root->name(), "'; call the root module through fsdp::call");
  }
  training_state_ = TrainingState::kForward;
  forward_index_ = static_cast<int64_t>(root_->forward_order.size());
  root_->forward_order.push_back(this);
  unshard();
  if (options_.forward_prefetch) {
    const auto& last = root_->last_forward_order;
    size_t next = static_cast<size_t>(forward_index_) + 1;
    if (next < last.size()) root_->prefetch(last[next]);
  }
  const auto& mp = options_.mixed_precision;
  if (mp.param_dtype && mp.cast_forward_inputs) {
    for (auto& x : inputs) {
      if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != param_dtype_) {
        x = x.to(param_dtype_);
      }
    }
  }
  return register_post_backward(*this, std::move(inputs));
}

std::vector<at::Tensor> FSDPUnit::post_forward(std::vector<at::Tensor> outputs) {
  FSDP_CHECK(training_state_ == TrainingState::kForward, where(),
             ": post-forward in state ", to_string(training_state_), ", expected FORWARD");
  const bool grad = at::GradMode::is_enabled();
  if (!grad || (reshard_after_forward() && !is_root())) reshard();
  training_state_ = TrainingState::kIdle;
  if (grad) outputs = register_pre_backward(*this, forward_index_, std::move(outputs));
  const auto& mp = options_.mixed_precision;
  if (mp.output_dtype) {
    for (auto& y : outputs) {
      if (y.defined() && at::isFloatingType(y.scalar_type())) y = y.to(*mp.output_dtype);
    }
  }
  if (is_root()) {
    root_->in_forward = false;
    root_->last_forward_order = root_->forward_order;
    if (!grad) {
      // Inference: nothing stays gathered (prefetched units that were not used included).
      for (FSDPUnit* u : root_->units) u->reshard();
    }
  }
  return outputs;
}

void FSDPUnit::pre_backward(int64_t forward_index) {
  FSDP_CHECK(root_ != nullptr, where(), ": backward hook before any forward");
  root_->ensure_final_callback();
  FSDP_CHECK(training_state_ == TrainingState::kIdle || training_state_ == TrainingState::kPreBackward,
             where(), ": pre-backward in state ", to_string(training_state_),
             ", expected IDLE (was the unit's forward run twice without backward in between?)");
  training_state_ = TrainingState::kPreBackward;
  backward_active_ = true;
  unshard();
  if (options_.backward_prefetch && forward_index > 0 &&
      forward_index <= static_cast<int64_t>(root_->forward_order.size())) {
    root_->prefetch(root_->forward_order[forward_index - 1]);
  }
}

void FSDPUnit::post_backward() {
  FSDP_CHECK(training_state_ == TrainingState::kPreBackward, where(),
             ": post-backward in state ", to_string(training_state_), ", expected PRE_BACKWARD");
  training_state_ = TrainingState::kPostBackward;
  // no_shard reduces in buckets from the AccumulateGrad hooks; what is left goes at the end of
  // backward (a parameter used again earlier in the graph may still get gradient).
  if (!reduce_param_index_.empty() && requires_gradient_sync_ &&
      options_.strategy != ShardingStrategy::kNoShard) {
    // Bound the reduce-scatters in flight: finish the previous unit's once this one is queued.
    FSDPUnit* previous = root_->last_reduce_scatter;
    issue_reduce_scatter();
    root_->last_reduce_scatter = this;
    if (previous && previous != this) previous->finish_reduce_scatter();
  }
  reshard();
  training_state_ = TrainingState::kIdle;
}

void FSDPUnit::issue_reduce_scatter() {
  finish_reduce_scatter();  // a unit used twice: its first reduce-scatter lands first
  at::NoGradGuard no_grad;
  const int64_t world = shard_group_->size();
  const int64_t S = reduce_layout_.shard_numel();
  reduce_scatter_input_ = at::zeros({world * S}, at::dtype(reduce_dtype_));
  at::Tensor blocks = reduce_scatter_input_.view({world, S});
  for (size_t j = 0; j < reduce_param_index_.size(); ++j) {
    auto& p = params_[reduce_param_index_[j]];
    const auto& s = reduce_layout_.params[j];
    at::Tensor g = p.module_param.grad();
    if (!g.defined() || s.padded_shard_numel() == 0) {
      p.module_param.mutable_grad() = at::Tensor();
      continue;  // no gradient on this rank this step: contributes zeros
    }
    FSDP_CHECK(g.sizes() == p.module_param.sizes(), where(), ": gradient of '", p.fqn,
               "' has shape ", g.sizes(), ", expected ", p.module_param.sizes());
    at::Tensor rows = g.reshape({s.dim0, s.row_numel});
    at::Tensor dst = blocks.narrow(1, reduce_layout_.offsets[j], s.padded_shard_numel())
                         .view({world, s.rows_per_rank, s.row_numel});
    int64_t full = s.rows_per_rank ? s.dim0 / s.rows_per_rank : 0;  // ranks with all rows real
    int64_t rem = s.dim0 - full * s.rows_per_rank;
    if (full > 0) {
      dst.narrow(0, 0, full).copy_(rows.narrow(0, 0, full * s.rows_per_rank)
                                       .view({full, s.rows_per_rank, s.row_numel}));
    }
    if (rem > 0) dst[full].narrow(0, 0, rem).copy_(rows.narrow(0, full * s.rows_per_rank, rem));
    p.module_param.mutable_grad() = at::Tensor();  // free the unsharded gradient
  }
  reduce_scatter_output_ = at::empty({S}, at::dtype(reduce_dtype_));
  reduce_scatter_work_ = shard_group_->reduce_scatter_tensor(
      reduce_scatter_output_, reduce_scatter_input_, comm::ReduceOp::kAvg);
}

void FSDPUnit::finish_reduce_scatter() {
  if (options_.strategy == ShardingStrategy::kNoShard) {
    at::NoGradGuard no_grad;
    if (backward_active_ && requires_gradient_sync_) {
      while (next_bucket_ < buckets_.size()) issue_bucket(next_bucket_++);
    }
    for (auto& b : buckets_) {
      if (!b.issued) continue;
      b.work->wait();
      int64_t off = 0;
      for (int i : b.params) {
        auto& p = params_[i];
        const int64_t n = p.spec.numel();
        at::Tensor piece = b.buffer.narrow(0, off, n).view(p.sharded_param.sizes());
        off += n;
        at::Tensor& grad = p.sharded_param.mutable_grad();
        if (!grad.defined()) {
          grad = piece.to(orig_dtype_, /*non_blocking=*/false, /*copy=*/true);
        } else {
          grad.add_(piece.to(orig_dtype_));
        }
      }
      b.ready = 0;
      b.issued = false;
      b.buffer = at::Tensor();
      b.work.reset();
    }
    std::fill(param_ready_.begin(), param_ready_.end(), 0);
    next_bucket_ = 0;
    backward_active_ = false;
    return;
  }
  backward_active_ = false;
  if (!reduce_scatter_work_) return;
  reduce_scatter_work_->wait();
  reduce_scatter_work_.reset();
  if (replicate_group_) {
    // hybrid_shard: average the shard group's result across the replicas (blocking).
    replicate_group_->all_reduce(reduce_scatter_output_, comm::ReduceOp::kAvg)->wait();
  }
  at::NoGradGuard no_grad;
  const int64_t rank = shard_group_->rank();
  for (size_t j = 0; j < reduce_param_index_.size(); ++j) {
    auto& p = params_[reduce_param_index_[j]];
    const auto& s = reduce_layout_.params[j];
    at::Tensor piece = reduce_scatter_output_.narrow(0, reduce_layout_.offsets[j], s.real_numel(rank))
                           .view(p.sharded_param.sizes());
    at::Tensor& grad = p.sharded_param.mutable_grad();
    if (!grad.defined()) {
      grad = piece.to(orig_dtype_, /*non_blocking=*/false, /*copy=*/true);
    } else {
      grad.add_(piece.to(orig_dtype_));
    }
  }
  reduce_scatter_input_ = at::Tensor();
  reduce_scatter_output_ = at::Tensor();
  grads_reduced_since_gather_ = true;
  if (root_ && root_->last_reduce_scatter == this) root_->last_reduce_scatter = nullptr;
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

void FSDPUnit::build_buckets() {
  // DDP's layout: trainable params in reverse registration order (roughly the order backward
  // produces their gradients), packed greedily into buckets of at most bucket_cap_bytes.
  param_bucket_.assign(params_.size(), -1);
  param_ready_.assign(params_.size(), 0);
  self_cell_ = std::make_shared<FSDPUnit*>(this);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(reduce_dtype_));
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    auto& p = params_[i];
    if (!p.requires_grad) continue;
    const int64_t n = p.spec.numel();
    if (buckets_.empty() ||
        (buckets_.back().numel > 0 && (buckets_.back().numel + n) * elem > options_.bucket_cap_bytes)) {
      buckets_.emplace_back();
    }
    buckets_.back().params.push_back(i);
    buckets_.back().numel += n;
    param_bucket_[i] = static_cast<int>(buckets_.size()) - 1;
    auto acc = torch::autograd::impl::grad_accumulator(p.module_param);
    FSDP_CHECK(acc, where(), ": parameter '", p.fqn, "' has no gradient accumulator");
    acc->add_post_hook(std::make_unique<GradAccumulatedHook>(self_cell_, i));
    using Acc = decltype(acc);
    grad_accumulators_.emplace_back(new Acc(std::move(acc)), [](void* q) { delete static_cast<Acc*>(q); });
  }
}

void FSDPUnit::on_grad_accumulated(int index) {
  if (!requires_gradient_sync_ || !root_) return;
  FSDP_CHECK(!param_ready_[index], where(), ": gradient of '", params_[index].fqn,
             "' was accumulated twice in one backward pass; no_shard reduces each parameter's "
             "gradient once per backward (its bucket may already be on the wire)");
  param_ready_[index] = 1;
  backward_active_ = true;
  buckets_[param_bucket_[index]].ready++;
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_].ready == static_cast<int>(buckets_[next_bucket_].params.size())) {
    issue_bucket(next_bucket_++);
  }
}

void FSDPUnit::issue_bucket(size_t index) {
  at::NoGradGuard no_grad;
  Bucket& b = buckets_[index];
  b.buffer = at::empty({b.numel}, at::dtype(reduce_dtype_));
  int64_t off = 0;
  for (int i : b.params) {
    auto& p = params_[i];
    const int64_t n = p.spec.numel();
    at::Tensor dst = b.buffer.narrow(0, off, n);
    off += n;
    const at::Tensor& g = p.module_param.grad();
    if (g.defined()) {
      FSDP_CHECK(g.numel() == n, where(), ": gradient of '", p.fqn, "' has shape ", g.sizes(),
                 ", expected ", p.module_param.sizes());
      dst.copy_(g.reshape({n}));
    } else {
      dst.zero_();  // unused on this rank in this backward
    }
    p.module_param.mutable_grad() = at::Tensor();  // free the unsharded gradient
  }
  b.work = replicate_group_->all_reduce(b.buffer, comm::ReduceOp::kAvg);
  b.issued = true;
}

int64_t FSDPUnit::unsharded_param_bytes() const {
  // The storage actually allocated: zero1 keeps its full params between steps; an all-gather in
  // flight has not allocated them yet; no_shard without a cast aliases the sharded storage.
  if (params_aliased()) return 0;
  int64_t n = 0;
  for (const auto& p : params_) {
    if (p.unsharded_padded.defined()) n += static_cast<int64_t>(p.unsharded_padded.storage().nbytes());
  }
  return n;
}

void FSDPUnit::lazy_init_root() {
  auto ctx = std::make_shared<RootContext>();
  ctx->root = this;
  for (const auto& u : units_of(module_.lock())) {
    FSDP_CHECK(u->group_ == group_, where(), ": unit '", u->name(),
               "' trains over another process group than its root; every unit of one tree must be "
               "created with the same group (strategies may differ per unit)");
    FSDP_CHECK(!u->root_ || u.get() == this, where(), ": unit '", u->name(),
               "' already belongs to the tree of root '",
               u->root_ ? u->root_->root->name() : std::string(), "'");
    ctx->units.push_back(u.get());
    u->root_ = ctx;
  }
  if (ctx->units.empty() || ctx->units.front() != this) {
    ctx->units.insert(ctx->units.begin(), this);
    root_ = ctx;
  }
}

int64_t FSDPUnit::unsharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    const at::Tensor& g = p.module_param.grad();
    if (g.defined()) n += static_cast<int64_t>(g.nbytes());
  }
  return n;
}

}  // namespace fsdp
