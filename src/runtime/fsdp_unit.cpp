#include "fsdp/runtime/fsdp_unit.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cstring>
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

}  // namespace

FSDPUnit::FSDPUnit(std::shared_ptr<torch::nn::Module> module, std::string name,
                   comm::ProcessGroupPtr group, FullyShardOptions options,
                   std::vector<FSDPParam> params)
    : module_(module), module_raw_(module.get()), name_(std::move(name)), group_(std::move(group)),
      options_(options), params_(std::move(params)) {
  FSDP_CHECK(group_ != nullptr, "[fsdp] fully_shard(unit '", name_, "'): process group is null");
  FSDP_CHECK(options_.strategy == ShardingStrategy::kFullShard ||
                 options_.strategy == ShardingStrategy::kShardGradOp,
             where(), ": sharding strategy ", to_string(options_.strategy),
             " is not implemented in this build (available: full_shard, shard_grad_op)");
  FSDP_CHECK(options_.max_unsharded_units >= 1, where(),
             ": max_unsharded_units must be >= 1, got ", options_.max_unsharded_units);
  init_shards();
}

FSDPUnit::~FSDPUnit() {
  // Never leave a collective writing into freed buffers.
  try {
    if (all_gather_work_) all_gather_work_->wait();
    if (reduce_scatter_work_) reduce_scatter_work_->wait();
  } catch (...) {
  }
}

std::string FSDPUnit::where() const {
  return str_cat("[fsdp rank ", group_ ? group_->rank() : -1, "] unit '", name_, "'");
}

bool FSDPUnit::is_root() const { return root_ && root_->root == this; }

bool FSDPUnit::reshard_after_forward() const {
  if (options_.reshard_after_forward.has_value()) return *options_.reshard_after_forward;
  return options_.strategy == ShardingStrategy::kFullShard;
}

void FSDPUnit::init_shards() {
  const int64_t world = group_->size();
  const int64_t rank = group_->rank();
  check_consistency_across_ranks();
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
    p.unsharded_padded = at::empty(shard_shape(p, s.rows_per_rank * world), at::dtype(param_dtype_));
    at::Tensor view = p.unsharded_padded.narrow(0, 0, s.dim0);
    p.module_param.set_data(p.shape.empty() ? view.view({}) : view);
    free_storage(p.unsharded_padded);
  }
  sharded_flat_ = flat;
  sharded_state_ = ShardedState::kSharded;
}

void FSDPUnit::check_consistency_across_ranks() {
  // Every rank all-gathers a text description of its params; any difference is reported with the
  // parameter name and both ranks' shapes, on every rank, before any training collective could hang.
  std::string mine = str_cat("world_size ", group_->size(), "\n");
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
  const int64_t world = group_->size();
  all_gather_input_ =
      param_dtype_ == orig_dtype_ ? sharded_flat_ : sharded_flat_.to(param_dtype_);
  all_gather_output_ = at::empty({world * gather_layout_.shard_numel()}, at::dtype(param_dtype_));
  all_gather_work_ = group_->all_gather_into_tensor(all_gather_output_, all_gather_input_);
  sharded_state_ = ShardedState::kUnsharding;
}

void FSDPUnit::unshard() {
  if (params_.empty()) {
    sharded_state_ = ShardedState::kUnsharded;
    return;
  }
  if (sharded_state_ == ShardedState::kUnsharded) return;
  if (sharded_state_ == ShardedState::kSharded) unshard_async();
  all_gather_work_->wait();
  all_gather_work_.reset();
  copy_out_all_gather();
  all_gather_output_ = at::Tensor();
  all_gather_input_ = at::Tensor();
  sharded_state_ = ShardedState::kUnsharded;
  if (root_) {
    for (const auto& p : params_) root_->unsharded_param_bytes += p.unsharded_bytes();
    root_->peak_unsharded_param_bytes =
        std::max(root_->peak_unsharded_param_bytes, root_->unsharded_param_bytes);
  }
}

void FSDPUnit::copy_out_all_gather() {
  at::NoGradGuard no_grad;
  const int64_t world = group_->size();
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
    all_gather_work_->wait();  // never free a buffer a collective still writes
    all_gather_work_.reset();
    all_gather_output_ = at::Tensor();
    all_gather_input_ = at::Tensor();
    sharded_state_ = ShardedState::kSharded;
    return;
  }
  for (auto& p : params_) {
    free_storage(p.unsharded_padded);
    if (root_) root_->unsharded_param_bytes -= p.unsharded_bytes();
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
  if (!reduce_param_index_.empty() && requires_gradient_sync_) {
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
  const int64_t world = group_->size();
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
  reduce_scatter_work_ = group_->reduce_scatter_tensor(reduce_scatter_output_, reduce_scatter_input_,
                                                       comm::ReduceOp::kAvg);
}

void FSDPUnit::finish_reduce_scatter() {
  if (!reduce_scatter_work_) return;
  reduce_scatter_work_->wait();
  reduce_scatter_work_.reset();
  at::NoGradGuard no_grad;
  const int64_t rank = group_->rank();
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

int64_t FSDPUnit::unsharded_param_bytes() const {
  if (sharded_state_ != ShardedState::kUnsharded) return 0;
  int64_t n = 0;
  for (const auto& p : params_) n += p.unsharded_bytes();
  return n;
}

void FSDPUnit::lazy_init_root() {
  auto ctx = std::make_shared<RootContext>();
  ctx->root = this;
  for (const auto& u : units_of(module_.lock())) {
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
