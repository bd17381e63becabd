// The reduce-scatter gradient sync (full_shard, shard_grad_op, zero1, hybrid_shard): one
// reduce-scatter (average, reduce_dtype) of the unit's trainable gradients over the shard group at
// post-backward, plus hybrid_shard's all-reduce over the replicas; its result is added into the
// sharded grads when the unit's tree finishes it (the next unit's reduce-scatter, or the end of
// backward).
#include <ATen/ATen.h>

#include "gradient_sync.h"
#include "all_gather_codec.h"
#include "unit_collectives.h"

namespace fsdp::detail {
namespace {

class ReduceScatterSync final : public GradientSync {
 public:
  explicit ReduceScatterSync(GradientSyncArgs args) : args_(std::move(args)) {
    if (!args_.params->empty()) rebuild(false);
  }

  bool reduces_at_post_backward() const override { return true; }

  void issue(const comm::OpTag& tag) override {
    reduce_ = std::make_unique<ReduceScatterResult>(foreach_reduce_scatter(
        *args_.params, reduce_index_, reduce_layout_, *args_.shard_group, args_.replicate_group.get(),
        comm::CommContext::for_group(*args_.shard_group), args_.reduce_dtype, tag, wire_));
  }

  bool has_reduction_in_flight() const override { return reduce_ != nullptr; }

  bool finish(bool, bool) override {
    if (!reduce_) return false;
    accumulate_reduced(*reduce_, *args_.params, reduce_index_, reduce_layout_, args_.shard_group->rank());
    reduce_.reset();
    return true;
  }

  void reduce_pending(const comm::OpTag& tag) override { issue(tag); }

  // The reduce-scatter layout: params with requires_grad, in order.
  void rebuild(bool) override {
    std::vector<std::vector<int64_t>> shapes;
    reduce_index_.clear();
    const auto& params = *args_.params;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].requires_grad) continue;
      shapes.push_back(params[i].shape);
      reduce_index_.push_back(static_cast<int>(i));
    }
    reduce_layout_ = shard::FlatLayout::make(shapes, args_.shard_group->size());
    wire_.codec = args_.reduce_scatter_codec;
    wire_.segments = shard_segments(reduce_layout_);
    wire_.hosts = args_.hosts;
  }

  void set_armed(bool) override {}
  void ensure_hooks() override {}
  void defer_to_end_of_backward() override {}

  void drop() noexcept override {
    if (!reduce_) return;
    for (const auto& w : {reduce_->first, reduce_->work, reduce_->replica_work}) {
      try {
        if (w) w->wait();  // never free a buffer a collective reads or writes
      } catch (...) {
      }
    }
    reduce_.reset();
  }

  void wait_issued() override {
    if (reduce_ && reduce_->work) reduce_->work->wait();
  }

 private:
  GradientSyncArgs args_;
  shard::FlatLayout reduce_layout_;  // params with requires_grad, in order
  std::vector<int> reduce_index_;    // reduce_layout_ entry j -> params index
  ReduceScatterWire wire_;           // codec, its segments over reduce_layout_, host groups
  std::unique_ptr<ReduceScatterResult> reduce_;
};

}  // namespace

std::unique_ptr<GradientSync> make_reduce_scatter_sync(GradientSyncArgs args) {
  return std::make_unique<ReduceScatterSync>(std::move(args));
}

}  // namespace fsdp::detail
