#include "ddp_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/check.h"

namespace fsdp::detail {

BucketPlan::BucketPlan(const std::vector<int64_t>& numels, int64_t cap_elems)
    : bucket_of_(numels.size(), -1), ready_(numels.size(), 0) {
  for (int i = static_cast<int>(numels.size()) - 1; i >= 0; --i) {
    const int64_t n = numels[i];
    if (n < 0) continue;
    if (buckets_.empty() || (buckets_.back().numel > 0 && buckets_.back().numel + n > cap_elems)) {
      buckets_.emplace_back();
    }
    buckets_.back().params.push_back(i);
    buckets_.back().numel += n;
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
  }
}

std::vector<size_t> BucketPlan::mark_ready(int i, bool* twice) {
  *twice = ready_[i] != 0;
  if (*twice) return {};
  ready_[i] = 1;
  buckets_[bucket_of_[i]].ready++;
  std::vector<size_t> now;
  while (next_ < buckets_.size() &&
         buckets_[next_].ready == static_cast<int>(buckets_[next_].params.size())) {
    now.push_back(next_++);
  }
  return now;
}

std::vector<size_t> BucketPlan::take_remaining() {
  std::vector<size_t> rest;
  while (next_ < buckets_.size()) rest.push_back(next_++);
  return rest;
}

void BucketPlan::reset() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) b.ready = 0;
  next_ = 0;
}

namespace {

std::vector<int64_t> trainable_numels(const std::vector<FSDPParam>& params) {
  std::vector<int64_t> n;
  for (const auto& p : params) n.push_back(p.requires_grad ? p.spec.numel() : -1);
  return n;
}

// Runs after a trainable parameter's AccumulateGrad node (its gradient of this backward is
// accumulated into .grad()).
struct GradAccumulatedHook : torch::autograd::FunctionPostHook {
  GradAccumulatedHook(std::weak_ptr<DdpReducer> reducer, int index) : reducer(std::move(reducer)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto r = reducer.lock()) r->on_grad_accumulated(index);
    return outputs;
  }
  std::weak_ptr<DdpReducer> reducer;
  int index;
};

}  // namespace

DdpReducer::DdpReducer(std::vector<FSDPParam>& params, comm::ProcessGroupPtr group,
                       c10::ScalarType reduce_dtype, int64_t cap_bytes, TagFn tag)
    : params_(params),
      group_(std::move(group)),
      reduce_dtype_(reduce_dtype),
      tag_(std::move(tag)),
      plan_(trainable_numels(params), cap_bytes / static_cast<int64_t>(c10::elementSize(reduce_dtype))),
      buffers_(plan_.num_buckets()),
      works_(plan_.num_buckets()),
      grad_accumulators_(params.size()),
      hooked_nodes_(params.size(), nullptr) {}

std::shared_ptr<DdpReducer> DdpReducer::create(std::vector<FSDPParam>& params, comm::ProcessGroupPtr group,
                                               c10::ScalarType reduce_dtype, int64_t cap_bytes, TagFn tag) {
  return std::shared_ptr<DdpReducer>(new DdpReducer(params, std::move(group), reduce_dtype, cap_bytes, std::move(tag)));
}

// [Note: reducer hooks] A parameter's AccumulateGrad node records the tensor's shape, dtype and
// device when it is created, and the engine checks every gradient it receives against them. The
// tensor holds the node weakly and Variable::set_data drops it when the dtype or device changes.
// So the hooks are installed at the unit's unshard, when the module param is its unsharded tensor
// (with a cast param_dtype, fully_shard leaves it an empty [0] tensor until then: a node made
// there rejects the (out, in) gradient), and installed again on the param's new node when the one
// hooked is no longer its node (materialize writes the rows through an fp32 full tensor, which
// drops a bf16 param's node: the old hooks would never fire and every bucket would wait for the end
// of backward).
void DdpReducer::ensure_hooks() {
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    auto& p = params_[i];
    if (!p.requires_grad) continue;
    auto current = torch::autograd::impl::try_get_grad_accumulator(p.module_param);
    if (current && current.get() == hooked_nodes_[i]) continue;
    auto acc = torch::autograd::impl::grad_accumulator(p.module_param);
    FSDP_CHECK(acc, ErrorKind::kInvalidArgument, where("forward"),
               "parameter '", p.fqn, "' has no gradient accumulator");
    acc->add_post_hook(std::make_unique<GradAccumulatedHook>(weak_from_this(), i));
    hooked_nodes_[i] = acc.get();
    using Acc = decltype(acc);
    grad_accumulators_[i] = std::shared_ptr<void>(new Acc(std::move(acc)), [](void* q) { delete static_cast<Acc*>(q); });
  }
}

void DdpReducer::on_grad_accumulated(int i) {
  if (!armed_) return;
  if (deferred_) {
    touched_ = true;  // finish() issues every bucket
    return;
  }
  bool twice = false;
  std::vector<size_t> ready = plan_.mark_ready(i, &twice);
  FSDP_CHECK(!twice, ErrorKind::kState, where("backward"),
             "gradient of '", params_[i].fqn,
             "' was accumulated twice in one backward pass; no_shard reduces each parameter's "
             "gradient once per backward (its bucket may already be on the wire)");
  touched_ = true;
  for (size_t b : ready) issue(b);
}

void DdpReducer::issue(size_t b) {
  at::NoGradGuard no_grad;
  at::Tensor buffer = at::empty({plan_.numel_of(b)}, at::dtype(reduce_dtype_).device(group_->device_type()));
  int64_t off = 0;
  for (int i : plan_.params_of(b)) {
    auto& p = params_[i];
    const int64_t n = p.spec.numel();
    at::Tensor dst = buffer.narrow(0, off, n);
    off += n;
    const at::Tensor g = p.release_unsharded_grad(where("backward"));  // freed once packed
    if (g.defined()) {
      dst.copy_(g.reshape({n}));
    } else {
      dst.zero_();  // unused on this rank in this backward
    }
  }
  buffers_[b] = buffer;
  works_[b] = group_->all_reduce(buffer, comm::ReduceOp::kAvg, tag_("backward"));
}

void DdpReducer::finish(bool issue_rest) {
  if (issue_rest) {
    for (size_t b : plan_.take_remaining()) issue(b);
  }
  for (size_t b = 0; b < works_.size(); ++b) {
    if (!works_[b]) continue;
    works_[b]->wait();
    int64_t off = 0;
    for (int i : plan_.params_of(b)) {
      auto& p = params_[i];
      const int64_t n = p.spec.numel();
      p.accumulate_sharded_grad(buffers_[b].narrow(0, off, n));
      off += n;
    }
    buffers_[b] = at::Tensor();
    works_[b].reset();
  }
  plan_.reset();
  touched_ = false;
  deferred_ = false;
}

void DdpReducer::abandon() noexcept {
  for (auto& w : works_) {
    try {
      if (w) w->wait();
    } catch (...) {
    }
    w.reset();
  }
  for (auto& b : buffers_) b = at::Tensor();
  plan_.reset();
  touched_ = false;
  deferred_ = false;
}

}  // namespace fsdp::detail
