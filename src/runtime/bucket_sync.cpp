// The bucket gradient sync (no_shard, DDP): the unit's DdpReducer all-reduces buckets of
// gradients from the AccumulateGrad hooks and the rest at the end of backward.
// docs/architecture.md, "Strategies", no_shard.
#include "ddp_reducer.h"
#include "gradient_sync.h"

namespace fsdp::detail {
namespace {

class BucketSync final : public GradientSync {
 public:
  explicit BucketSync(GradientSyncArgs args) : args_(std::move(args)) { reducer_ = create(); }
  ~BucketSync() override { reducer_->abandon(); }

  bool reduces_at_post_backward() const override { return false; }
  void issue(const comm::OpTag&) override {}
  // Buckets in flight are finished at the end of backward; none is a unit-level reduction.
  bool has_reduction_in_flight() const override { return false; }

  bool finish(bool took_part, bool sync) override {
    reducer_->finish((took_part || reducer_->touched()) && sync);
    return false;
  }

  void reduce_pending(const comm::OpTag&) override {
    reducer_->finish(/*issue_rest=*/true);  // packs what accumulated; missing gradients are zeros
  }

  void rebuild(bool armed) override {
    reducer_ = create();
    reducer_->set_armed(armed);
  }

  void set_armed(bool armed) override { reducer_->set_armed(armed); }
  // [Note: reducer hooks] in ddp_reducer.cpp.
  void ensure_hooks() override { reducer_->ensure_hooks(); }
  void defer_to_end_of_backward() override { reducer_->defer_to_end_of_backward(); }
  void drop() noexcept override { reducer_->abandon(); }
  void wait_issued() override {}

 private:
  std::shared_ptr<DdpReducer> create() const {
    return DdpReducer::create(*args_.params, args_.replicate_group, args_.reduce_dtype, args_.bucket_cap_bytes,
                              args_.tag);
  }

  GradientSyncArgs args_;
  std::shared_ptr<DdpReducer> reducer_;
};

}  // namespace

std::unique_ptr<GradientSync> make_bucket_sync(GradientSyncArgs args) {
  return std::make_unique<BucketSync>(std::move(args));
}

}  // namespace fsdp::detail
